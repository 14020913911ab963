//! What a reboot finds on the simulated disk: the durable images of the files whose entries
//! survive, and a torn prefix of the write that was in flight.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use super::{DiskState, SimDisk, SimFile, Tear, apply_write};

/// A torn write keeps whole sectors of this size.
const SECTOR: u64 = 512;

impl SimDisk {
    /// The disk a reboot would find: durable images of durable files, plus `tear` of the write
    /// that was in flight. The new disk has no faults planned.
    pub fn crash_image(&self, tear: Tear) -> SimDisk {
        let state = self.lock();
        let survives = |name: &str| {
            // Every directory above the file must survive too.
            state.root != Some(false)
                && name
                    .rsplit_once('/')
                    .is_none_or(|(dir, _)| state.dirs.get(dir).copied().unwrap_or(true))
        };
        let mut files: BTreeMap<String, SimFile> = state
            .files
            .iter()
            .filter(|(name, _)| survives(name))
            .filter_map(|(name, f)| {
                let kept = if f.entry_durable {
                    f
                } else {
                    f.replaced.as_deref()?
                };
                Some((
                    name.clone(),
                    SimFile {
                        live: kept.durable.clone(),
                        durable: kept.durable.clone(),
                        pending: Vec::new(),
                        entry_durable: true,
                        allocated: kept.durable.len() as u64,
                        replaced: None,
                    },
                ))
            })
            .collect();
        let torn_file_survives =
            |name: &str| state.files.get(name).is_some_and(|f| f.entry_durable);
        if let (Tear::Sectors(n), Some((name, offset, data))) = (tear, &state.in_flight)
            && torn_file_survives(name)
            && let Some(file) = files.get_mut(name)
        {
            // Keep whole sectors from the start of the write.
            let first_boundary = (offset / SECTOR + 1) * SECTOR;
            let keep_end =
                (first_boundary + (n.saturating_sub(1)) * SECTOR).min(offset + data.len() as u64);
            let keep = if n == 0 { 0 } else { keep_end - offset };
            let keep = usize::try_from(keep).unwrap_or(usize::MAX).min(data.len());
            apply_write(&mut file.live, *offset, &data[..keep]);
            file.durable = file.live.clone();
        }
        let dirs = state
            .dirs
            .iter()
            .filter(|(_, durable)| **durable && state.root != Some(false))
            .map(|(name, _)| (name.clone(), true))
            .collect();
        let root = match state.root {
            Some(true) => Some(true),
            // A store directory whose entry was never synced is gone, with all it held.
            Some(false) => None,
            None => None,
        };
        SimDisk {
            state: Arc::new(Mutex::new(DiskState {
                files,
                dirs,
                root,
                ..DiskState::default()
            })),
        }
    }
}
