//! RFC 8785 JSON Canonicalization Scheme: the bytes a JSON body is fingerprinted by, so that
//! key order and whitespace do not make a retry look like a different request.
//!
//! Object members are sorted by their names' UTF-16 code units, nothing is inserted between
//! tokens, strings are escaped minimally, and numbers are written as ECMAScript writes a double.
//! One deliberate difference: an integer that fits 64 bits is written with all its digits, where
//! RFC 8785 would round one outside ±2^53 to the nearest double; two different amounts in minor
//! units never share a fingerprint. Larger numbers and fractions follow the RFC (nearest double).
//!
//! RFC 8785 takes I-JSON (RFC 7493) as input, which forbids an object naming a member twice.
//! serde_json would keep the last of the two silently, so `{"amount":1,"amount":900}` and
//! `{"amount":900}` would canonicalize alike; here such a body has no canonical form and is
//! fingerprinted by its bytes instead.

use std::fmt::{self, Write as _};

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

/// The canonical form of `json`, or `None` if it is not I-JSON (not JSON, a member named twice,
/// a number that cannot be read as a double).
#[cfg(test)]
pub(crate) fn canonical(json: &[u8]) -> Option<Vec<u8>> {
    canonical_without(json, &[])
}

/// The canonical form of `json` with the members and elements that `pointers` (RFC 6901 JSON
/// pointers, `/metadata/client_timestamp`) name left out; a pointer that names nothing leaves
/// nothing out. `None` if it is not I-JSON (not JSON, a member named twice, a number that
/// cannot be read as a double).
pub(crate) fn canonical_without(json: &[u8], pointers: &[String]) -> Option<Vec<u8>> {
    let Strict(mut value) = serde_json::from_slice(json).ok()?;
    for pointer in pointers {
        remove(&mut value, pointer);
    }
    let mut out = String::with_capacity(json.len());
    write_value(&mut out, &value).ok()?;
    Some(out.into_bytes())
}

/// Removes what `pointer` names from `value`, if anything.
fn remove(value: &mut Value, pointer: &str) {
    let Some((parent, last)) = pointer.rsplit_once('/') else {
        return;
    };
    // RFC 6901 escapes: `~1` is `/`, `~0` is `~`, in that order.
    let last = last.replace("~1", "/").replace("~0", "~");
    match value.pointer_mut(parent) {
        Some(Value::Object(members)) => {
            members.remove(&last);
        }
        Some(Value::Array(items)) => {
            if let Ok(i) = last.parse::<usize>()
                && i < items.len()
            {
                items.remove(i);
            }
        }
        _ => {}
    }
}

/// A number with no double value: serde_json's `arbitrary_precision` (enabled by another crate
/// through feature unification) keeps numbers as text, and one out of range has no double.
struct NotCanonical;

/// A JSON value parsed with duplicate member names refused.
struct Strict(Value);

impl<'de> Deserialize<'de> for Strict {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(StrictVisitor).map(Strict)
    }
}

struct StrictVisitor;

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value whose objects name each member once")
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_bool<E>(self, b: bool) -> Result<Value, E> {
        Ok(Value::Bool(b))
    }

    fn visit_i64<E>(self, i: i64) -> Result<Value, E> {
        Ok(Value::Number(i.into()))
    }

    fn visit_u64<E>(self, u: u64) -> Result<Value, E> {
        Ok(Value::Number(u.into()))
    }

    fn visit_f64<E: de::Error>(self, f: f64) -> Result<Value, E> {
        Number::from_f64(f)
            .map(Value::Number)
            .ok_or_else(|| E::custom("a number that is not finite"))
    }

    fn visit_str<E>(self, s: &str) -> Result<Value, E> {
        Ok(Value::String(s.to_owned()))
    }

    fn visit_string<E>(self, s: String) -> Result<Value, E> {
        Ok(Value::String(s))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(Strict(item)) = seq.next_element()? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut members = Map::new();
        while let Some(name) = map.next_key::<String>()? {
            let Strict(member) = map.next_value()?;
            if members.insert(name, member).is_some() {
                return Err(de::Error::custom("an object names a member twice"));
            }
        }
        Ok(Value::Object(members))
    }
}

fn write_value(out: &mut String, value: &Value) -> Result<(), NotCanonical> {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => write_number(out, n)?,
        Value::String(s) => write_string(out, s),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_value(out, item)?;
            }
            out.push(']');
        }
        Value::Object(members) => {
            let mut sorted: Vec<(&String, &Value)> = members.iter().collect();
            sorted.sort_by(|(a, _), (b, _)| a.encode_utf16().cmp(b.encode_utf16()));
            out.push('{');
            for (i, (name, member)) in sorted.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(out, name);
                out.push(':');
                write_value(out, member)?;
            }
            out.push('}');
        }
    }
    Ok(())
}

fn write_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\u{c}' => out.push_str("\\f"),
            '\r' => out.push_str("\\r"),
            c if c < ' ' => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn write_number(out: &mut String, n: &Number) -> Result<(), NotCanonical> {
    if let Some(i) = n.as_i64() {
        let _ = write!(out, "{i}");
    } else if let Some(u) = n.as_u64() {
        let _ = write!(out, "{u}");
    } else {
        write_double(out, n.as_f64().ok_or(NotCanonical)?);
    }
    Ok(())
}

