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
/// `\"` and `\\` escaped; well-formed parameters after it (`;a=1`) are allowed and ignored.
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
    parameters(&after)?;
    Ok(out)
}

/// Checks the parameters after a string item (RFC 8941, section 3.1.2): `*( ";" *SP key [ "="
/// bare-item ] )`, nothing else. They are accepted and ignored; anything malformed is refused
/// rather than guessed at.
fn parameters(mut rest: &str) -> Result<(), KeyProblem> {
    const BAD: KeyProblem = KeyProblem::Malformed("malformed parameters after the quoted key");
    while let Some(after_semicolon) = rest.strip_prefix(';') {
        let param = after_semicolon.trim_start_matches(' ');
        let key_len = param
            .char_indices()
            .find(|&(i, c)| !is_key_char(c, i == 0))
            .map_or(param.len(), |(i, _)| i);
        if key_len == 0 {
            return Err(BAD);
        }
        rest = &param[key_len..];
        if let Some(value) = rest.strip_prefix('=') {
            let used = bare_item(value).ok_or(BAD)?;
            rest = &value[used..];
        }
    }
    if rest.is_empty() { Ok(()) } else { Err(BAD) }
}

/// Whether `c` may appear in a parameter key (`first`: as its first character).
fn is_key_char(c: char, first: bool) -> bool {
    c.is_ascii_lowercase() || c == '*' || (!first && (c.is_ascii_digit() || "_-.".contains(c)))
}

/// The length of the bare item at the start of `text` (integer, decimal, string, token, byte
/// sequence or boolean), if one starts there.
fn bare_item(text: &str) -> Option<usize> {
    let bytes = text.as_bytes();
    match *bytes.first()? {
        b'"' => {
            let mut i = 1;
            loop {
                match *bytes.get(i)? {
                    b'"' => return Some(i + 1),
                    b'\\' => match *bytes.get(i + 1)? {
                        b'"' | b'\\' => i += 2,
                        _ => return None,
                    },
                    b' '..=b'~' => i += 1,
                    _ => return None,
                }
            }
        }
        b'?' => matches!(bytes.get(1), Some(b'0' | b'1')).then_some(2),
        b':' => {
            let end = bytes[1..].iter().position(|&b| b == b':')? + 1;
            bytes[1..end]
                .iter()
                .all(|&b| b.is_ascii_alphanumeric() || b"+/=".contains(&b))
                .then_some(end + 1)
        }
        b'-' | b'0'..=b'9' => {
            let sign = usize::from(bytes[0] == b'-');
            let int = bytes[sign..]
                .iter()
                .take_while(|b| b.is_ascii_digit())
                .count();
            if int == 0 || int > 15 {
                return None;
            }
            let mut end = sign + int;
            if bytes.get(end) == Some(&b'.') {
                let frac = bytes[end + 1..]
                    .iter()
                    .take_while(|b| b.is_ascii_digit())
                    .count();
                if int > 12 || frac == 0 || frac > 3 {
                    return None;
                }
                end += 1 + frac;
            }
            Some(end)
        }
        c if c.is_ascii_alphabetic() || c == b'*' => Some(
            bytes
                .iter()
                .position(|&b| !(b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~:/".contains(&b)))
                .unwrap_or(bytes.len()),
        ),
        _ => None,
    }
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

    #[test]
    fn parameters_are_checked_against_rfc_8941() {
        for ok in [
            "\"k\";a",
            "\"k\";a=1;b=?0",
            "\"k\"; a=-1.5;b=\"x\\\"y\";c=tok/en:1;d=:aGk=:;e*_.-=*",
            "\"k\";a=123456789012345",
        ] {
            assert_eq!(key(&[ok]), Ok(KeyHeader::Present("k".into())), "{ok}");
        }
        for bad in [
            "\"p1\";;;garbage",
            "\"k\";",
            "\"k\";A=1",
            "\"k\";1a=1",
            "\"k\";a=",
            "\"k\";a=?2",
            "\"k\";a=1.2345",
            "\"k\";a=1234567890123456",
            "\"k\";a=\"open",
            "\"k\";a=:not base64!:",
            "\"k\";a=1 b",
            "\"k\";a=1;",
        ] {
            assert!(
                matches!(key(&[bad]), Err(KeyProblem::Malformed(_))),
                "{bad}"
            );
        }
    }
}
