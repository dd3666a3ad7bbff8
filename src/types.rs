//! The vocabulary every other module shares: the two kinds of semaphore and the bounds of the
//! values the commands take or keep. A leaf, so parsing, rules and errors can all use it.

/// yrmcds's bound: a 4-byte unsigned count of permits.
pub const MAX_LIMIT: u64 = u32::MAX as u64;
/// One year (365 days): longer leases are almost certainly a unit mistake.
pub const MAX_LEASE_MS: i64 = 365 * 24 * 3600 * 1000;
/// Sorted-set scores are doubles: every integer up to 2^53 is exact, the next one is not.
pub const MAX_TICKET: u64 = 1 << 53;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Granted while fewer than `limit` holders are live.
    Plain,
    /// Also hands each grant the next ticket of `<name>:counter`, recorded in `<name>:owner`.
    Fair,
}

/// Whether a sorted-set score is a ticket: a whole number from 1 to [`MAX_TICKET`].
pub fn ticket_from_score(score: f64) -> Option<u64> {
    (score >= 1.0 && score <= MAX_TICKET as f64 && score.fract() == 0.0).then_some(score as u64)
}

/// A holder's deadline in whole Unix milliseconds, rounded up: with `now` a whole number,
/// `now < deadline_ms(score)` exactly when `now < score`. Scores no deadline could be (the
/// infinities, foreign values) saturate, so arithmetic on them cannot overflow.
pub fn deadline_ms(score: f64) -> i64 {
    score.ceil() as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tickets_are_whole_numbers_from_one_to_two_to_the_53() {
        let table: &[(f64, Option<u64>)] = &[
            (1.0, Some(1)),
            (42.0, Some(42)),
            (9_007_199_254_740_992.0, Some(MAX_TICKET)),
            (9_007_199_254_740_994.0, None),
            (0.0, None),
            (-5.0, None),
            (1.5, None),
            (f64::INFINITY, None),
            (f64::NEG_INFINITY, None),
            (1e300, None),
            (9_223_372_036_854_775_808.0, None),
        ];
        for &(score, want) in table {
            assert_eq!(ticket_from_score(score), want, "{score}");
        }
    }

    #[test]
    fn deadlines_round_up_and_saturate() {
        assert_eq!(deadline_ms(1000.0), 1000);
        assert_eq!(deadline_ms(1000.25), 1001);
        assert_eq!(deadline_ms(f64::INFINITY), i64::MAX);
        assert_eq!(deadline_ms(f64::NEG_INFINITY), i64::MIN);
        assert_eq!(deadline_ms(1e300), i64::MAX);
    }
}
