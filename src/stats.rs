//! What `INFO sem` reports: counters since the module loaded, and gauges read from the waiting
//! side when asked. A counter is one relaxed atomic add, so counting costs nothing measurable.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::waiting;

macro_rules! counters {
    ($($name:ident: $doc:literal,)*) => {
        /// Every counter, in the order INFO lists them.
        pub struct Counters {
            $(#[doc = $doc] pub $name: AtomicU64,)*
        }

        pub static COUNTERS: Counters = Counters {
            $($name: AtomicU64::new(0),)*
        };

        fn each_counter() -> Vec<(&'static str, u64)> {
            vec![$((stringify!($name), COUNTERS.$name.load(Ordering::Relaxed)),)*]
        }

        /// Sets every counter to 0. The library may stay mapped across `MODULE UNLOAD` and
        /// `MODULE LOAD`, its statics with it; counts start again at each load.
        pub fn reset() {
            $(COUNTERS.$name.store(0, Ordering::Relaxed);)*
        }
    };
}

counters! {
    acquired: "New holders granted, at once or after waiting.",
    renewed: "Acquires by an identifier that already held a live permit.",
    refused: "Acquires answered nil at once (the semaphore was full, or others waited).",
    refreshed: "Refreshes of a live holder.",
    released: "Releases of a live holder (all or part of its permits).",
    lost: "Refreshes and releases of a holder whose lease had run out.",
    expired: "Expired holders removed.",
    waits_started: "Callers that started waiting.",
    waits_granted: "Waiters granted a permit.",
    waits_timed_out: "Waits that ran out of time.",
    waits_cancelled: "Waits that ended otherwise without a permit: the client left or was \
        unblocked (CLIENT UNBLOCK), or an error answered it.",
    bound_released: "BOUND holders given back because their connection closed.",
    limits_set: "SEM.LIMIT calls that stored, changed or cleared a semaphore's limit.",
    set_acquired: "SEM.ACQUIREALL calls granted (each semaphore's grant also counts in \
        acquired or renewed).",
    set_refused: "SEM.ACQUIREALL calls answered nil: one of the semaphores was full (or had a \
        fair line to wait in); nothing changed.",
    empty_waits_started: "SEM.WAITEMPTY calls that started waiting.",
    empty_waits_emptied: "Waits for empty answered 1: the semaphore had no live holder left.",
    empty_waits_timed_out: "Waits for empty that ran out of time (answered 0).",
    empty_waits_cancelled: "Waits for empty that ended otherwise: the client left or was \
        unblocked, or an error answered it.",
    lines_served: "Wait lines looked at for a grant: after a change to that semaphore (a \
        release, a lease end, a wait that ended, another client's write), never for a read or \
        for other semaphores' changes.",
    timer_runs: "Runs of the module's timer (lease ends, wait ends, deferred work).",
    timer_runs_continued: "Timer runs that used up their time slice (2 ms) and left the rest \
        for the next turn of the event loop, after other clients were answered.",
}

/// Adds one to `counter`.
pub fn count(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// Adds `n` to `counter`.
pub fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

/// The fields of `INFO sem`: the counters, then the gauges.
pub fn fields() -> Vec<(&'static str, u64)> {
    let mut fields = each_counter();
    fields.extend(waiting::gauges());
    fields
}
