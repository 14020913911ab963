//! The rules of a stream's writer, as pure transitions: who may claim the stream, what a
//! take-over and a clean close do to its writer entry, and who may append to it. No I/O.
//!
//! Every replica applies these rules to the entry it keeps (`replica::JetStream` in a NATS
//! key-value bucket, `testing::MemoryReplica` in memory), and the protocol's model checker
//! (`tests/suite/handover_model.rs`) explores them: one copy of each rule.
//!
//! **Epochs.** Every take-over starts a new epoch, one more than the entry's. The epoch is kept
//! in the entry, in the store's metadata and on every frame and snapshot the store ships. A
//! store whose epoch is below the entry's was taken over: its claim, its frames and its
//! snapshots are refused whatever else the entry says, and a clean close (which lets the
//! writer go) never lowers the epoch. So a box that comes back on its own directory after its
//! stream was taken over can never write the stream again, even once the new writer has closed
//! cleanly. (Kafka's leader epochs are the model.)
//!
//! **The last writer.** The entry also names the last store that wrote it, kept through a
//! release: a released stream is claimed again only by that store, or taken over.
//!
//! **A broker that forgets.** An entry whose epoch is below the claiming store's own can only
//! be a broker that lost its data (epochs only grow, by compare-and-set): the store with the
//! higher epoch claims it, at its epoch, and catches the stream up with a snapshot.

/// Whether two identities name one store (the same directory on the same host): a claim left
/// by an earlier process of a store is that store's to take back.
pub trait SameStore {
    /// Whether `other` is this same store.
    fn same_store(&self, other: &Self) -> bool;
}

/// The writer entry as the rules see it (a replica keeps more: the latest snapshot).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Slot<W> {
    /// The epoch of the stream: raised by one at every take-over, never lowered.
    pub epoch: u64,
    /// The store that writes the stream now; `None` once it closed cleanly.
    pub writer: Option<W>,
    /// The store that wrote the stream last, kept through a release; `None` only in entries
    /// written before epochs existed (format 1).
    pub last_writer: Option<W>,
}

/// What a claim of the stream may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim<W> {
    /// The store becomes the writer; the entry is then [`claimed`].
    Take,
    /// The store's epoch is below the stream's, or the stream is another store's at the same
    /// epoch and only a take-over gives it to this one: this store must never write it.
    Fenced {
        /// The store the stream belongs to, if the entry names one.
        by: Option<W>,
        /// The stream's epoch.
        epoch: u64,
    },
    /// Another store writes the stream now (at this store's epoch): two writers would
    /// interleave their logs.
    OtherWriter(W),
}

/// Whether `me`, at epoch `mine`, may claim the stream whose entry is `entry` (`None`: no
/// entry, a new stream or a broker that lost it).
pub fn claim<W: SameStore + Clone>(entry: Option<&Slot<W>>, me: &W, mine: u64) -> Claim<W> {
    let Some(entry) = entry else {
        return Claim::Take;
    };
    if entry.epoch > mine {
        return Claim::Fenced {
            by: entry.writer.clone().or_else(|| entry.last_writer.clone()),
            epoch: entry.epoch,
        };
    }
    if entry.epoch < mine {
        // Epochs only grow: the broker lost the entry this store's take-over wrote.
        return Claim::Take;
    }
    match (&entry.writer, &entry.last_writer) {
        (Some(holder), _) if !holder.same_store(me) => Claim::OtherWriter(holder.clone()),
        (None, Some(last)) if !last.same_store(me) => Claim::Fenced {
            by: Some(last.clone()),
            epoch: entry.epoch,
        },
        _ => Claim::Take,
    }
}

/// The entry once `me` claimed it at epoch `mine` (after [`claim`] said [`Claim::Take`]).
pub fn claimed<W: Clone>(me: &W, mine: u64) -> Slot<W> {
    Slot {
        epoch: mine,
        writer: Some(me.clone()),
        last_writer: Some(me.clone()),
    }
}

/// The entry once `me` took the stream over from whoever had it: the next epoch. A stream
/// with no entry starts at `known` + 1, `known` being the highest epoch the restore saw
/// elsewhere (in the snapshot's metadata).
pub fn taken_over<W: Clone>(entry: Option<&Slot<W>>, me: &W, known: u64) -> Slot<W> {
    let epoch = entry.map_or(0, |e| e.epoch).max(known) + 1;
    Slot {
        epoch,
        writer: Some(me.clone()),
        last_writer: Some(me.clone()),
    }
}

/// The entry once `me`, at epoch `mine`, closed cleanly: the writer goes, the epoch and the
/// last writer stay. `None`: the entry is not `me`'s to release (it changes nothing).
pub fn released<W: SameStore + Clone + PartialEq>(
    entry: &Slot<W>,
    me: &W,
    mine: u64,
) -> Option<Slot<W>> {
    (entry.epoch == mine && entry.writer.as_ref() == Some(me)).then(|| Slot {
        writer: None,
        ..entry.clone()
    })
}

