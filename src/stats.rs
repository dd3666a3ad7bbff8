//! What `INFO sem` reports: counters since the module loaded, gauges read from the waiting
//! side when asked, and two latency distributions in the style of Redis's `INFO latencystats`:
//! how long waiting acquires waited for their grant, and how long holders held their permits
//! until they released them. A counter is one relaxed atomic add, a distribution one more, so
//! counting costs nothing measurable; both distributions are fixed-size histograms, and hold
//! times are kept in a fixed table (sampled while more holders live than it has slots).

use std::hash::Hasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::queue::IdHasher;

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
            COMMANDS_PROCESSED.store(0, Ordering::Relaxed);
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
    waits_refused_memory: "Callers refused a wait because waiting clients would take more \
        memory than the module allows (sem.waiters-maxmemory-percent, sem.max-waiters-memory) \
        or the server had no room left below maxmemory.",
    evicted_keys: "Keys of semaphores the server evicted (maxmemory-policy): derived keys by \
        their names, and names clients waited on.",
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

/// The counters, as `INFO sem` lists them first.
pub fn counters() -> Vec<(&'static str, u64)> {
    each_counter()
}

/// Exact below this many microseconds; above, [`SUB_BUCKETS`] buckets per power of two.
const LINEAR: u64 = 64;
const SUB_BUCKETS: u64 = 32;
/// Powers of two above [`LINEAR`] covered: up to 2^40 µs (12 days); longer lands in the last.
const OCTAVES: u64 = 34;
const BUCKETS: usize = (LINEAR + SUB_BUCKETS * OCTAVES) as usize;

/// A histogram of durations in microseconds, within about 3 % (as `hdr_histogram` with two
/// significant digits): fixed in size whatever it counts.
pub struct Histogram {
    buckets: [AtomicU64; BUCKETS],
    count: AtomicU64,
}

#[allow(clippy::declare_interior_mutable_const)] // only to fill the arrays below
const ZERO: AtomicU64 = AtomicU64::new(0);

/// From a waiting acquire's arrival to its grant.
pub static WAIT_TIME: Histogram = Histogram {
    buckets: [ZERO; BUCKETS],
    count: AtomicU64::new(0),
};
/// From a grant to the release of its permits.
pub static HOLD_TIME: Histogram = Histogram {
    buckets: [ZERO; BUCKETS],
    count: AtomicU64::new(0),
};

fn bucket_of(us: u64) -> usize {
    if us < LINEAR {
        return us as usize;
    }
    let octave = 63 - u64::from(us.leading_zeros()); // 6 and up
    let sub = (us >> (octave - 5)) & (SUB_BUCKETS - 1);
    let at = LINEAR + (octave - 6) * SUB_BUCKETS + sub;
    (at as usize).min(BUCKETS - 1)
}

/// The largest value that lands in bucket `at`.
fn bucket_top(at: usize) -> u64 {
    let at = at as u64;
    if at < LINEAR {
        return at;
    }
    let octave = (at - LINEAR) / SUB_BUCKETS + 6;
    let sub = (at - LINEAR) % SUB_BUCKETS;
    ((SUB_BUCKETS + sub + 1) << (octave - 5)) - 1
}

