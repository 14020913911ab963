//! What shipping the log to a replica, and restoring from one, can fail with.

use crate::model::replica::WriterIdentity;

/// A replica's failure (see [`Replica`](crate::Replica)).
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ReplicaError {
    /// The replica did not answer within its time limit, or the connection failed. Nothing
    /// is known to be lost: shipping tries again.
    #[error("the replica is unreachable ({detail}); the store ships again once it answers")]
    Unreachable {
        /// What failed.
        detail: String,
    },
    /// Another store writes the stream. Two writers would interleave their logs: stop the
    /// other store first, or, if its box is lost, restore from the stream (a restore takes
    /// the stream over).
    #[error(
        "{holder} writes this stream; stop it first, or, if its box is lost, restore from the stream (a restore takes the stream over)"
    )]
    OtherWriter {
        /// The store that writes the stream.
        holder: WriterIdentity,
    },
    /// The stream went past the frames a restore read before it could take the stream over:
    /// the old writer still ships.
    #[error(
        "the stream went on to frame {now} after the restore read up to frame {read}: its old writer still ships; stop it, then restore again"
    )]
    Moved {
        /// The last frame the restore read.
        read: u64,
        /// The stream's last frame now.
        now: u64,
    },
    /// The stream holds something that is not a well-formed frame or snapshot of this store,
    /// or frames with a gap.
    #[error("the stream is damaged: {detail}")]
    Corrupt {
        /// What is wrong, and where.
        detail: String,
    },
    /// The replica refused the request for another reason.
    #[error("the replica refused: {detail}")]
    Refused {
        /// The replica's own message.
        detail: String,
    },
}