/// Whether `me` at epoch `mine` may append a frame or commit a snapshot to the stream whose
/// entry is `entry`; else what the claim would say now. `None` entry: the broker lost it.
pub fn may_write<W: SameStore + Clone>(
    entry: Option<&Slot<W>>,
    me: &W,
    mine: u64,
) -> Result<(), Refusal<W>> {
    let Some(entry) = entry else {
        return Err(Refusal::Lost);
    };
    if entry.epoch > mine {
        return Err(Refusal::Fenced {
            by: entry.writer.clone().or_else(|| entry.last_writer.clone()),
            epoch: entry.epoch,
        });
    }
    if entry.epoch < mine {
        return Err(Refusal::Lost);
    }
    match &entry.writer {
        Some(holder) if holder.same_store(me) => Ok(()),
        Some(holder) => Err(Refusal::OtherWriter(holder.clone())),
        // Released meanwhile: whoever claims next decides.
        None => Err(Refusal::NotClaimed),
    }
}

/// Why a write to the stream is refused ([`may_write`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal<W> {
    /// A take-over raised the epoch past this store's.
    Fenced {
        /// The stream's writer, or its last one.
        by: Option<W>,
        /// The stream's epoch.
        epoch: u64,
    },
    /// Another store writes the stream.
    OtherWriter(W),
    /// The entry names no writer (released): claim again.
    NotClaimed,
    /// The entry is gone, or older than this store's epoch: the broker lost it.
    Lost,
}

/// Whether a frame of epoch `next` may follow one of epoch `previous` in the stream: epochs
/// never decrease along it, since a take-over fences every older writer's later frames.
pub fn follows(previous: u64, next: u64) -> bool {
    next >= previous
}

/// What a store does with the stream it claimed, from where the stream ends (`stream_last`)
/// and where its own log ends (`durable`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterClaim {
    /// The stream goes on where the log's unshipped frames begin: ship them.
    Ship,
    /// The stream lacks frames this store no longer has queued (or has no snapshot to begin
    /// with): send a snapshot first.
    CatchUp,
    /// The stream holds frames past this store's log: another store wrote it, or this store
    /// is an older copy. A snapshot would erase the other store's frames: stop.
    Ahead,
}

/// See [`AfterClaim`]. `next_queued` is the first frame this store still holds to ship;
/// `snapshot` whether the stream has one.
pub fn after_claim(stream_last: u64, durable: u64, next_queued: u64, snapshot: bool) -> AfterClaim {
    if stream_last > durable {
        AfterClaim::Ahead
    } else if next_queued != stream_last + 1 || !snapshot {
        AfterClaim::CatchUp
    } else {
        AfterClaim::Ship
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, PartialEq, Eq)]
    struct Box(&'static str);

    impl SameStore for Box {
        fn same_store(&self, other: &Self) -> bool {
            self.0 == other.0
        }
    }

    const A: Box = Box("a");
    const B: Box = Box("b");

    #[test]
    fn a_released_take_over_still_fences_the_old_writer() {
        let first = claimed(&A, 0);
        assert_eq!(claim(Some(&first), &A, 0), Claim::Take);
        let taken = taken_over(Some(&first), &B, 0);
        assert_eq!(taken.epoch, 1);
        let released = released(&taken, &B, 1).expect("B's to release");
        assert_eq!(released.writer, None);
        assert_eq!(released.epoch, 1, "a release never lowers the epoch");
        assert_eq!(
            claim(Some(&released), &A, 0),
            Claim::Fenced {
                by: Some(B),
                epoch: 1
            }
        );
        assert_eq!(claim(Some(&released), &B, 1), Claim::Take);
        assert_eq!(
            may_write(Some(&released), &A, 0),
            Err(Refusal::Fenced {
                by: Some(B),
                epoch: 1
            })
        );
    }

    #[test]
    fn a_released_stream_is_its_last_writers_and_a_held_one_its_writers() {
        let held = claimed(&A, 0);
        assert_eq!(claim(Some(&held), &B, 0), Claim::OtherWriter(A));
        let free = released(&held, &A, 0).expect("A's");
        assert!(matches!(claim(Some(&free), &B, 0), Claim::Fenced { .. }));
        assert_eq!(released(&free, &B, 0), None, "not B's to release");
        // An entry from before epochs names no last writer: the old rule, any store claims.
        let old = Slot {
            epoch: 0,
            writer: None,
            last_writer: None,
        };
        assert_eq!(claim(Some(&old), &B, 0), Claim::Take);
    }

    #[test]
    fn a_broker_that_forgot_is_claimed_by_the_higher_epoch() {
        assert_eq!(claim(None, &A, 3), Claim::Take);
        let stale = claimed(&B, 1);
        assert_eq!(claim(Some(&stale), &A, 3), Claim::Take);
        assert_eq!(may_write(None, &A, 3), Err(Refusal::Lost));
        assert_eq!(may_write(Some(&stale), &A, 3), Err(Refusal::Lost));
        assert_eq!(taken_over(None, &A, 4).epoch, 5, "above every epoch seen");
    }

    #[test]
    fn what_a_claimed_store_does_follows_where_the_stream_ends() {
        assert_eq!(after_claim(10, 12, 11, true), AfterClaim::Ship);
        assert_eq!(after_claim(10, 12, 12, true), AfterClaim::CatchUp);
        assert_eq!(after_claim(0, 5, 1, false), AfterClaim::CatchUp);
        assert_eq!(after_claim(13, 12, 13, true), AfterClaim::Ahead);
        assert!(follows(1, 1) && follows(1, 2) && !follows(2, 1));
    }
}
