//! Lowercase hex, the one encoding every printed or derived byte string uses (downstream keys,
//! notification payloads, the tool's output).

const DIGITS: &[u8; 16] = b"0123456789abcdef";

/// Appends `bytes` to `out` as lowercase hex, two digits a byte.
pub(crate) fn push_hex(out: &mut String, bytes: &[u8]) {
    out.reserve(bytes.len() * 2);
    for &b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
}

/// `bytes` as lowercase hex.
pub(crate) fn hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    push_hex(&mut out, bytes);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_byte_is_two_digits_as_format_gives_them() {
        let all: Vec<u8> = (0..=255).collect();
        let expected: String = all.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex(&all), expected);
        assert_eq!(hex(&[]), "");
        let mut out = String::from("0x");
        push_hex(&mut out, &[0x0a, 0xff]);
        assert_eq!(out, "0x0aff");
    }
}
