//! What shipping the log to a replica, and restoring from one, can fail with.

use crate::model::replica::WriterIdentity;

/// A replica's failure (see [`Replica`](crate::Replica)).
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ReplicaError {
    /// The replica did not answer within its time limit, or the connection failed. Nothing
    /// is known to be lost: a shipping store tries again, a restore must be run again.
    #[error("the replica is unreachable ({detail})")]
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
    /// A take-over gave the stream to another store at a later epoch than this store's (this
    /// store's log is an older copy of the stream's history), or the stream is another
    /// store's, closed cleanly: this store must never write it (whatever the writer entry says
    /// after the new writer's clean close). Only a restore that takes the stream over writes it
    /// from another store.
    #[error(
        "the stream belongs to {} at writer epoch {epoch}: a take-over fenced this store off, or the stream holds another store's history; this store ships nothing more to it; restore from the stream (taking it over) to write it from here",
        by.as_ref().map_or_else(|| "another store".to_owned(), ToString::to_string)
    )]
    Fenced {
        /// The store that took the stream over (or wrote it last), if the entry names one.
        by: Option<WriterIdentity>,
        /// The stream's epoch.
        epoch: u64,
    },
    /// The broker lost acknowledged data: the stream or its writer entry is gone, or the
    /// stream ends before frames it acknowledged to this writer (a replaced broker, a wiped
    /// volume). A shipping store claims the stream again and sends a snapshot first.
    #[error(
        "the stream lost acknowledged frames ({detail}): the broker was replaced or lost its data; the store claims it again and sends a snapshot of everything it holds"
    )]
    Lost {
        /// What is missing.
        detail: String,
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
