//! Reads a record's fields from its bytes, never past their end.

use crate::model::invalid::CorruptRecord;

pub(super) struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub(super) fn new(bytes: &'a [u8]) -> Self {
        Reader { bytes, pos: 0 }
    }

    /// Refuses bytes after the record's last field.
    pub(super) fn finish(self) -> Result<(), CorruptRecord> {
        match self.bytes.len() - self.pos {
            0 => Ok(()),
            extra => Err(CorruptRecord::TrailingBytes { extra }),
        }
    }

    pub(super) fn take(
        &mut self,
        n: usize,
        field: &'static str,
    ) -> Result<&'a [u8], CorruptRecord> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&end| end <= self.bytes.len())
            .ok_or(CorruptRecord::Truncated {
                field,
                at: self.pos,
            })?;
        let out = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(out)
    }

    /// `n` bytes that must be UTF-8 (a header name).
    pub(super) fn utf8(&mut self, n: usize, field: &'static str) -> Result<String, CorruptRecord> {
        let bytes = self.take(n, field)?;
        std::str::from_utf8(bytes)
            .map(str::to_owned)
            .map_err(|_| CorruptRecord::BadField {
                field,
                detail: "not UTF-8".into(),
            })
    }

    pub(super) fn array<const N: usize>(
        &mut self,
        field: &'static str,
    ) -> Result<[u8; N], CorruptRecord> {
        let mut out = [0; N];
        out.copy_from_slice(self.take(N, field)?);
        Ok(out)
    }

    pub(super) fn u8(&mut self, field: &'static str) -> Result<u8, CorruptRecord> {
        Ok(self.array::<1>(field)?[0])
    }

    pub(super) fn u16(&mut self, field: &'static str) -> Result<u16, CorruptRecord> {
        Ok(u16::from_le_bytes(self.array(field)?))
    }

    pub(super) fn u32(&mut self, field: &'static str) -> Result<u32, CorruptRecord> {
        Ok(u32::from_le_bytes(self.array(field)?))
    }

    pub(super) fn u64(&mut self, field: &'static str) -> Result<u64, CorruptRecord> {
        Ok(u64::from_le_bytes(self.array(field)?))
    }

    /// An unsigned LEB128 varint of at most ten bytes that fits a u64.
    pub(super) fn varint(&mut self, field: &'static str) -> Result<u64, CorruptRecord> {
        let mut value = 0u64;
        for i in 0..10 {
            let byte = self.u8(field)?;
            let bits = u64::from(byte & 0x7f);
            if i == 9 && byte > 1 {
                return Err(CorruptRecord::BadField {
                    field,
                    detail: "varint overflows 64 bits".into(),
                });
            }
            value |= bits << (7 * i);
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(CorruptRecord::BadField {
            field,
            detail: "varint longer than ten bytes".into(),
        })
    }

    /// A varint that must fit `T` (a length, a status, an attempt).
    pub(super) fn varint_as<T: TryFrom<u64>>(
        &mut self,
        field: &'static str,
    ) -> Result<T, CorruptRecord> {
        let value = self.varint(field)?;
        T::try_from(value).map_err(|_| CorruptRecord::BadField {
            field,
            detail: format!("{value} is out of range"),
        })
    }

    /// A signed distance from `base`, zigzag-encoded, as written by [`put_delta`].
    pub(super) fn delta(&mut self, base: u64, field: &'static str) -> Result<u64, CorruptRecord> {
        let zigzag = self.varint(field)?;
        let delta = (zigzag >> 1) ^ (zigzag & 1).wrapping_neg();
        Ok(base.wrapping_add(delta))
    }
}

/// The error for a state tag no version uses.
pub(super) fn unknown_state(tag: u8) -> CorruptRecord {
    CorruptRecord::BadField {
        field: "state",
        detail: format!("unknown state tag {tag}"),
    }
}

/// Appends `value` as an unsigned LEB128 varint (one byte below 128, ten at most).
pub(super) fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// Appends `value - base` as a zigzag varint: times a record holds are close to one another,
/// so each costs one to four bytes instead of eight. Wrapping, so every pair round-trips.
pub(super) fn put_delta(out: &mut Vec<u8>, base: u64, value: u64) {
    let delta = value.wrapping_sub(base) as i64;
    put_varint(out, ((delta << 1) ^ (delta >> 63)) as u64);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_and_deltas_round_trip_at_the_edges() -> Result<(), CorruptRecord> {
        let values = [0, 1, 127, 128, 16_383, 16_384, u64::MAX / 2, u64::MAX];
        let mut out = Vec::new();
        for &v in &values {
            put_varint(&mut out, v);
            for &base in &values {
                put_delta(&mut out, base, v);
            }
        }
        let mut r = Reader::new(&out);
        for &v in &values {
            assert_eq!(r.varint("v")?, v);
            for &base in &values {
                assert_eq!(r.delta(base, "d")?, v, "{v} from {base}");
            }
        }
        r.finish()
    }

    #[test]
    fn small_values_are_short() {
        let mut out = Vec::new();
        put_varint(&mut out, 127);
        put_delta(&mut out, 1_000, 1_063);
        put_delta(&mut out, 1_000, 937);
        assert_eq!(out.len(), 3);
    }

    #[test]
    fn overlong_and_overflowing_varints_are_errors() {
        let overflow = [0xff; 9].iter().copied().chain([0x02]).collect::<Vec<_>>();
        assert!(matches!(
            Reader::new(&overflow).varint("v"),
            Err(CorruptRecord::BadField { .. })
        ));
        assert!(matches!(
            Reader::new(&[0x80; 11]).varint("v"),
            Err(CorruptRecord::BadField { .. })
        ));
        assert!(matches!(
            Reader::new(&[0x80]).varint("v"),
            Err(CorruptRecord::Truncated { .. })
        ));
    }
}
