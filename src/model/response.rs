//! The stored outcome of an operation, replayed byte for byte to every retry.
//!
//! The core knows nothing of HTTP: a status is a number and headers are name/value pairs. The
//! HTTP adapter decides what they mean.

use crate::model::invalid::ResponseError;
use crate::model::limits::{MAX_HEADER_NAME_LEN, MAX_HEADER_VALUE_LEN, MAX_HEADERS};

/// What the first attempt answered: a status, a small list of headers and a body.
///
/// Failures are responses too: a deterministic failure committed as a `Response` (say a 402 or a
/// 500) is replayed to every retry exactly like a success.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Response {
    status: u16,
    headers: Vec<(String, Vec<u8>)>,
    body: Vec<u8>,
}

impl Response {
    /// A response with a status and a body and no headers.
    pub fn new(status: u16, body: impl Into<Vec<u8>>) -> Self {
        Response {
            status,
            headers: Vec::new(),
            body: body.into(),
        }
    }

    /// Adds a header (kept in the order added; names are not case-folded here).
    #[must_use]
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<Vec<u8>>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// The stored status.
    pub fn status(&self) -> u16 {
        self.status
    }

    /// The stored headers, in the order they were added.
    pub fn headers(&self) -> &[(String, Vec<u8>)] {
        &self.headers
    }

    /// The value of the first header with this name (ASCII case-insensitive).
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_slice())
    }

    /// The stored body.
    pub fn body(&self) -> &[u8] {
        &self.body
    }

    /// Takes the body out.
    pub fn into_body(self) -> Vec<u8> {
        self.body
    }

    /// Bytes this response occupies in its record (body, headers and their length prefixes).
    pub fn encoded_len(&self) -> usize {
        2 + 2
            + self
                .headers
                .iter()
                .map(|(n, v)| 2 + n.len() + 4 + v.len())
                .sum::<usize>()
            + 4
            + self.body.len()
    }

    /// Checks the response against the store's limits before it is written.
    pub(crate) fn validate(&self, max_bytes: usize) -> Result<(), ResponseError> {
        if self.headers.len() > MAX_HEADERS {
            return Err(ResponseError::TooManyHeaders {
                count: self.headers.len(),
                max: MAX_HEADERS,
            });
        }
        for (name, value) in &self.headers {
            if name.is_empty() || name.len() > MAX_HEADER_NAME_LEN {
                return Err(ResponseError::BadHeaderName {
                    name: name.chars().take(64).collect(),
                    max: MAX_HEADER_NAME_LEN,
                });
            }
            if value.len() > MAX_HEADER_VALUE_LEN {
                return Err(ResponseError::HeaderValueTooLong {
                    name: name.clone(),
                    len: value.len(),
                    max: MAX_HEADER_VALUE_LEN,
                });
            }
        }
        let size = self.encoded_len();
        if size > max_bytes {
            return Err(ResponseError::TooLarge {
                size,
                max: max_bytes,
            });
        }
        Ok(())
    }

    pub(crate) fn from_parts(status: u16, headers: Vec<(String, Vec<u8>)>, body: Vec<u8>) -> Self {
        Response {
            status,
            headers,
            body,
        }
    }
}
