//! Fencing tickets that never repeat, even after a failover or a restart that lost the last
//! grants, and even when the node taking over is several terms behind.
//!
//! With asynchronous replication a primary may acknowledge fair grants that never reach its
//! replica (or its AOF) before it dies; the node that takes over holds an older counter, so its
//! own data cannot tell how far the tickets went, and neither can a node that restarted with
//! nothing to load. The wall clock can: whenever this node's data may be behind what clients
//! were told (the module loaded, the node finished loading data, or it became a primary), it
//! takes a floor, the Unix time in milliseconds × [`TICKETS_PER_MS`], and every fair grant hands
//! out `max(counter + 1, floor)`. Tickets handed out since an earlier floor stay below this one
//! as long as no name took more than [`TICKETS_PER_MS`] grants per millisecond on average since
//! then (and the clocks agree within the headroom that leaves). One number per node, whatever the
//! number of names; the grant writes the counter as always, so replicas and the AOF follow it.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::SemError;
use crate::types::MAX_TICKET;

/// The floor's scale: a floor is the clock in microseconds. A name may take up to 1,000 fair
/// grants per millisecond on average between two floors, and floors stay below 2^53 (exact in a
/// double, and in JavaScript) until the year 2255.
pub const TICKETS_PER_MS: u64 = 1000;

/// This node's floor, taken first when the module loads; 0 only outside a server (unit tests).
static FLOOR: AtomicU64 = AtomicU64::new(0);

/// The floor a node takes at `now_ms` (Unix milliseconds).
pub fn floor_at(now_ms: i64) -> u64 {
    u64::try_from(now_ms)
        .unwrap_or(0)
        .saturating_mul(TICKETS_PER_MS)
}

/// This node's data may be behind what clients were told: tickets go on from the floor of
/// `now_ms` at least. A clock that stepped back never lowers the floor.
pub fn take_floor(now_ms: i64) {
    FLOOR.fetch_max(floor_at(now_ms), Ordering::Relaxed);
}

/// The floor every fair grant's ticket must reach.
pub fn floor() -> u64 {
    FLOOR.load(Ordering::Relaxed)
}

/// Forgets the floor (a new load of the module, which takes one again at once).
pub fn reset() {
    FLOOR.store(0, Ordering::Relaxed);
}

/// The ticket of a fair grant after `counter` (0 when there is none) with this node's `floor`:
/// the next one up, and at least the floor; none is left above 2^53.
pub fn next_ticket(counter: u64, floor: u64) -> Result<u64, SemError> {
    counter
        .checked_add(1)
        .map(|next| next.max(floor))
        .filter(|&ticket| ticket <= MAX_TICKET)
        .ok_or(SemError::CounterExhausted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_ticket_is_the_counter_plus_one_and_at_least_the_floor() {
        let floor = floor_at(1_764_000_000_000);
        let table: &[(u64, u64, Result<u64, SemError>)] = &[
            (0, 0, Ok(1)),
            (7, 0, Ok(8)),
            (7, floor, Ok(floor)),
            (floor - 1, floor, Ok(floor)),
            (floor, floor, Ok(floor + 1)),
            (floor + 41, floor, Ok(floor + 42)),
            (MAX_TICKET - 1, floor, Ok(MAX_TICKET)),
            (MAX_TICKET, floor, Err(SemError::CounterExhausted)),
            (MAX_TICKET, 0, Err(SemError::CounterExhausted)),
            (u64::MAX, 0, Err(SemError::CounterExhausted)),
            (0, MAX_TICKET, Ok(MAX_TICKET)),
            (0, MAX_TICKET + 1, Err(SemError::CounterExhausted)),
        ];
        for (counter, floor, want) in table {
            assert_eq!(
                &next_ticket(*counter, *floor),
                want,
                "counter {counter}, floor {floor}"
            );
        }
    }

    #[test]
    fn floors_are_the_clock_in_microseconds_and_stay_below_2_pow_53_for_centuries() {
        assert_eq!(floor_at(1_764_000_000_123), 1_764_000_000_123_000);
        assert_eq!(floor_at(-5), 0, "a clock before 1970 gives no floor");
        // 1 January 2255, 00:00 UTC.
        assert!(floor_at(8_993_721_600_000) < MAX_TICKET);
    }

    #[test]
    fn the_floor_only_grows_within_a_load() {
        reset();
        assert_eq!(floor(), 0, "no floor before the first one taken");
        take_floor(2_000);
        assert_eq!(floor(), 2_000_000);
        take_floor(1_000);
        assert_eq!(floor(), 2_000_000, "a clock stepped back keeps the floor");
        take_floor(3_000);
        assert_eq!(floor(), 3_000_000);
        reset();
        assert_eq!(floor(), 0);
    }
}
