//! The transaction handle that commit and write closures receive.
//!
//! Business writes go through here so that they land in the same redb transaction as the
//! completed record, and so that the engine sees them as bytes it can log and replay. Reads see
//! this request's own writes first, then everything earlier requests of the group wrote.

use std::borrow::Borrow;
use std::fmt;
use std::marker::PhantomData;
use std::ops::{Bound, RangeBounds};

use redb::{Key, TableDefinition, TableHandle, Value, WriteTransaction};

use crate::error::TxError;
use crate::model::fingerprint::Fingerprint;
use crate::model::limits::MAX_REQUEST_BYTES;
use crate::model::message::{MessageError, Published};
use crate::model::record::Record;
use crate::model::scope::Scope;

use super::open_tables::OpenTables;
use super::registry::{RawEntries, Registry, TableId};
use super::write_set::{Buffered, WriteSet};

/// A value read through [`Tx`], owned so that it outlives the read.
pub struct OwnedValue<V: Value + 'static> {
    bytes: Vec<u8>,
    _type: PhantomData<fn() -> V>,
}

impl<V: Value + 'static> OwnedValue<V> {
    fn new(bytes: Vec<u8>) -> Self {
        OwnedValue {
            bytes,
            _type: PhantomData,
        }
    }

    /// The value, as redb's `AccessGuard::value` gives it.
    pub fn value(&self) -> V::SelfType<'_> {
        V::from_bytes(&self.bytes)
    }

    /// The value's encoded bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }
}

impl<V: Value + 'static> fmt::Debug for OwnedValue<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.value().fmt(f)
    }
}

/// Reads and writes business tables inside a commit or write closure.
///
/// Every write is buffered for this request and applied to the group's redb transaction only if
/// the closure returns `Ok`: an error (or a panic) leaves no trace. Tables must have been
/// registered with [`Builder::table`](crate::Builder::table).
pub struct Tx<'g> {
    txn: &'g WriteTransaction,
    /// The store's own tables, opened once for the group.
    open: &'g OpenTables<'g>,
    registry: &'g Registry,
    writes: &'g mut WriteSet,
    /// Messages published by this request, and the claim whose downstream key prefixes
    /// their ids (`None` outside a commit, where publishing is refused).
    outbox: Outbox,
}

/// The messages a request publishes, recorded in the outbox if it succeeds.
#[derive(Debug, Default)]
pub(crate) struct Outbox {
    claim: Option<Publisher>,
    messages: Published,
}

/// The claim a commit publishes for. Its downstream key is derived when the first message is
/// published: a hash and 32 hex digits that most commits, publishing nothing, never need.
#[derive(Debug)]
struct Publisher {
    scope: Scope,
    fingerprint: Fingerprint,
    origin_fence: u64,
    id_prefix: Option<String>,
}

impl fmt::Debug for Tx<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tx")
            .field("buffered_writes", &self.writes.ops().len())
            .finish()
    }
}

impl<'g> Tx<'g> {
    pub(crate) fn new(
        txn: &'g WriteTransaction,
        open: &'g OpenTables<'g>,
        registry: &'g Registry,
        writes: &'g mut WriteSet,
    ) -> Self {
        Tx {
            txn,
            open,
            registry,
            writes,
            outbox: Outbox::default(),
        }
    }

    /// Records a message in the outbox, in the same transaction as this commit's business
    /// writes and its completed record: all three are kept, or none is. A relay
    /// ([`Relay`](crate::relay::Relay), feature `tokio`) delivers it after the commit, at
    /// least once, in commit order per subject. Returns its stable id, the same on every
    /// delivery attempt: the claim's `downstream_key()`, a dash, and the message's index in
    /// this commit.
    ///
    /// # Errors
    /// [`MessageError`] if the subject or payload is refused, more than
    /// [`MAX_MESSAGES_PER_COMMIT`](crate::limits::MAX_MESSAGES_PER_COMMIT) were
    /// published, or this is not a commit (`Store::write` has no key to derive ids from).
    pub fn publish(
        &mut self,
        subject: &str,
        payload: impl Into<Vec<u8>>,
    ) -> Result<String, MessageError> {
        let Some(claim) = &mut self.outbox.claim else {
            return Err(MessageError::NotInCommit);
        };
        let prefix = claim.id_prefix.get_or_insert_with(|| {
            claim
                .scope
                .downstream_key(&claim.fingerprint, claim.origin_fence)
        });
        self.outbox.messages.add(prefix, subject, payload.into())
    }

