//! The settings every backend's builder takes (how long claims and records last, what a request
//! may store), each checked by one rule: a `Store` and a `PgStore` refuse the same values with
//! the same words.

use std::time::Duration;

use crate::model::invalid::InvalidSetting;
use crate::model::limits::{MAX_CHECKPOINT_BYTES, MAX_LEASE, MAX_RESPONSE_BYTES, MAX_TTL};

/// The shortest lease and TTL: a millisecond, the unit records keep time in.
const MIN_DURATION: Duration = Duration::from_millis(1);
/// The smallest response cap: a response's headers alone may need most of it.
const MIN_RESPONSE_BYTES: usize = 1024;

/// What every backend's builder holds, with the defaults both document.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Settings {
    pub(crate) ttl: Duration,
    pub(crate) tombstone_ttl: Duration,
    pub(crate) lease: Duration,
    pub(crate) max_response_bytes: usize,
    pub(crate) max_checkpoint_bytes: usize,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            ttl: Duration::from_secs(24 * 3600),
            tombstone_ttl: Duration::ZERO,
            lease: Duration::from_secs(30),
            max_response_bytes: 1024 * 1024,
            max_checkpoint_bytes: 64 * 1024,
        }
    }
}

impl Settings {
    /// The first setting out of its range, in the order of the fields.
    pub(crate) fn validate(&self) -> Result<(), InvalidSetting> {
        if !(MIN_DURATION..=MAX_TTL).contains(&self.ttl) {
            return invalid(
                "ttl",
                format!("{:?} is outside 1 ms ..= 3650 days", self.ttl),
            );
        }
        if self.tombstone_ttl > MAX_TTL {
            return invalid(
                "tombstone_ttl",
                format!("{:?} is over 3650 days", self.tombstone_ttl),
            );
        }
        if !lease_in_range(self.lease) {
            return invalid(
                "lease",
                format!("{:?} is outside 1 ms ..= 7 days", self.lease),
            );
        }
        if !(MIN_RESPONSE_BYTES..=MAX_RESPONSE_BYTES).contains(&self.max_response_bytes) {
            return invalid(
                "max_response_bytes",
                format!("{} is outside 1 KiB ..= 64 MiB", self.max_response_bytes),
            );
        }
        if self.max_checkpoint_bytes > MAX_CHECKPOINT_BYTES {
            return invalid(
                "max_checkpoint_bytes",
                format!("{} is over 16 MiB", self.max_checkpoint_bytes),
            );
        }
        Ok(())
    }
}

/// The one lease rule, for a store's setting and for a lease a holder asks for later
/// (`extend`): at least a millisecond, at most [`MAX_LEASE`].
pub(crate) fn lease_in_range(lease: Duration) -> bool {
    (MIN_DURATION..=MAX_LEASE).contains(&lease)
}

fn invalid(setting: &'static str, reason: String) -> Result<(), InvalidSetting> {
    Err(InvalidSetting { setting, reason })
}

#[cfg(test)]
mod tests {
    use super::{Settings, lease_in_range};
    use std::time::Duration;

    #[test]
    fn each_setting_is_refused_out_of_its_range_and_named() {
        assert!(Settings::default().validate().is_ok());
        type Spoil = fn(&mut Settings);
        let cases: [(&str, Spoil); 6] = [
            ("ttl", |s| s.ttl = Duration::from_micros(500)),
            ("tombstone_ttl", |s| {
                s.tombstone_ttl = Duration::from_secs(3651 * 24 * 3600)
            }),
            ("lease", |s| s.lease = Duration::from_micros(500)),
            ("lease", |s| s.lease = Duration::from_secs(8 * 24 * 3600)),
            ("max_response_bytes", |s| s.max_response_bytes = 1023),
            ("max_checkpoint_bytes", |s| {
                s.max_checkpoint_bytes = 17 * 1024 * 1024
            }),
        ];
        for (name, spoil) in cases {
            let mut settings = Settings::default();
            spoil(&mut settings);
            assert_eq!(settings.validate().map_err(|e| e.setting), Err(name));
        }
    }

    #[test]
    fn a_lease_is_a_millisecond_to_seven_days() {
        assert!(!lease_in_range(Duration::ZERO));
        assert!(!lease_in_range(Duration::from_micros(999)));
        assert!(lease_in_range(Duration::from_millis(1)));
        assert!(lease_in_range(Duration::from_secs(7 * 24 * 3600)));
        assert!(!lease_in_range(
            Duration::from_secs(7 * 24 * 3600) + Duration::from_millis(1)
        ));
    }
}
