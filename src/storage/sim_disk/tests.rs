//! The simulated disk against what a real one does at a crash.

use super::*;
use crate::storage::LogDir;

#[test]
fn a_crash_keeps_synced_bytes_and_tears_the_write_in_flight_at_sectors() -> io::Result<()> {
    let disk = SimDisk::new();
    let dir = disk.log_dir("wal");
    let mut file = dir.create("a")?;
    file.write_at(0, &[1; 600])?;
    file.sync_data()?;
    dir.sync()?;
    file.write_at(600, &[2; 1000])?; // covers sectors [512,1024) [1024,1536) [1536,2048)

    let lost = disk.crash_image(Tear::Drop);
    assert_eq!(lost.file("wal/a"), Some(vec![1; 600]));

    let torn = disk.crash_image(Tear::Sectors(2));
    let bytes = torn.file("wal/a").ok_or(io::ErrorKind::NotFound)?;
    assert_eq!(
        bytes.len(),
        1536,
        "up to the end of the second sector touched"
    );
    assert!(bytes[600..].iter().all(|&b| b == 2));
    Ok(())
}

#[test]
fn an_unsynced_directory_entry_does_not_survive() -> io::Result<()> {
    let disk = SimDisk::new();
    let dir = disk.log_dir("wal");
    let mut file = dir.create("a")?;
    file.write_at(0, b"data")?;
    file.sync_data()?;
    assert_eq!(disk.crash_image(Tear::Drop).files(), Vec::<String>::new());
    dir.sync()?;
    assert_eq!(
        disk.crash_image(Tear::Drop).files(),
        vec!["wal/a".to_owned()]
    );
    Ok(())
}

#[test]
fn planned_faults_fire_at_their_operation() {
    let disk = SimDisk::new();
    disk.plan(FaultPlan {
        crash_at: Some(3),
        fail_at: Some(1),
        fail_sync: None,
        log_sync_latency: None,
        full_at: None,
        then: None,
    });
    assert!(disk.write("x", 0, b"1").is_err(), "op 1 fails once");
    assert!(disk.write("x", 0, b"2").is_ok());
    assert!(disk.sync("x").is_err(), "op 3 crashes");
    assert!(disk.crashed());
    assert!(disk.write("x", 0, b"3").is_err(), "everything after fails");
}
