//! What killed backups and restores leave beside their destination: `.NAME.backup-PID-N`
//! (a directory being built), `.NAME.rebase-PID` and `.NAME.old-PID` (a standby's rebuild),
//! removed by the next restore to the same destination once the process that made them is
//! gone.
//!
//! A process is known to be gone when `/proc/PID` does not exist (Linux). Where there is no
//! `/proc`, or the number now belongs to another process, nothing is removed: a leftover costs
//! disk, a directory removed under a live restore would cost that restore.

use std::path::Path;

/// The kinds of leftovers, by the infix after `.NAME.`.
const KINDS: [&str; 3] = ["backup-", "rebase-", "old-"];

/// Removes the leftovers of dead processes beside `dest`; says how many it removed.
pub(crate) fn remove_dead_leftovers(dest: &Path) -> usize {
    let Some(name) = dest.file_name().map(|n| n.to_string_lossy().into_owned()) else {
        return 0;
    };
    if !Path::new("/proc/self").exists() {
        return 0;
    }
    let parent = super::parent_of(dest);
    let Ok(entries) = std::fs::read_dir(parent) else {
        return 0;
    };
    let prefix = format!(".{name}.");
    let mut removed = 0;
    for entry in entries.flatten() {
        let file_name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = leftover_pid(&file_name, &prefix) else {
            continue;
        };
        if pid == std::process::id() || Path::new("/proc").join(pid.to_string()).exists() {
            continue;
        }
        match std::fs::remove_dir_all(entry.path()) {
            Ok(()) => {
                removed += 1;
                tracing::info!(path = %entry.path().display(), pid, "removed what a killed restore or backup left");
            }
            Err(e) => {
                tracing::warn!(path = %entry.path().display(), error = %e, "could not remove what a killed restore or backup left");
            }
        }
    }
    removed
}

/// The process number in a leftover's name (`.NAME.KIND-PID[-N]`), if it is one.
fn leftover_pid(file_name: &str, prefix: &str) -> Option<u32> {
    let rest = file_name.strip_prefix(prefix)?;
    let digits = KINDS.iter().find_map(|kind| rest.strip_prefix(kind))?;
    let pid = digits.split('-').next()?;
    pid.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_of_leftovers_give_their_process() {
        let prefix = ".idem.";
        assert_eq!(leftover_pid(".idem.backup-4242-3", prefix), Some(4242));
        assert_eq!(leftover_pid(".idem.rebase-17", prefix), Some(17));
        assert_eq!(leftover_pid(".idem.old-9", prefix), Some(9));
        assert_eq!(leftover_pid(".idem.backup-x-3", prefix), None);
        assert_eq!(leftover_pid(".other.backup-1-1", prefix), None);
        assert_eq!(leftover_pid("idem", prefix), None);
    }

    #[test]
    fn a_dead_process_leftovers_go_and_a_live_one_stays() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let dest = dir.path().join("idem");
        // No process has this number (above the kernel's largest).
        let dead = dir.path().join(".idem.backup-4194305-0");
        let live = dir
            .path()
            .join(format!(".idem.backup-{}-0", std::process::id()));
        let other = dir.path().join(".keep.backup-4194305-0");
        for d in [&dead, &live, &other] {
            std::fs::create_dir(d).expect("a leftover directory");
            std::fs::write(d.join("idemstore.redb"), b"x").expect("a leftover file");
        }
        assert_eq!(remove_dead_leftovers(&dest), 1);
        assert!(!dead.exists());
        assert!(live.exists() && other.exists());
    }
}
