//! Parsing of the values the SEM.* commands take, and of the counter they keep. Strict on
//! purpose: what a user typed either means exactly one thing or is refused, so no client's typo
//! silently becomes a different lease. One rule each:
//! - `limit`: decimal digits only, leading zeros allowed, value from 1 to [`MAX_LIMIT`];
//! - `COUNT n`: as `limit`, and for an acquire at most its limit;
//! - `lease`: decimal digits, optionally `.` and one to three more (milliseconds), leading zeros
//!   allowed, value greater than 0 and at most [`MAX_LEASE_MS`];
//! - `WAIT seconds`: as `lease`, and 0 (wait without limit) allowed;
//! - `<name>:counter`: an integer in Redis's own syntax (what INCR reads and writes: no sign, no
//!   leading zero, no spaces) from 0 to [`MAX_TICKET`].

use crate::error::SemError;
use crate::types::{MAX_LEASE_MS, MAX_LIMIT, MAX_TICKET};

/// The value of a run of ASCII digits, saturating (any value past `u64::MAX` is out of every
/// range here); `None` unless `digits` is non-empty and digits only.
fn decimal(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(digits.iter().fold(0u64, |acc, d| {
        acc.saturating_mul(10).saturating_add(u64::from(d - b'0'))
    }))
}

/// `limit`: see the module documentation.
pub fn parse_limit(arg: &[u8]) -> Result<u64, SemError> {
    decimal(arg)
        .filter(|value| (1..=MAX_LIMIT).contains(value))
        .ok_or(SemError::InvalidLimit)
}

/// `SEM.LIMIT name n`: as `limit`, and 0 (which pauses the semaphore) too.
pub fn parse_stored_limit(arg: &[u8]) -> Result<u64, SemError> {
    decimal(arg)
        .filter(|value| *value <= MAX_LIMIT)
        .ok_or(SemError::InvalidStoredLimit)
}

/// `COUNT n` of an acquire: as `limit`, and at most `limit`.
pub fn parse_count(arg: &[u8], limit: u64) -> Result<u64, SemError> {
    parse_limit(arg)
        .ok()
        .filter(|&count| count <= limit)
        .ok_or(SemError::InvalidCount)
}

/// `COUNT k` of a release: as `limit`.
pub fn parse_release_count(arg: &[u8]) -> Result<u64, SemError> {
    parse_limit(arg).map_err(|_| SemError::InvalidReleaseCount)
}

/// `lease`, in milliseconds, at most `max_ms` (`sem.max-lease`): see the module
/// documentation.
pub fn parse_lease_ms(arg: &[u8], max_ms: i64) -> Result<i64, SemError> {
    seconds_ms(arg)
        .filter(|&ms| (1..=max_ms as u64).contains(&ms))
        .map(|ms| ms as i64)
        .ok_or(SemError::InvalidLease { max_ms })
}

/// `WAIT seconds`, in milliseconds: the lease rule, and 0 (wait without limit) allowed.
pub fn parse_wait_ms(arg: &[u8]) -> Result<i64, SemError> {
    seconds_ms(arg)
        .filter(|&ms| ms <= MAX_LEASE_MS as u64)
        .map(|ms| ms as i64)
        .ok_or(SemError::InvalidWait)
}

/// The timeout of `SEM.WAITEMPTY`, as `WAIT`'s: 0 waits without limit.
pub fn parse_timeout_ms(arg: &[u8]) -> Result<i64, SemError> {
    parse_wait_ms(arg).map_err(|_| SemError::InvalidTimeout)
}

/// `digits[.d[d[d]]]` seconds in milliseconds, saturating; `None` if malformed.
fn seconds_ms(arg: &[u8]) -> Option<u64> {
    let (whole, fraction) = match arg.iter().position(|&b| b == b'.') {
        Some(dot) => (&arg[..dot], Some(&arg[dot + 1..])),
        None => (arg, None),
    };
    let seconds = decimal(whole)?;
    let millis = match fraction {
        None => 0,
        Some(f) if (1..=3).contains(&f.len()) => decimal(f)? * [100, 10, 1][f.len() - 1],
        Some(_) => return None,
    };
    Some(seconds.saturating_mul(1000).saturating_add(millis))
}

/// `<name>:counter`: see the module documentation.
pub fn parse_counter(value: &[u8]) -> Result<u64, SemError> {
    redis_integer(value, 0, MAX_TICKET).ok_or(SemError::CounterNotInteger)
}

/// An integer in Redis's syntax (no sign, no leading zero, no spaces) from `min` to `max`.
fn redis_integer(value: &[u8], min: u64, max: u64) -> Option<u64> {
    let canonical = value == b"0" || value.first().is_some_and(|&d| (b'1'..=b'9').contains(&d));
    decimal(value).filter(|n| canonical && value.len() <= 20 && (min..=max).contains(n))
}

/// A holder's field of `<name>:permits`: the module writes only counts of 2 or more (a holder of
/// one permit has no field), at most [`MAX_LIMIT`].
pub fn parse_weight(value: &[u8]) -> Result<u64, SemError> {
    redis_integer(value, 2, MAX_LIMIT).ok_or(SemError::PermitsCorrupt)
}

/// The `""` field of `<name>:permits`: the permits held beyond one per holder. Less than
/// [`MAX_LIMIT`]: a weighted grant fits its permits under a limit of at most that.
pub fn parse_extra(value: &[u8]) -> Result<u64, SemError> {
    redis_integer(value, 0, MAX_LIMIT).ok_or(SemError::PermitsCorrupt)
}

