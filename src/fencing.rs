//! Fencing tickets that never repeat: on one node, every fair ticket it hands out is above every
//! ticket it handed out before, whatever happened to the keys between; across failovers and
//! restarts, even when the node taking over is several terms behind, as long as the clocks agree.
//!
//! One number per node, the floor: every fair grant hands out `max(counter + 1, floor)`, and
//! the floor then moves past it. So a name whose counter went (a flush, a swap, a move, a
//! deletion, an expiry, an eviction, a `RESTORE` of an older one: its old holders may still use
//! their tickets) still goes on above every ticket this node handed out, even within one
//! millisecond, and with no assumption on the clock.
//!
//! With asynchronous replication a primary may acknowledge fair grants that never reach its
//! replica (or its AOF) before it dies; the node that takes over holds an older counter, so its
//! own data cannot tell how far the tickets went, and neither can a node that restarted with
//! nothing to load. The wall clock can: whenever this node's data may be behind what clients
//! were told (the module loaded, the node finished loading data, or it became a primary), its
//! floor rises to the Unix time in milliseconds × [`TICKETS_PER_MS`]; and a name with no counter
//! starts at least from the clock of its grant (a name whose counter moved in from another node
//! and was then deleted here), as the clients' script does. Tickets another node handed out stay
//! below these as long as it took no more than [`TICKETS_PER_MS`] fair grants per millisecond on
//! average since its own floor (and the clocks agree within the headroom that leaves). The grant
//! writes the counter as always, so replicas and the AOF follow it.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::SemError;
use crate::types::MAX_TICKET;

/// The floor's scale: a floor is the clock in microseconds. A name may take up to 1,000 fair
/// grants per millisecond on average between two floors, and floors stay below 2^53 (exact in a
/// double, and in JavaScript) until the year 2255.
pub const TICKETS_PER_MS: u64 = 1000;

/// This node's floor: the least ticket its next fair grant may hand out (the clock taken when
/// its data may be behind, or one past its last ticket, whichever is higher). A static: one
/// number per node, read and moved by the main thread at every fair grant (no lock, no
/// borrow); 0 only outside a server (unit tests).
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

/// How far ahead of both the floor and the clock a ticket may be and still move the floor. Only
/// a counter written by hand (or moved in from a node whose clock runs ahead) reaches further:
/// it keeps its own name's tickets above it, but cannot lift every other name's to 2^53.
pub const AHEAD_MS: u64 = 1000;

/// The floor after a grant at `now_ms` handed out `ticket` with `floor`: past the ticket, unless
/// the ticket is more than [`AHEAD_MS`] ahead of both.
pub fn past(floor: u64, ticket: u64, now_ms: i64) -> u64 {
    let reach = floor
        .max(floor_at(now_ms))
        .saturating_add(AHEAD_MS * TICKETS_PER_MS);
    if ticket >= floor && ticket < reach {
        ticket + 1
    } else {
        floor
    }
}

/// This node handed out `ticket` at `now_ms`: the floor moves past it (see [`past`]), so no
/// later grant on this node, of any name, repeats it. Only the main thread grants, so a load
/// and a store suffice.
pub fn handed_out(ticket: u64, now_ms: i64) {
    let floor = FLOOR.load(Ordering::Relaxed);
    FLOOR.store(past(floor, ticket, now_ms), Ordering::Relaxed);
}

/// Forgets the floor (a new load of the module, which takes one again at once).
pub fn reset() {
    FLOOR.store(0, Ordering::Relaxed);
}