/// ECMAScript's Number::toString for a finite double.
fn write_double(out: &mut String, f: f64) {
    if f == 0.0 {
        out.push('0');
        return;
    }
    if f < 0.0 {
        out.push('-');
    }
    // Shortest round-trip digits and exponent: "1.2345e3" is 12345 with the point after 1.
    let sci = format!("{:e}", f.abs());
    let (mantissa, exponent) = sci.split_once('e').unwrap_or((&sci, "0"));
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let exponent: i32 = exponent.parse().unwrap_or(0);
    let k = digits.len() as i32;
    let n = exponent + 1; // where the decimal point goes, counted from the first digit
    if k <= n && n <= 21 {
        out.push_str(&digits);
        out.extend(std::iter::repeat_n('0', (n - k) as usize));
    } else if 0 < n && n <= 21 {
        out.push_str(&digits[..n as usize]);
        out.push('.');
        out.push_str(&digits[n as usize..]);
    } else if -6 < n && n <= 0 {
        out.push_str("0.");
        out.extend(std::iter::repeat_n('0', (-n) as usize));
        out.push_str(&digits);
    } else {
        out.push_str(&digits[..1]);
        if k > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let _ = write!(
            out,
            "e{}{}",
            if n - 1 > 0 { "+" } else { "-" },
            (n - 1).abs()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canon(s: &str) -> String {
        String::from_utf8(canonical(s.as_bytes()).expect("valid JSON")).expect("UTF-8")
    }

    #[test]
    fn key_order_and_whitespace_do_not_matter() {
        let a = canon(r#"{ "amount": 1900, "currency": "eur", "meta": {"b": 2, "a": [1, 2]} }"#);
        let b = canon(r#"{"meta":{"a":[1,2],"b":2},"currency":"eur","amount":1900}"#);
        assert_eq!(a, b);
        assert_eq!(
            a,
            r#"{"amount":1900,"currency":"eur","meta":{"a":[1,2],"b":2}}"#
        );
    }

    #[test]
    fn numbers_are_written_as_ecmascript_writes_them() {
        // From RFC 8785's examples and ECMAScript's rules.
        for (input, expected) in [
            ("1.0", "1"),
            ("1e2", "100"),
            ("4.50", "4.5"),
            ("2e-3", "0.002"),
            ("0.000001", "0.000001"),
            ("1e-7", "1e-7"),
            ("1e21", "1e+21"),
            ("123456789012345680000.0", "123456789012345680000"),
            ("-0.0", "0"),
            ("-1.5e-10", "-1.5e-10"),
            ("333333333.33333329", "333333333.3333333"),
        ] {
            assert_eq!(canon(input), expected, "{input}");
        }
        // Large integers keep every digit.
        assert_eq!(canon("9007199254740993"), "9007199254740993");
    }

    #[test]
    fn strings_are_escaped_minimally_and_sorted_by_utf16() {
        assert_eq!(canon(r#""\u0041\u00e9\n\u001f\/""#), "\"Aé\\n\\u001f/\"");
        // U+10000 sorts after U+E000 in UTF-8 but before it in UTF-16 (a surrogate pair,
        // 0xD800 0xDC00): members are ordered by UTF-16 code units.
        assert_eq!(
            canon("{\"\u{e000}\":2,\"\u{10000}\":1}"),
            "{\"\u{10000}\":1,\"\u{e000}\":2}"
        );
        assert_eq!(canonical(b"{not json"), None);
        let left_out = |json: &str, pointers: &[&str]| {
            let pointers: Vec<String> = pointers.iter().map(|p| (*p).to_owned()).collect();
            canonical_without(json.as_bytes(), &pointers)
                .map(|b| String::from_utf8_lossy(&b).into_owned())
        };
        assert_eq!(
            left_out(
                r#"{"a":1,"m":{"ts":5,"k":"v"},"l":[1,2,3]}"#,
                &["/m/ts", "/l/1", "/none/x"]
            ),
            Some(r#"{"a":1,"l":[1,3],"m":{"k":"v"}}"#.to_owned())
        );
        assert_eq!(
            left_out(r#"{"a/b":1,"c~d":2,"e":3}"#, &["/a~1b", "/c~0d"]),
            Some(r#"{"e":3}"#.to_owned())
        );
    }

    #[test]
    fn a_member_named_twice_has_no_canonical_form() {
        assert_eq!(canonical(br#"{"amount":1,"amount":900}"#), None);
        assert_eq!(canonical(br#"[{"a":{"b":1,"b":1}}]"#), None);
        // The same name in different objects is fine.
        assert_eq!(
            canon(r#"{"a":{"b":1},"b":{"b":2}}"#),
            r#"{"a":{"b":1},"b":{"b":2}}"#
        );
        // Out of the double range: no canonical form (serde_json refuses it).
        assert_eq!(canonical(b"1e400"), None);
        assert_eq!(
            canon("[null,true,false,-7,\"s\"]"),
            "[null,true,false,-7,\"s\"]"
        );
    }
}
