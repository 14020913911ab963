//! The in-memory replica's stream: its messages (frames and take-over markers) numbered from
//! 1, as JetStream numbers a stream's, and the purge behind a snapshot.

use crate::model::restore::Lineage;
use crate::wal::ship::ShippedFrame;

/// One message of the stream: a frame, or a take-over's marker.
#[derive(Debug, Clone)]
pub(super) enum Message {
    Frame(ShippedFrame, Lineage),
    Marker { epoch: u64 },
}

/// The stream's messages after the last purge; `first` is the number of the first kept.
#[derive(Debug, Default)]
pub(super) struct Log {
    pub(super) messages: Vec<Message>,
    pub(super) first: u64,
}

impl Log {
    /// The number of the last message ever appended (0 if none).
    pub(super) fn last_seq(&self) -> u64 {
        self.first + self.messages.len() as u64 - 1
    }

    pub(super) fn frames(&self) -> impl Iterator<Item = (&ShippedFrame, &Lineage)> {
        self.messages.iter().filter_map(|m| match m {
            Message::Frame(f, l) => Some((f, l)),
            Message::Marker { .. } => None,
        })
    }

    pub(super) fn last_frame(&self) -> Option<u64> {
        self.frames().last().map(|(f, _)| f.seq)
    }

    /// The highest epoch any kept message carries.
    pub(super) fn last_epoch(&self) -> u64 {
        self.messages
            .iter()
            .map(|m| match m {
                Message::Frame(_, l) => l.epoch,
                Message::Marker { epoch } => *epoch,
            })
            .max()
            .unwrap_or(0)
    }

    pub(super) fn append(&mut self, message: Message) {
        self.messages.push(message);
    }

    /// Drops the frames at or before `seq` (and markers before them), as a purge does.
    pub(super) fn purge_through(&mut self, seq: u64) {
        let keep = self
            .messages
            .iter()
            .position(|m| matches!(m, Message::Frame(f, _) if f.seq > seq))
            .unwrap_or(self.messages.len());
        self.messages.drain(..keep);
        self.first += keep as u64;
    }
}
