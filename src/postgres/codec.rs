//! A stored response's headers as one `bytea`: a `u16` count, then per header a `u16` name
//! length, the name, a `u32` value length and the value, all little-endian. Status and body
//! have columns of their own.

use crate::error::CorruptRecord;
use crate::model::response::Response;

/// The headers column of `response` (lengths are bounded by `Response::validate` first).
pub(crate) fn encode_headers(response: &Response) -> Vec<u8> {
    let headers = response.headers();
    let mut out = Vec::with_capacity(
        2 + headers
            .iter()
            .map(|(n, v)| 6 + n.len() + v.len())
            .sum::<usize>(),
    );
    out.extend_from_slice(
        &u16::try_from(headers.len())
            .unwrap_or(u16::MAX)
            .to_le_bytes(),
    );
    for (name, value) in headers {
        out.extend_from_slice(&u16::try_from(name.len()).unwrap_or(u16::MAX).to_le_bytes());
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(&u32::try_from(value.len()).unwrap_or(u32::MAX).to_le_bytes());
        out.extend_from_slice(value);
    }
    out
}

/// Reads the headers column back; never trusts a length.
pub(crate) fn decode_headers(bytes: &[u8]) -> Result<Vec<(String, Vec<u8>)>, CorruptRecord> {
    let mut at: usize = 0;
    let mut take = |n: usize, field: &'static str| -> Result<&[u8], CorruptRecord> {
        let part = bytes
            .get(at..at.saturating_add(n))
            .ok_or(CorruptRecord::Truncated { field, at })?;
        at += n;
        Ok(part)
    };
    let count = u16::from_le_bytes(fixed(take(2, "header count")?));
    let mut headers = Vec::with_capacity(usize::from(count).min(64));
    for _ in 0..count {
        let len = u16::from_le_bytes(fixed(take(2, "header name length")?));
        let name = std::str::from_utf8(take(usize::from(len), "header name")?)
            .map_err(|e| CorruptRecord::BadField {
                field: "header name",
                detail: e.to_string(),
            })?
            .to_owned();
        let len = u32::from_le_bytes(fixed(take(4, "header value length")?));
        let value = take(len as usize, "header value")?.to_vec();
        headers.push((name, value));
    }
    if at != bytes.len() {
        return Err(CorruptRecord::TrailingBytes {
            extra: bytes.len() - at,
        });
    }
    Ok(headers)
}

/// A slice whose length was just checked, as an array.
fn fixed<const N: usize>(bytes: &[u8]) -> [u8; N] {
    let mut out = [0; N];
    out.copy_from_slice(&bytes[..N]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_and_truncation_is_an_error() {
        let response = Response::new(201, "x")
            .with_header("content-type", "application/octet-stream")
            .with_header("x-bin", vec![0u8, 255, 10]);
        let bytes = encode_headers(&response);
        assert_eq!(
            decode_headers(&bytes).ok().as_deref(),
            Some(response.headers())
        );
        for cut in 0..bytes.len() {
            assert!(decode_headers(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut padded = bytes.clone();
        padded.push(0);
        assert!(matches!(
            decode_headers(&padded),
            Err(CorruptRecord::TrailingBytes { extra: 1 })
        ));
    }
}
