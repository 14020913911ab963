//! Reading the `Idempotency-Key` header: an RFC 8941 string item (`"abc"`, the IETF draft's
//! form) or the bare value most clients send (`abc`, Stripe's form).

use axum::http::HeaderMap;

/// The header's name.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// Longest key accepted, in characters (Stripe's and the draft's ceiling).
const MAX_KEY: usize = 255;

/// What the request carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum KeyHeader {
    Absent,
    Present(String),
}

/// Why a key was refused (each becomes a 400 problem).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum KeyProblem {
    Repeated,
    Empty,
    TooLong(usize),
    Malformed(&'static str),
}

impl KeyProblem {
    pub(crate) fn detail(&self) -> String {
        match self {
            KeyProblem::Repeated => "the request has more than one Idempotency-Key (two headers, or a comma-separated list); send exactly one".into(),
            KeyProblem::Empty => "the Idempotency-Key header is empty; send a unique key per operation (a UUID works)".into(),
            KeyProblem::TooLong(n) => format!("the Idempotency-Key is {n} characters, over the limit of {MAX_KEY}"),
            KeyProblem::Malformed(why) => format!("the Idempotency-Key header is malformed: {why}"),
        }
    }
}

/// The key of a request, if it has exactly one well-formed `Idempotency-Key` header.
pub(crate) fn read_key(headers: &HeaderMap) -> Result<KeyHeader, KeyProblem> {
    let mut values = headers.get_all(IDEMPOTENCY_KEY).iter();
    let Some(value) = values.next() else {
        return Ok(KeyHeader::Absent);
    };
    if values.next().is_some() {
        return Err(KeyProblem::Repeated);
    }
    let text = value
        .to_str()
        .map_err(|_| KeyProblem::Malformed("it is not visible ASCII"))?
        .trim_matches([' ', '\t']);
    let key = match text.strip_prefix('"') {
        Some(quoted) => parse_sf_string(quoted)?,
        None => {
            // A comma makes a header a list (RFC 9110, section 5.3): `a, b` is two keys, the
            // same as two headers. A key that holds a comma can be sent quoted.
            if text.contains(',') {
                return Err(KeyProblem::Repeated);
            }
            if text.contains('"') {
                return Err(KeyProblem::Malformed("a stray quote"));
            }
            text.to_owned()
        }
    };
    if key.is_empty() {
        return Err(KeyProblem::Empty);
    }
    let chars = key.chars().count();
    if chars > MAX_KEY {
        return Err(KeyProblem::TooLong(chars));
    }
    Ok(KeyHeader::Present(key))
}

/// The rest of an RFC 8941 string after its opening quote: characters up to the closing quote,
/// `\"` and `\\` escaped; parameters after it (`;a=1`) are allowed and ignored.
fn parse_sf_string(rest: &str) -> Result<String, KeyProblem> {
    let mut out = String::new();
    let mut chars = rest.chars();
    loop {
        match chars.next() {
            None => return Err(KeyProblem::Malformed("an unterminated quoted string")),
            Some('"') => break,
            Some('\\') => match chars.next() {
                Some(c @ ('"' | '\\')) => out.push(c),
                _ => {
                    return Err(KeyProblem::Malformed(
                        "an invalid escape in a quoted string",
                    ));
                }
            },
            Some(c) if (' '..='~').contains(&c) => out.push(c),
            Some(_) => {
                return Err(KeyProblem::Malformed(
                    "a character a string item cannot hold",
                ));
            }
        }
    }
    let after: String = chars.collect();
    if after.trim_start_matches([' ', '\t']).starts_with(',') {
        return Err(KeyProblem::Repeated);
    }
    if !after.is_empty() && !after.starts_with(';') {
        return Err(KeyProblem::Malformed("text after the quoted string"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    fn key(values: &[&str]) -> Result<KeyHeader, KeyProblem> {
        let mut headers = HeaderMap::new();
        for v in values {
            headers.append(
                IDEMPOTENCY_KEY,
                HeaderValue::from_str(v).expect("valid header"),
            );
        }
        read_key(&headers)
    }

    #[test]
    fn reads_quoted_and_bare_keys() {
        assert_eq!(key(&[]), Ok(KeyHeader::Absent));
        assert_eq!(key(&["abc-123"]), Ok(KeyHeader::Present("abc-123".into())));
        assert_eq!(
            key(&["\"abc-123\""]),
            Ok(KeyHeader::Present("abc-123".into()))
        );
        assert_eq!(
            key(&["  \"a \\\"b\\\\ c\"  "]),
            Ok(KeyHeader::Present("a \"b\\ c".into()))
        );
        assert_eq!(key(&["\"k\";v=1"]), Ok(KeyHeader::Present("k".into())));
        // A comma inside a quoted key is part of the key.
        assert_eq!(key(&["\"a,b\""]), Ok(KeyHeader::Present("a,b".into())));
    }

    #[test]
    fn refuses_what_the_draft_refuses() {
        assert_eq!(key(&["a", "b"]), Err(KeyProblem::Repeated));
        // A list in one header is two keys, as two headers are.
        assert_eq!(key(&["a, b"]), Err(KeyProblem::Repeated));
        assert_eq!(key(&["a,b"]), Err(KeyProblem::Repeated));
        assert_eq!(key(&["\"a\", \"b\""]), Err(KeyProblem::Repeated));
        assert_eq!(key(&["\"a\",\"b\""]), Err(KeyProblem::Repeated));
        assert_eq!(key(&[""]), Err(KeyProblem::Empty));
        assert_eq!(key(&["\"\""]), Err(KeyProblem::Empty));
        assert_eq!(key(&[&"k".repeat(256)]), Err(KeyProblem::TooLong(256)));
        assert!(key(&[&"k".repeat(255)]).is_ok());
        assert!(matches!(key(&["\"abc"]), Err(KeyProblem::Malformed(_))));
        assert!(matches!(key(&["\"a\\x\""]), Err(KeyProblem::Malformed(_))));
        assert!(matches!(key(&["\"a\" b"]), Err(KeyProblem::Malformed(_))));
        assert!(matches!(key(&["a\"b"]), Err(KeyProblem::Malformed(_))));
    }
}
