//! Randomness for spreading retries: backoffs and `Retry-After` values, so that many clients
//! (or stores) do not all come back at once.

use std::hash::{BuildHasher, Hasher, RandomState};

/// A number in `[0, 1)`, different on every call (from the standard library's per-process
/// random hash keys): enough to spread retries, not for anything secret.
pub(crate) fn random_fraction() -> f64 {
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u64(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos().into()),
    );
    (hasher.finish() >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_fractions_are_in_range_and_vary() {
        let samples: Vec<f64> = (0..64).map(|_| random_fraction()).collect();
        assert!(samples.iter().all(|f| (0.0..1.0).contains(f)));
        assert!(samples.windows(2).any(|w| w[0] != w[1]));
    }
}
