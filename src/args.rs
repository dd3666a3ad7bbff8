//! Parsing of the values the SEM.* commands take. Strict on purpose: what a user typed either
//! means exactly one thing or is refused, so no client's typo silently becomes a different lease.

use crate::error::SemError;

/// yrmcds's bound: a 4-byte unsigned count of permits.
pub const MAX_LIMIT: u64 = u32::MAX as u64;
/// One year (365 days): longer leases are almost certainly a unit mistake.
pub const MAX_LEASE_MS: i64 = 365 * 24 * 3600 * 1000;

/// `limit`: a decimal integer from 1 to [`MAX_LIMIT`], digits only.
pub fn parse_limit(arg: &[u8]) -> Result<u64, SemError> {
    if arg.is_empty() || arg.len() > 10 || !arg.iter().all(u8::is_ascii_digit) {
        return Err(SemError::InvalidLimit);
    }
    let value = arg
        .iter()
        .fold(0u64, |acc, d| acc * 10 + u64::from(d - b'0'));
    if (1..=MAX_LIMIT).contains(&value) {
        Ok(value)
    } else {
        Err(SemError::InvalidLimit)
    }
}

/// `lease`: seconds as `digits[.d[d[d]]]`, returned in milliseconds; greater than 0 and at most
/// [`MAX_LEASE_MS`]. No exponent, sign, or sub-millisecond digits: they would be rounded away.
pub fn parse_lease_ms(arg: &[u8]) -> Result<i64, SemError> {
    let (whole, fraction) = match arg.iter().position(|&b| b == b'.') {
        Some(dot) => (&arg[..dot], &arg[dot + 1..]),
        None => (arg, &[][..]),
    };
    let digits_only = |s: &[u8]| s.iter().all(u8::is_ascii_digit);
    let has_dot = whole.len() < arg.len();
    if whole.is_empty()
        || whole.len() > 9
        || !digits_only(whole)
        || !digits_only(fraction)
        || fraction.len() > 3
        || (has_dot && fraction.is_empty())
    {
        return Err(SemError::InvalidLease);
    }
    let seconds = whole
        .iter()
        .fold(0i64, |acc, d| acc * 10 + i64::from(d - b'0'));
    let millis = (0..3).fold(0i64, |acc, i| {
        acc * 10 + fraction.get(i).map_or(0, |d| i64::from(d - b'0'))
    });
    let lease_ms = seconds * 1000 + millis;
    if (1..=MAX_LEASE_MS).contains(&lease_ms) {
        Ok(lease_ms)
    } else {
        Err(SemError::InvalidLease)
    }
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
            ("4294967295", Some(4_294_967_295)),
            ("4294967296", None),
            ("9999999999", None),
            ("10000000000", None),
            ("0", None),
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
            ("1.05", Some(1050)),
            ("31536000", Some(MAX_LEASE_MS)),
            ("31536000.000", Some(MAX_LEASE_MS)),
            ("31536000.001", None),
            ("999999999", None),
            ("9999999999", None),
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
        ];
        for (input, want) in table {
            let got = parse_lease_ms(input.as_bytes()).ok();
            assert_eq!(got, *want, "lease {input:?}");
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
