//! Waiting inside the server: the wait queue's rules (`queue.rs`) applied to Redis.
//!
//! A caller that waits is blocked ([`block`]: permits, a set's permits, or an empty semaphore)
//! and served after the next write to its semaphore ([`serve::serve_step`], at the end of the
//! command or timer step that wrote): a release or a refresh inside its own command, so the
//! grant is replicated with what freed it, in one MULTI/EXEC; and the module's [`timer`] for what
//! happens outside any command of ours: a lease running out, a wait ending, a connection with
//! BOUND permits closing, another client deleting or overwriting the keys, a flush. Work that
//! Redis reports where keys must not be written (disconnect and free callbacks, key events, the
//! command filter) is deferred to the timer, which fires right after the current command. What
//! became of a wait reaches the client as an [`outcome::Outcome`].
//!
//! This file holds what the server's events tell the waiting side, and what it shows.

pub mod block;
pub mod outcome;
pub mod serve;
pub mod timer;

use redis_module::Context;

use crate::error::SemError;
use crate::keys::{COUNTER_SUFFIX, LIMIT_SUFFIX, OWNER_SUFFIX, PERMITS_SUFFIX};
use crate::memory;
use crate::queue::SemKey;
use crate::server::events::{self, Needs};
use crate::server::hooks::Left;
use crate::server::memory as server_memory;
use crate::state::{
    self, any_bindings, defer, is_waited, queued_anywhere, read, with, GiveBack, Work,
};
use crate::stats::{self, COUNTERS};
use block::{memory_bounds, per_waiter_bytes};
use outcome::Outcome;
use serve::end_wait;

/// A permit was granted BOUND to the caller's connection: follow connections closing.
pub fn follow_bound(ctx: &Context) {
    state::following(|f| events::follow(ctx.ctx, f, Needs::Bound));
}

/// Whether anybody waits for the semaphore `name` of database `db`.
pub fn waits_on(db: i32, name: &[u8]) -> bool {
    queued_anywhere()
        && is_waited(&SemKey {
            db,
            name: name.into(),
        })
}

/// What SEM.GET JSON shows of the waiting side of one semaphore.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Line {
    /// Waiters for permits.
    pub waiters: usize,
    /// How long the first of them has waited.
    pub longest_wait_ms: Option<i64>,
    /// How long each of them has waited, in line order.
    pub ages_ms: Vec<i64>,
    /// Waiters for the semaphore to empty.
    pub waiting_for_empty: usize,
}

/// The waiting side of `sem`.
pub fn line(sem: &SemKey, now_ms: i64) -> Line {
    if !queued_anywhere() {
        return Line::default();
    }
    read(|s| Line {
        waiters: s.registry.queued(sem),
        longest_wait_ms: s.registry.longest_wait_ms(sem, now_ms),
        ages_ms: s.registry.ages_ms(sem, now_ms),
        waiting_for_empty: s.registry.waiting_for_empty(sem),
    })
}

/// The gauges of `INFO sem`.
pub fn gauges() -> Vec<(&'static str, u64)> {
    let (semaphores, waiters, empty, scheduled, bound, blocked) = read(|s| {
        (
            s.registry.waited_count(),
            s.registry.total_waiters() - s.registry.empty_waiters(),
            s.registry.empty_waiters(),
            s.registry.scheduled(),
            s.registry.bound_count(),
            s.registry.total_waiters(),
        )
    });
    vec![
        ("semaphores_with_waiters", semaphores as u64),
        ("waiters", waiters as u64),
        ("waiting_for_empty", empty as u64),
        ("scheduled_wakeups", scheduled as u64),
        ("armed_timers", u64::from(state::arming(|a| a.is_armed()))),
        (
            "event_subscriptions",
            state::following(events::subscriptions),
        ),
        ("bound_holders", bound as u64),
        ("waiters_memory", blocked as u64 * per_waiter_bytes()),
        (
            "waiters_memory_limit",
            memory::limit(server_memory::now(), memory_bounds()),
        ),
    ]
}

/// A waiter left on its own: it disconnected, or `CLIENT UNBLOCK` ended its wait. Returns
/// whether it was still waiting; if not, the module already answered it (Redis reports a
/// disconnect even then, until the answer is processed) and its outcome reaches [`free`].
pub fn left(handle: usize) -> Left {
    let waiter = with(|s| s.registry.remove_by_handle(handle));
    let Some(waiter) = waiter else {
        return Left::NotWaiting;
    };
    if waiter.for_empty() {
        stats::count(&COUNTERS.empty_waits_cancelled);
        return Left::ForEmpty;
    }
    // Whoever stood behind it may fit now.
    stats::count(&COUNTERS.waits_cancelled);
    for sem in waiter.sems() {
        defer(Work::Serve(sem.clone()));
    }
    Left::ForPermits
}

/// A connection closed: give back the BOUND permits it held.
pub fn connection_closed(client: u64) {
    if !any_bindings() {
        return;
    }
    let bindings = with(|s| s.registry.take_bindings(client));
    for binding in bindings {
        defer(Work::GiveBack(binding, GiveBack::ConnectionClosed));
    }
}

/// `FLUSHDB` or `FLUSHALL` (`None`): bindings there are gone with their keys, and every waiter
/// there is served on the empty semaphores.
pub fn flushed(db: Option<i32>) {
    stats::forget_grants();
    with(|s| s.registry.drop_bindings(db));
    if queued_anywhere() {
        defer(Work::ServeDb(db));
    }
}

/// `SWAPDB a b`: bindings follow their keys; waiters stay with their connection's database and
/// are served on what it holds now.
pub fn swapped(a: i32, b: i32) {
    stats::forget_grants();
    with(|s| s.registry.swap_binding_dbs(a, b));
    if queued_anywhere() {
        defer(Work::ServeDb(Some(a)));
        defer(Work::ServeDb(Some(b)));
    }
}

/// The data may have changed under every semaphore (a load ended, a slot moved): serve all.
pub fn recheck_all() {
    if queued_anywhere() {
        defer(Work::ServeDb(None));
    }
}

/// The server became a replica: it grants nothing any more, so every waiter is answered now,
/// and bindings end (the primary's data replaces this node's).
pub fn became_replica() {
    stats::forget_grants();
    let waiters = with(|s| {
        s.work.clear();
        s.registry.drop_bindings(None);
        s.registry.take_all_waiters()
    });
    for waiter in waiters {
        let for_empty = waiter.for_empty();
        end_wait(
            waiter.handle,
            Outcome::Failed(SemError::BecameReplica),
            for_empty,
        );
    }
    // The timer, armed or not, finds nothing to do on a replica; it ends the events the
    // waiting side followed (never from here: this runs in the server's walk of listeners).
}

/// `key` of database `db` changed by another hand than this module's (a write, expiry,
/// eviction, delete, rename, flush of one key): if it is a waited-on semaphore or one of its
/// derived keys, that line is served after the command. Costs a few lookups, whatever the
/// number of waiters.
pub fn touched(db: i32, key: &[u8]) {
    if !queued_anywhere() {
        return;
    }
    let names = std::iter::once(key).chain(
        [OWNER_SUFFIX, COUNTER_SUFFIX, PERMITS_SUFFIX, LIMIT_SUFFIX]
            .iter()
            .filter_map(|suffix| key.strip_suffix(*suffix)),
    );
    let waited: Vec<SemKey> = read(|s| {
        names
            .map(|name| SemKey {
                db,
                name: name.into(),
            })
            .filter(|sem| s.registry.is_waited(sem))
            .collect()
    });
    for sem in waited {
        defer(Work::Serve(sem));
    }
}
