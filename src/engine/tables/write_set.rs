//! One request's buffered writes.
//!
//! redb savepoints cannot roll back one request inside a group, so a request writes here first;
//! the writer applies the set to the group's transaction only if the request succeeds. Reads in
//! the request see the set first (read-your-writes), then the group's transaction.

use super::registry::TableId;

/// A put (`value: Some`) or a delete (`value: None`) of one key, as bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WriteOp {
    pub(crate) table: TableId,
    pub(crate) key: Vec<u8>,
    pub(crate) value: Option<Vec<u8>>,
}

/// What a lookup in a write set found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Buffered<'a> {
    /// The request wrote this value.
    Put(&'a [u8]),
    /// The request deleted the key.
    Deleted,
    /// The request did not touch the key: read the group's transaction.
    Untouched,
}

/// The writes of one request, in the order made.
///
/// A request writes a handful of keys, so lookups scan backwards: cheaper than a map at this
/// size, and the order is the order to apply and to log.
#[derive(Debug, Default)]
pub(crate) struct WriteSet {
    ops: Vec<WriteOp>,
    /// Key and value bytes written so far, for the per-request limit and the log frame size.
    bytes: u64,
}

impl WriteSet {
    pub(crate) fn put(&mut self, table: TableId, key: &[u8], value: Vec<u8>) {
        self.bytes += (key.len() + value.len()) as u64;
        self.ops.push(WriteOp {
            table,
            key: key.to_vec(),
            value: Some(value),
        });
    }

    pub(crate) fn delete(&mut self, table: TableId, key: &[u8]) {
        self.bytes += key.len() as u64;
        self.ops.push(WriteOp {
            table,
            key: key.to_vec(),
            value: None,
        });
    }

    /// The latest write of `key` in `table`, if any.
    pub(crate) fn lookup(&self, table: TableId, key: &[u8]) -> Buffered<'_> {
        match self
            .ops
            .iter()
            .rev()
            .find(|op| op.table == table && op.key == key)
        {
            Some(WriteOp {
                value: Some(value), ..
            }) => Buffered::Put(value),
            Some(WriteOp { value: None, .. }) => Buffered::Deleted,
            None => Buffered::Untouched,
        }
    }

    /// The latest write of every key of `table`, for merging into a range read.
    pub(crate) fn latest_in(&self, table: TableId) -> Vec<&WriteOp> {
        let mut latest: Vec<&WriteOp> = Vec::new();
        for op in self.ops.iter().filter(|op| op.table == table) {
            match latest.iter_mut().find(|seen| seen.key == op.key) {
                Some(seen) => *seen = op,
                None => latest.push(op),
            }
        }
        latest
    }

    pub(crate) fn ops(&self) -> &[WriteOp] {
        &self.ops
    }

    pub(crate) fn into_ops(self) -> Vec<WriteOp> {
        self.ops
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Key and value bytes written so far.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_sees_the_latest_write() {
        let mut ws = WriteSet::default();
        assert_eq!(ws.lookup(1, b"k"), Buffered::Untouched);
        ws.put(1, b"k", b"v1".to_vec());
        ws.put(1, b"k", b"v2".to_vec());
        assert_eq!(ws.lookup(1, b"k"), Buffered::Put(b"v2"));
        assert_eq!(ws.lookup(2, b"k"), Buffered::Untouched);
        ws.delete(1, b"k");
        assert_eq!(ws.lookup(1, b"k"), Buffered::Deleted);
        assert_eq!(ws.latest_in(1).len(), 1);
        assert_eq!(ws.latest_in(1)[0].value, None);
    }
}
