//! How the fuzz targets damage a valid input: bit flips, then a truncation.

/// XORs each `(at, mask)` into `bytes` (at wrapping around its length), then truncates it to
/// `truncate` bytes if given. An empty input stays empty.
pub fn damage(bytes: &mut Vec<u8>, flips: &[(u16, u8)], truncate: Option<u16>) {
    let len = bytes.len();
    if len > 0 {
        for &(at, mask) in flips {
            bytes[usize::from(at) % len] ^= mask;
        }
    }
    if let Some(len) = truncate {
        bytes.truncate(usize::from(len));
    }
}
