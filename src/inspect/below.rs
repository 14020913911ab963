//! Stores in the sub-directories of a directory that is not one: the path an operator meant
//! when they gave its parent (`idemstore stats idemstore-data` for a store kept in
//! `idemstore-data/edge_service`).
//!
//! The search is bounded, so that pointing the tool at `/` or a huge tree answers at once: a
//! few levels deep, a fixed number of directory entries read in all, symbolic links not
//! followed, unreadable directories skipped, and no search inside a store's own directory.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};

use crate::storage::db_file;

/// How many levels below the directory given are searched (1: its own sub-directories).
const MAX_DEPTH: usize = 3;
/// Directory entries read in all before the search gives up on what it has not reached.
const MAX_ENTRIES: usize = 10_000;
/// Stores named in an error at most; one more is looked for, to say there are others.
pub(super) const MAX_LISTED: usize = 3;

/// The store directories (those holding `idemstore.redb`) below `dir`, not `dir` itself:
/// nearest first, by name within a level, at most [`MAX_LISTED`] + 1 of them. Each path is
/// `dir` joined with the sub-directory, so it is relative if `dir` is.
pub(crate) fn stores_below(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut budget = MAX_ENTRIES;
    let mut queue = VecDeque::from([(dir.to_path_buf(), 0)]);
    while let Some((at, depth)) = queue.pop_front() {
        let Ok(entries) = std::fs::read_dir(&at) else {
            continue; // unreadable: skipped
        };
        let mut children = Vec::new();
        for entry in entries {
            if budget == 0 {
                break;
            }
            budget -= 1;
            let Ok(entry) = entry else { continue };
            // The entry's own type: a symbolic link is not followed.
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                children.push(entry.path());
            }
        }
        children.sort();
        for child in children {
            if db_file(&child).is_file() {
                found.push(child);
                if found.len() > MAX_LISTED {
                    return found;
                }
            } else if depth + 1 < MAX_DEPTH {
                queue.push_back((child, depth + 1));
            }
        }
        if budget == 0 {
            break;
        }
    }
    found
}

/// What an error adds about the stores below a directory that is not one: nothing if there
/// are none, else the path to give instead, or the ones to choose from.
pub(super) fn hint(below: &[PathBuf]) -> String {
    match below {
        [] => String::new(),
        [one] => format!(
            "; the store below it is {}: give that directory instead",
            one.display()
        ),
        several => {
            let listed: Vec<String> = several
                .iter()
                .take(MAX_LISTED)
                .map(|p| p.display().to_string())
                .collect();
            let more = if several.len() > MAX_LISTED {
                ", and more"
            } else {
                ""
            };
            format!(
                "; there are stores below it: {}{more}; give the directory of the one you mean",
                listed.join(", ")
            )
        }
    }
}
