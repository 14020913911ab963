//! A sealed partition's row in `idemstore.partitions`: its figures and its filter.
//!
//! The row is a cache of what the partition's records say, written when the partition is
//! sealed so that an open does not read every record to rebuild the filter. A partition
//! without a row (the open one, or one whose row was never written) is read whole at open.
//! Layout (all integers little-endian), documented in `docs/design.md`:
//!
//! ```text
//! 1   version = 1
//! 1   stage: 1 = sealed, 2 = tombstoned (its completed records are tombstones now)
//! 8   records written into it (an upper bound of what it holds)
//! 8   first_at: when its first record was written (ms)
//! 8   max_expires: the latest expires_at of a completed record in it (ms, 0 for none)
//! 8   max_until: the latest until of a tombstone in it (ms, 0 for none)
//! 8   tombstones: how many of its records are tombstones
//! ... the filter (`filter.rs`): u8 bits a key, u32 block count, then 64 bytes a block
//! 4   the number of key hashes n
//! 8 n the hashes of its keys (u64 LE): its generation's filter is rebuilt from them at open
//! ```

use crate::model::clock::Timestamp;

use super::filter::Filter;

const VERSION: u8 = 1;
const HEAD: usize = 2 + 5 * 8;

/// How far a sealed partition has come.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stage {
    /// Takes no new records.
    Sealed,
    /// Its completed records were turned into tombstones (their TTL passed, and the store
    /// keeps tombstones).
    Tombstoned,
}

/// The figures of a sealed partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Info {
    pub(crate) records: u64,
    pub(crate) first_at: Timestamp,
    pub(crate) max_expires: Timestamp,
    pub(crate) max_until: Timestamp,
    pub(crate) tombstones: u64,
    pub(crate) stage: Stage,
}

impl Info {
    pub(crate) fn encode(&self, filter: &Filter, hashes: &[u64]) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEAD + 5 + filter.bytes() + 4 + 8 * hashes.len());
        out.push(VERSION);
        out.push(match self.stage {
            Stage::Sealed => 1,
            Stage::Tombstoned => 2,
        });
        for value in [
            self.records,
            self.first_at.as_millis(),
            self.max_expires.as_millis(),
            self.max_until.as_millis(),
            self.tombstones,
        ] {
            out.extend_from_slice(&value.to_le_bytes());
        }
        filter.encode(&mut out);
        out.extend_from_slice(&(hashes.len() as u32).to_le_bytes());
        for hash in hashes {
            out.extend_from_slice(&hash.to_le_bytes());
        }
        out
    }

    /// The row's figures, filter and key hashes; an error that says what is wrong with it.
    pub(crate) fn decode(bytes: &[u8]) -> Result<(Info, Filter, Vec<u64>), String> {
        if bytes.len() < HEAD {
            return Err(format!(
                "{} bytes, shorter than the row's head",
                bytes.len()
            ));
        }
        if bytes[0] != VERSION {
            return Err(format!(
                "row version {}, this build reads {VERSION}",
                bytes[0]
            ));
        }
        let stage = match bytes[1] {
            1 => Stage::Sealed,
            2 => Stage::Tombstoned,
            other => return Err(format!("unknown stage {other}")),
        };
        let word = |i: usize| {
            let at = 2 + 8 * i;
            u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap_or_default())
        };
        let info = Info {
            records: word(0),
            first_at: Timestamp::from_millis(word(1)),
            max_expires: Timestamp::from_millis(word(2)),
            max_until: Timestamp::from_millis(word(3)),
            tombstones: word(4),
            stage,
        };
        let (filter, rest) = Filter::decode(&bytes[HEAD..])?;
        let (count, rest) = rest
            .split_first_chunk::<4>()
            .ok_or("the key hashes' count is cut off")?;
        let count = u32::from_le_bytes(*count) as usize;
        if rest.len() != count * 8 {
            return Err(format!(
                "{count} key hashes need {} bytes, {} are left",
                count * 8,
                rest.len()
            ));
        }
        let hashes = rest
            .chunks_exact(8)
            .map(|h| u64::from_le_bytes(h.try_into().unwrap_or_default()))
            .collect();
        Ok((info, filter, hashes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses_damage() -> Result<(), String> {
        let filter = Filter::with_capacity(100, 10);
        filter.insert(42);
        let info = Info {
            records: 100,
            first_at: Timestamp::from_millis(5),
            max_expires: Timestamp::from_millis(86_400_005),
            max_until: Timestamp::from_millis(0),
            tombstones: 40,
            stage: Stage::Tombstoned,
        };
        let bytes = info.encode(&filter, &[42, 43]);
        let (back, back_filter, hashes) = Info::decode(&bytes)?;
        assert_eq!(back, info);
        assert!(back_filter.may_contain(42));
        assert_eq!(hashes, [42, 43]);
        assert!(Info::decode(&bytes[..HEAD - 1]).is_err());
        assert!(Info::decode(&bytes[..bytes.len() - 1]).is_err());
        let mut extra = bytes.clone();
        extra.push(0);
        assert!(Info::decode(&extra).is_err());
        let mut version = bytes.clone();
        version[0] = 9;
        assert!(Info::decode(&version).is_err());
        let mut stage = bytes;
        stage[1] = 7;
        assert!(Info::decode(&stage).is_err());
        Ok(())
    }
}
