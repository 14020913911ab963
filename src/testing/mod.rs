//! Tools for testing a store against crashes and I/O faults (feature `testing`).
//!
//! [`SimDisk`] runs a store on simulated storage that can crash at any operation; the bodies of
//! the fuzz targets live here too, so a seeded test runs them on stable.

mod sim_disk;

pub use sim_disk::{DiskCounters, FaultPlan, SimDisk, Tear};
