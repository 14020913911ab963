//! How values are shown: times, sizes, durations, keys and bodies; and `--older-than` parsed.

use std::io::{self, Write};
use std::time::Duration;

use crate::model::hex::push_hex;
use crate::{Scope, Timestamp};

/// Text for people or JSON for scripts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    Text,
    Json,
}

impl Format {
    pub(crate) fn of(json: bool) -> Format {
        if json { Format::Json } else { Format::Text }
    }
}

/// Writes one JSON value on its own line.
pub(crate) fn json_line(out: &mut impl Write, value: &serde_json::Value) -> io::Result<()> {
    writeln!(out, "{value}")
}

/// A timestamp as RFC 3339 UTC with milliseconds (`2026-12-01T18:42:07.123Z`).
pub(crate) fn time(t: Timestamp) -> String {
    let ms = t.as_millis();
    let (secs, millis) = (ms / 1000, ms % 1000);
    let days = i64::try_from(secs / 86_400).unwrap_or(i64::MAX);
    let rest = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

/// Days since 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// A duration rounded for people: `450ms`, `42s`, `6m 3s`, `2h 5m`, `3d 4h`.
pub(crate) fn duration(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0 => format!("{}ms", d.as_millis()),
        1..60 => format!("{s}s"),
        60..3600 => format!("{}m {}s", s / 60, s % 60),
        3600..86_400 => format!("{}h {}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d {}h", s / 86_400, s % 86_400 / 3600),
    }
}

/// A byte count for people: `512 B`, `1.5 KiB`, `16.0 MiB`.
pub(crate) fn bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut value = n as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// Parses `500ms`, `30s`, `5m`, `2h` or `1d` (a bare number is seconds).
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let n: u64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a duration; write 500ms, 30s, 5m, 2h or 1d"))?;
    let ms = match unit {
        "ms" => Some(n),
        "" | "s" => n.checked_mul(1000),
        "m" => n.checked_mul(60_000),
        "h" => n.checked_mul(3_600_000),
        "d" => n.checked_mul(86_400_000),
        _ => {
            return Err(format!(
                "`{text}`: unknown unit `{unit}`; use ms, s, m, h or d"
            ));
        }
    };
    ms.map(Duration::from_millis)
        .ok_or_else(|| format!("`{text}` is too long a duration"))
}

/// Bytes as text when they are printable UTF-8, else as `0x` and hex.
pub(crate) fn text_or_hex(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(text)
            if !text
                .chars()
                .any(|c| c.is_control() && c != '\n' && c != '\t' && c != '\r') =>
        {
            text.to_owned()
        }
        _ => hex(bytes),
    }
}

/// `0x` and lowercase hex.
pub(crate) fn hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(2 + bytes.len() * 2);
    out.push_str("0x");
    push_hex(&mut out, bytes);
    out
}

/// Whether a body is shown whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Length {
    /// Cut at [`TRUNCATE_AT`] bytes.
    Truncated,
    /// Whole (`--full`).
    Full,
}

/// Bytes of a body shown unless `--full`.
pub(crate) const TRUNCATE_AT: usize = 1024;

/// A body as text or hex, cut at [`TRUNCATE_AT`] bytes unless `Full`; and whether it was cut.
pub(crate) fn body(bytes: &[u8], length: Length) -> (String, bool) {
    let cut = length == Length::Truncated && bytes.len() > TRUNCATE_AT;
    let shown = if cut { &bytes[..TRUNCATE_AT] } else { bytes };
    // A cut can split a UTF-8 character: drop its partial bytes rather than show hex.
    let text = match std::str::from_utf8(shown) {
        Ok(_) => text_or_hex(shown),
        Err(e) if cut && std::str::from_utf8(bytes).is_ok() => {
            text_or_hex(&shown[..e.valid_up_to()])
        }
        Err(_) => hex(shown),
    };
    (text, cut)
}

/// A scope as `tenant/operation/"key"`.
pub(crate) fn scope(scope: &Scope) -> String {
    scope.to_string()
}

/// A scope as JSON: its three parts.
pub(crate) fn scope_json(scope: &Scope) -> serde_json::Value {
    serde_json::json!({
        "tenant": scope.tenant(),
        "operation": scope.operation(),
        "key": scope.key(),
    })
}