/// A semaphore name or an identifier: any bytes but the empty string.
pub fn non_empty(arg: &[u8], err: SemError) -> Result<&[u8], SemError> {
    if arg.is_empty() {
        Err(err)
    } else {
        Ok(arg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits() {
        let table: &[(&str, Option<u64>)] = &[
            ("1", Some(1)),
            ("3", Some(3)),
            ("007", Some(7)),
            ("00000000001", Some(1)),
            ("4294967295", Some(4_294_967_295)),
            ("0004294967295", Some(4_294_967_295)),
            ("4294967296", None),
            ("9999999999", None),
            ("99999999999999999999999999", None),
            ("0", None),
            ("000", None),
            ("", None),
            ("-1", None),
            ("+1", None),
            (" 1", None),
            ("1.0", None),
            ("1e3", None),
            ("abc", None),
        ];
        for (input, want) in table {
            let got = parse_limit(input.as_bytes()).ok();
            assert_eq!(got, *want, "limit {input:?}");
        }
    }

    #[test]
    fn leases() {
        let table: &[(&str, Option<i64>)] = &[
            ("1", Some(1000)),
            ("10", Some(10_000)),
            ("0.25", Some(250)),
            ("0.5", Some(500)),
            ("0.001", Some(1)),
            ("000000000.001", Some(1)),
            ("0000000000.001", Some(1)),
            ("007", Some(7000)),
            ("1.05", Some(1050)),
            ("31536000", Some(MAX_LEASE_MS)),
            ("31536000.000", Some(MAX_LEASE_MS)),
            ("031536000.0", Some(MAX_LEASE_MS)),
            ("31536000.001", None),
            ("999999999", None),
            ("99999999999999999999999", None),
            ("0", None),
            ("0.000", None),
            ("0.0001", None),
            ("1.", None),
            (".5", None),
            ("", None),
            ("-1", None),
            ("+1", None),
            ("1e3", None),
            ("inf", None),
            ("nan", None),
            ("1.2.3", None),
            ("1 ", None),
            ("1.-5", None),
        ];
        for (input, want) in table {
            let got = parse_lease_ms(input.as_bytes(), MAX_LEASE_MS).ok();
            assert_eq!(got, *want, "lease {input:?}");
        }
    }

    #[test]
    fn leases_obey_the_configured_maximum() {
        assert_eq!(parse_lease_ms(b"60", 60_000), Ok(60_000));
        assert_eq!(
            parse_lease_ms(b"60.001", 60_000),
            Err(SemError::InvalidLease { max_ms: 60_000 })
        );
    }

    #[test]
    fn counts() {
        assert_eq!(parse_count(b"4", 10), Ok(4));
        assert_eq!(parse_count(b"10", 10), Ok(10));
        assert_eq!(parse_count(b"11", 10), Err(SemError::InvalidCount));
        assert_eq!(parse_count(b"0", 10), Err(SemError::InvalidCount));
        assert_eq!(parse_count(b"-1", 10), Err(SemError::InvalidCount));
        assert_eq!(parse_release_count(b"4294967295"), Ok(4_294_967_295));
        assert_eq!(
            parse_release_count(b"0"),
            Err(SemError::InvalidReleaseCount)
        );
    }

    #[test]
    fn waits() {
        let table: &[(&str, Option<i64>)] = &[
            ("0", Some(0)),
            ("0.000", Some(0)),
            ("0.5", Some(500)),
            ("10", Some(10_000)),
            ("31536000", Some(MAX_LEASE_MS)),
            ("31536000.001", None),
            ("-1", None),
            ("", None),
            ("soon", None),
            ("1e3", None),
        ];
        for (input, want) in table {
            assert_eq!(
                parse_wait_ms(input.as_bytes()).ok(),
                *want,
                "wait {input:?}"
            );
        }
    }

    #[test]
    fn counters_follow_redis_integer_syntax_up_to_two_to_the_53() {
        let table: &[(&str, Option<u64>)] = &[
            ("0", Some(0)),
            ("7", Some(7)),
            ("9007199254740992", Some(MAX_TICKET)),
            ("9007199254740993", None),
            ("18446744073709551616", None),
            ("99999999999999999999999", None),
            ("007", None),
            ("00", None),
            ("-5", None),
            ("-0", None),
            ("+5", None),
            ("5 ", None),
            ("abc", None),
            ("", None),
            ("1.0", None),
        ];
        for (input, want) in table {
            let got = parse_counter(input.as_bytes()).ok();
            assert_eq!(got, *want, "counter {input:?}");
        }
    }

    #[test]
    fn permits_fields_hold_only_what_the_module_writes() {
        for (input, want) in [("2", Some(2)), ("4294967295", Some(4_294_967_295))] {
            assert_eq!(parse_weight(input.as_bytes()).ok(), want, "{input}");
        }
        for input in ["0", "1", "-3", "4294967296", "x", "", "02"] {
            assert_eq!(
                parse_weight(input.as_bytes()),
                Err(SemError::PermitsCorrupt),
                "{input}"
            );
        }
        assert_eq!(parse_extra(b"0"), Ok(0));
        assert_eq!(parse_extra(b"4294967295"), Ok(4_294_967_295));
        for input in [
            "-1",
            "4294967296",
            "9223372036854775808",
            "18446744073709551615",
            "99999999999999999999",
        ] {
            assert_eq!(
                parse_extra(input.as_bytes()),
                Err(SemError::PermitsCorrupt),
                "{input}"
            );
        }
    }

    #[test]
    fn empty_names_are_refused() {
        assert_eq!(
            non_empty(b"", SemError::EmptyName),
            Err(SemError::EmptyName)
        );
        assert_eq!(non_empty(b"x", SemError::EmptyName), Ok(&b"x"[..]));
    }
}