impl Histogram {
    pub fn record(&self, duration: Duration) {
        let us = u64::try_from(duration.as_micros()).unwrap_or(u64::MAX);
        self.buckets[bucket_of(us)].fetch_add(1, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    pub fn reset(&self) {
        for bucket in &self.buckets {
            bucket.store(0, Ordering::Relaxed);
        }
        self.count.store(0, Ordering::Relaxed);
    }

    /// The value (µs) at or below which `quantile` of the recorded ones are; 0 when empty.
    pub fn quantile_us(&self, quantile: f64) -> u64 {
        let count = self.count.load(Ordering::Relaxed);
        if count == 0 {
            return 0;
        }
        let wanted = ((quantile * count as f64).ceil() as u64).clamp(1, count);
        let mut seen = 0;
        for (at, bucket) in self.buckets.iter().enumerate() {
            seen += bucket.load(Ordering::Relaxed);
            if seen >= wanted {
                return bucket_top(at);
            }
        }
        bucket_top(BUCKETS - 1)
    }

    /// `p50=1.023,p99=2.047,p99.9=4.095,count=12` in milliseconds, as `INFO latencystats`.
    pub fn summary(&self) -> String {
        let ms = |q| self.quantile_us(q) as f64 / 1000.0;
        format!(
            "p50={:.3},p99={:.3},p99.9={:.3},count={}",
            ms(0.5),
            ms(0.99),
            ms(0.999),
            self.count.load(Ordering::Relaxed)
        )
    }
}

/// The text fields of `INFO sem`: the distributions.
pub fn distributions() -> Vec<(&'static str, String)> {
    vec![
        ("wait_time", WAIT_TIME.summary()),
        ("hold_time", HOLD_TIME.summary()),
    ]
}

/// `CONFIG RESETSTAT`, and each load of the module.
pub fn reset_distributions() {
    WAIT_TIME.reset();
    HOLD_TIME.reset();
}

/// The server's `total_commands_processed` when INFO last showed the distributions.
static COMMANDS_PROCESSED: AtomicU64 = AtomicU64::new(0);

/// INFO is about to show the distributions, and the server has processed `processed` commands:
/// fewer than when INFO last looked means `CONFIG RESETSTAT` ran since, and the distributions
/// start over with the server's statistics. (The one signal of that command a module gets
/// without a command filter; samples taken between the reset and this INFO go too, and a reset
/// followed by more commands than the server had processed before it goes unseen.)
pub fn note_commands_processed(processed: u64) {
    if processed < COMMANDS_PROCESSED.swap(processed, Ordering::Relaxed) {
        reset_distributions();
    }
}

/// Grants whose release is still to come, for [`HOLD_TIME`]: a table with one slot per hash of
/// the database, the name and the identifier, holding the grant's time. A grant takes its slot
/// whoever had it, so while more holders live than the table has slots some releases go
/// unrecorded: the distribution is then a sample of the releases (a collision of the full hash
/// would only blur one). No lock and no allocation: commands run on one thread, one at a time.
const SLOTS: usize = 4096;

struct Slot {
    key: AtomicU64,
    /// Microseconds since [`anchor`], plus one; 0 when the slot is free.
    since: AtomicU64,
}

#[allow(clippy::declare_interior_mutable_const)] // only to fill the table below
const FREE: Slot = Slot {
    key: AtomicU64::new(0),
    since: AtomicU64::new(0),
};

static GRANTED: [Slot; SLOTS] = [FREE; SLOTS];

/// The instant the grant times count from.
fn anchor() -> Instant {
    static ANCHOR: OnceLock<Instant> = OnceLock::new();
    *ANCHOR.get_or_init(Instant::now)
}

fn now_us() -> u64 {
    u64::try_from(anchor().elapsed().as_micros()).unwrap_or(u64::MAX - 1) + 1
}

/// The key of `holder`'s grant in `name` of database `db`.
pub fn grant_key(db: i32, name: &[u8], holder: &[u8]) -> u64 {
    let mut hasher = IdHasher::default();
    hasher.write_u64(db as u64);
    hasher.write(name);
    hasher.write_u64(name.len() as u64);
    hasher.write(holder);
    hasher.finish()
}

fn slot(key: u64) -> &'static Slot {
    // The multiplicative hash mixes best into the high bits.
    &GRANTED[(key >> (64 - SLOTS.trailing_zeros())) as usize]
}

/// A new permit of the holder of `key` was granted now.
pub fn granted(key: u64) {
    let slot = slot(key);
    slot.key.store(key, Ordering::Relaxed);
    slot.since.store(now_us(), Ordering::Relaxed);
}

/// The holder of `key` left the semaphore (released, expired, lost): when it was granted (an
/// opaque time for [`record_hold`]), if known.
pub fn ended(key: u64) -> Option<u64> {
    let slot = slot(key);
    let since = slot.since.load(Ordering::Relaxed);
    if since == 0 || slot.key.load(Ordering::Relaxed) != key {
        return None;
    }
    slot.since.store(0, Ordering::Relaxed);
    Some(since)
}

/// A holder granted at `since` (from [`ended`]) released its permits now.
pub fn record_hold(since: u64) {
    HOLD_TIME.record(Duration::from_micros(now_us().saturating_sub(since)));
}

/// The data went (a flush, a swap, this node becoming a replica): its grants are forgotten.
pub fn forget_grants() {
    for slot in &GRANTED {
        slot.since.store(0, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_every_value_within_three_percent() {
        let mut last = 0;
        for us in (0..10_000u64).chain((10_000..1 << 41).step_by(9_999_991)) {
            let at = bucket_of(us);
            assert!(at >= last, "buckets grow with the value");
            last = at;
            if us < 1 << 40 {
                let top = bucket_top(at);
                assert!(top >= us, "{us} lands in a bucket up to {top}");
                assert!(
                    (top - us) as f64 <= us as f64 * 0.032,
                    "{us} reported as {top}"
                );
            } else {
                assert_eq!(at, BUCKETS - 1, "longer lands in the last");
            }
        }
    }

    #[test]
    fn quantiles_of_a_known_distribution() {
        let h = Histogram {
            buckets: [ZERO; BUCKETS],
            count: AtomicU64::new(0),
        };
        assert_eq!(h.quantile_us(0.5), 0);
        for ms in 1..=1000u64 {
            h.record(Duration::from_millis(ms));
        }
        // (quantile, the exact value in ms)
        for (q, exact) in [(0.5, 500.0), (0.99, 990.0), (0.999, 999.0)] {
            let got = h.quantile_us(q) as f64 / 1000.0;
            assert!(got >= exact && got <= exact * 1.032, "p{q}: {got} ms");
        }
        assert!(h.summary().ends_with(",count=1000"), "{}", h.summary());
        h.reset();
        assert_eq!(h.summary(), "p50=0.000,p99=0.000,p99.9=0.000,count=0");
    }
}