    /// Lets the request publish, its messages' ids starting with the downstream key of the
    /// claim on `scope` whose record is `held`.
    pub(crate) fn allow_publish(&mut self, scope: &Scope, held: &Record) {
        self.outbox.claim = Some(Publisher {
            scope: scope.clone(),
            fingerprint: held.fingerprint,
            origin_fence: held.origin_fence,
            id_prefix: None,
        });
    }

    /// The messages published, to record once the request has succeeded.
    pub(crate) fn take_published(&mut self) -> Vec<(String, String, Vec<u8>)> {
        self.outbox.messages.take()
    }

    /// Reads one key.
    ///
    /// # Errors
    /// [`TxError`] if the table is not registered (or with other types), or redb fails.
    pub fn get<'k, K: Key + 'static, V: Value + 'static>(
        &self,
        table: &TableDefinition<'_, K, V>,
        key: impl Borrow<K::SelfType<'k>>,
    ) -> Result<Option<OwnedValue<V>>, TxError> {
        let id = self.resolve(table)?;
        let key = K::as_bytes(key.borrow());
        Ok(self.get_raw(id, key.as_ref())?.map(OwnedValue::new))
    }

    /// Writes one key. The old value is not read (that keeps the hot path cheap): call
    /// [`Tx::get`] first if you need it.
    ///
    /// # Errors
    /// [`TxError`] if the table is not registered (or with other types), or if this request
    /// has written more than [`MAX_REQUEST_BYTES`](crate::model::limits::MAX_REQUEST_BYTES).
    pub fn insert<'k, 'v, K: Key + 'static, V: Value + 'static>(
        &mut self,
        table: &TableDefinition<'_, K, V>,
        key: impl Borrow<K::SelfType<'k>>,
        value: impl Borrow<V::SelfType<'v>>,
    ) -> Result<(), TxError> {
        let id = self.resolve(table)?;
        let key = K::as_bytes(key.borrow());
        let value = V::as_bytes(value.borrow());
        let bytes = self.writes.bytes() + (key.as_ref().len() + value.as_ref().len()) as u64;
        if bytes > MAX_REQUEST_BYTES {
            return Err(TxError::TooLarge {
                bytes,
                max: MAX_REQUEST_BYTES,
            });
        }
        self.put_raw(id, key.as_ref(), value.as_ref().to_vec());
        Ok(())
    }

    /// Deletes one key and returns the value it had.
    ///
    /// # Errors
    /// [`TxError`] if the table is not registered (or with other types), or redb fails.
    pub fn remove<'k, K: Key + 'static, V: Value + 'static>(
        &mut self,
        table: &TableDefinition<'_, K, V>,
        key: impl Borrow<K::SelfType<'k>>,
    ) -> Result<Option<OwnedValue<V>>, TxError> {
        let id = self.resolve(table)?;
        let key = K::as_bytes(key.borrow());
        let old = self.get_raw(id, key.as_ref())?;
        if old.is_some() {
            self.delete_raw(id, key.as_ref());
        }
        Ok(old.map(OwnedValue::new))
    }

    /// Reads every entry with a key in `range`, in key order, including this request's own
    /// writes. The result is collected in memory: bound the range.
    ///
    /// # Errors
    /// [`TxError`] if the table is not registered (or with other types), or redb fails.
    #[expect(
        clippy::type_complexity,
        reason = "pairs of owned key and value, as redb's ranges yield"
    )]
    pub fn range<'k, K: Key + 'static, V: Value + 'static, KR: Borrow<K::SelfType<'k>>>(
        &self,
        table: &TableDefinition<'_, K, V>,
        range: impl RangeBounds<KR>,
    ) -> Result<Vec<(OwnedValue<K>, OwnedValue<V>)>, TxError> {
        let id = self.resolve(table)?;
        let bound = |b: Bound<&KR>| b.map(|k| K::as_bytes(k.borrow()).as_ref().to_vec());
        let (start, end) = (bound(range.start_bound()), bound(range.end_bound()));
        let entries = self.range_raw(id, as_ref(&start), as_ref(&end), usize::MAX)?;
        Ok(entries
            .into_iter()
            .map(|(k, v)| (OwnedValue::new(k), OwnedValue::new(v)))
            .collect())
    }

    /// The registered id of a business table, after checking its name and types.
    fn resolve<K: Key + 'static, V: Value + 'static>(
        &self,
        table: &TableDefinition<'_, K, V>,
    ) -> Result<TableId, TxError> {
        self.registry.business::<K, V>(table.name())
    }

    pub(crate) fn get_raw(
        &self,
        table: TableId,
        key: &[u8],
    ) -> Result<Option<Vec<u8>>, redb::Error> {
        match self.writes.lookup(table, key) {
            Buffered::Put(value) => Ok(Some(value.to_vec())),
            Buffered::Deleted => Ok(None),
            Buffered::Untouched => match self.open.read(table, key) {
                Some(found) => found,
                None => self.registry.table(table).open(self.txn)?.get(key),
            },
        }
    }

    pub(crate) fn put_raw(&mut self, table: TableId, key: &[u8], value: Vec<u8>) {
        self.writes.put(table, key, value);
    }

    pub(crate) fn delete_raw(&mut self, table: TableId, key: &[u8]) {
        self.writes.delete(table, key);
    }

    /// Entries in `(start, end)` in key order, at most `limit`, with this request's writes
    /// merged over the group's transaction.
    pub(crate) fn range_raw(
        &self,
        table: TableId,
        start: Bound<&[u8]>,
        end: Bound<&[u8]>,
        limit: usize,
    ) -> Result<RawEntries, redb::Error> {
        let ops = self.registry.table(table);
        let buffered = self.writes.latest_in(table);
        // Deletes in the write set may hide stored entries: read enough to still fill `limit`.
        let deletes = buffered.iter().filter(|op| op.value.is_none()).count();
        let wanted = limit.saturating_add(deletes);
        let mut entries = match self.open.range(table, start, end, wanted) {
            Some(found) => found?,
            None => ops.open(self.txn)?.range(start, end, wanted)?,
        };
        if buffered.is_empty() {
            return Ok(entries);
        }
        let in_range = |key: &[u8]| {
            let above = match start {
                Bound::Included(s) => ops.compare(key, s).is_ge(),
                Bound::Excluded(s) => ops.compare(key, s).is_gt(),
                Bound::Unbounded => true,
            };
            let below = match end {
                Bound::Included(e) => ops.compare(key, e).is_le(),
                Bound::Excluded(e) => ops.compare(key, e).is_lt(),
                Bound::Unbounded => true,
            };
            above && below
        };
        for op in buffered.into_iter().filter(|op| in_range(&op.key)) {
            entries.retain(|(k, _)| k != &op.key);
            if let Some(value) = &op.value {
                entries.push((op.key.clone(), value.clone()));
            }
        }
        entries.sort_by(|(a, _), (b, _)| ops.compare(a, b));
        entries.truncate(limit);
        Ok(entries)
    }
}

fn as_ref(b: &Bound<Vec<u8>>) -> Bound<&[u8]> {
    b.as_ref().map(Vec::as_slice)
}
