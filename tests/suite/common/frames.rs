//! Writers and frames for the tests that drive a replica directly (the replica contract suite,
//! the JetStream-only cases).

use std::sync::Arc;

use idemstore::{ShippedFrame, WriterIdentity};

/// A store at `dir` on a test host.
pub fn store(dir: &str, pid: u32) -> WriterIdentity {
    WriterIdentity {
        host: "test-host".to_owned(),
        pid,
        dir: dir.into(),
    }
}

/// Frame `seq` with a payload that names it.
pub fn frame(seq: u64) -> ShippedFrame {
    ShippedFrame {
        seq,
        payload: Arc::new(format!("frame {seq}").into_bytes()),
    }
}

/// Frames `seqs`, each as [`frame`] makes it.
pub fn frames(seqs: std::ops::RangeInclusive<u64>) -> Vec<ShippedFrame> {
    seqs.map(frame).collect()
}
