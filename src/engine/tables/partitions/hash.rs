//! The keyed hash behind the partitions' filters: SipHash-2-4 under the store's own key.
//!
//! A filter's false positive costs one lookup in a partition that does not hold the key. Keys
//! come from clients, so an unkeyed hash would let a client choose keys that collide in every
//! filter and make each of its requests probe every partition. Under a random key that lives
//! in the store's metadata, no client can aim. The key must never change for a store's life:
//! sealed partitions keep their filters on disk.

use std::hash::{BuildHasher, Hasher};

/// SipHash-2-4 with a 128-bit key (Aumasson and Bernstein, 2012), 64-bit output.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct KeyHasher {
    k0: u64,
    k1: u64,
}

impl std::fmt::Debug for KeyHasher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The key is a secret of the store's: never in a log line.
        f.write_str("KeyHasher(..)")
    }
}

/// A fresh random key, from the operating system's randomness as the standard library's
/// `RandomState` draws it (no other source is needed for 128 bits once per store).
pub(crate) fn random_key() -> [u8; 16] {
    let mut key = [0u8; 16];
    for (i, half) in key.chunks_exact_mut(8).enumerate() {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_usize(i);
        half.copy_from_slice(&h.finish().to_le_bytes());
    }
    key
}

impl KeyHasher {
    pub(crate) fn new(key: [u8; 16]) -> Self {
        let (k0, k1) = key.split_at(8);
        KeyHasher {
            k0: u64::from_le_bytes(k0.try_into().unwrap_or_default()),
            k1: u64::from_le_bytes(k1.try_into().unwrap_or_default()),
        }
    }

    /// The hash of `bytes`.
    pub(crate) fn hash(&self, bytes: &[u8]) -> u64 {
        let mut v = [
            self.k0 ^ 0x736f_6d65_7073_6575,
            self.k1 ^ 0x646f_7261_6e64_6f6d,
            self.k0 ^ 0x6c79_6765_6e65_7261,
            self.k1 ^ 0x7465_6462_7974_6573,
        ];
        let mut words = bytes.chunks_exact(8);
        for word in &mut words {
            let m = u64::from_le_bytes(word.try_into().unwrap_or_default());
            compress(&mut v, m);
        }
        let mut last = [0u8; 8];
        let rest = words.remainder();
        last[..rest.len()].copy_from_slice(rest);
        last[7] = bytes.len() as u8;
        compress(&mut v, u64::from_le_bytes(last));
        v[2] ^= 0xff;
        for _ in 0..4 {
            round(&mut v);
        }
        v[0] ^ v[1] ^ v[2] ^ v[3]
    }
}

fn compress(v: &mut [u64; 4], m: u64) {
    v[3] ^= m;
    round(v);
    round(v);
    v[0] ^= m;
}

fn round(v: &mut [u64; 4]) {
    v[0] = v[0].wrapping_add(v[1]);
    v[1] = v[1].rotate_left(13) ^ v[0];
    v[0] = v[0].rotate_left(32);
    v[2] = v[2].wrapping_add(v[3]);
    v[3] = v[3].rotate_left(16) ^ v[2];
    v[0] = v[0].wrapping_add(v[3]);
    v[3] = v[3].rotate_left(21) ^ v[0];
    v[2] = v[2].wrapping_add(v[1]);
    v[1] = v[1].rotate_left(17) ^ v[2];
    v[2] = v[2].rotate_left(32);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference implementation's vectors: key 00..0f, messages 00..(n-1).
    #[test]
    fn matches_the_reference_vectors() {
        let key: [u8; 16] = std::array::from_fn(|i| i as u8);
        let hasher = KeyHasher::new(key);
        let message: Vec<u8> = (0u8..64).collect();
        let expected = [
            (0, 0x726f_db47_dd0e_0e31),
            (1, 0x74f8_39c5_93dc_67fd),
            (7, 0xab02_00f5_8b01_d137),
            (8, 0x93f5_f579_9a93_2462),
            (15, 0xa129_ca61_49be_45e5),
            (63, 0x958a_324c_eb06_4572),
        ];
        for (len, want) in expected {
            assert_eq!(hasher.hash(&message[..len]), want, "length {len}");
        }
    }

    #[test]
    fn random_keys_differ() {
        assert_ne!(random_key(), random_key());
    }
}