/// The ticket of a fair grant at `now_ms` after `counter` with this node's `floor`: the next
/// one up, and at least the floor; none is left above 2^53. A name with no counter (never
/// granted, or its counter went with a flush, a swap, a move or a deletion) starts at least
/// from the clock of this grant: its counter may have come from another node, whose tickets
/// this node's floor does not cover.
pub fn next_ticket(counter: Option<u64>, floor: u64, now_ms: i64) -> Result<u64, SemError> {
    let floor = match counter {
        Some(_) => floor,
        None => floor.max(floor_at(now_ms)),
    };
    counter
        .unwrap_or(0)
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
        let now = 1_764_000_000_500;
        let at_now = floor_at(now);
        // (counter, floor, now_ms) -> the ticket
        type Row = (Option<u64>, u64, i64, Result<u64, SemError>);
        let table: &[Row] = &[
            (None, 0, 0, Ok(1)),
            (Some(0), 0, now, Ok(1)),
            (Some(7), 0, now, Ok(8)),
            (Some(7), floor, now, Ok(floor)),
            (Some(floor - 1), floor, now, Ok(floor)),
            (Some(floor), floor, now, Ok(floor + 1)),
            (Some(floor + 41), floor, now, Ok(floor + 42)),
            (Some(MAX_TICKET - 1), floor, now, Ok(MAX_TICKET)),
            (
                Some(MAX_TICKET),
                floor,
                now,
                Err(SemError::CounterExhausted),
            ),
            (Some(MAX_TICKET), 0, 0, Err(SemError::CounterExhausted)),
            (Some(u64::MAX), 0, 0, Err(SemError::CounterExhausted)),
            (Some(0), MAX_TICKET, now, Ok(MAX_TICKET)),
            (
                Some(0),
                MAX_TICKET + 1,
                now,
                Err(SemError::CounterExhausted),
            ),
            // No counter: the clock of the grant, when it is above the floor.
            (None, floor, now, Ok(at_now)),
            (None, floor, 1_000, Ok(floor)),
            (None, 0, -5, Ok(1)),
            // A counter, even one below the clock, goes on from itself.
            (Some(7), floor, now, Ok(floor)),
            (Some(floor + 3), floor, now, Ok(floor + 4)),
        ];
        for (counter, floor, now_ms, want) in table {
            assert_eq!(
                &next_ticket(*counter, *floor, *now_ms),
                want,
                "counter {counter:?}, floor {floor}, now {now_ms}"
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

        // One test: the floor is one static. A ticket handed out moves the floor past it.
        take_floor(2_000);
        // (ticket handed out, at now_ms, the floor after)
        let steps: &[(u64, i64, u64)] = &[
            (2_000_000, 2_000, 2_000_001),
            // Within the same millisecond, a name with no counter: above the last ticket.
            (2_000_001, 2_000, 2_000_002),
            // A ticket below the floor (a counter restored from elsewhere) leaves it.
            (7, 2_000, 2_000_002),
            (2_500_000, 2_000, 2_500_001),
            // Up to AHEAD_MS ahead of the floor or the clock, whichever is higher.
            (3_500_000, 2_000, 3_500_001),
            (4_599_999, 3_600, 4_600_000),
            // Further: a counter written by hand lifts its own name only.
            (5_600_000, 3_600, 4_600_000),
            (MAX_TICKET, 3_600, 4_600_000),
            (MAX_TICKET, i64::MAX, MAX_TICKET + 1),
        ];
        for &(ticket, now_ms, want) in steps {
            handed_out(ticket, now_ms);
            assert_eq!(floor(), want, "after ticket {ticket} at {now_ms}");
        }
        // The next ticket of a name whose counter went, within the same millisecond.
        reset();
        take_floor(2_000);
        let first = next_ticket(None, floor(), 2_000).unwrap();
        handed_out(first, 2_000);
        let second = next_ticket(None, floor(), 2_000).unwrap();
        assert!(second > first, "{second} after {first}");
        // ... and of a name whose counter was restored from long before.
        handed_out(second, 2_000);
        assert!(next_ticket(Some(3), floor(), 2_000).unwrap() > second);
        take_floor(1_000);
        assert_eq!(floor(), second + 1, "a clock stepped back keeps the floor");
        reset();
        assert_eq!(floor(), 0);
    }
}
