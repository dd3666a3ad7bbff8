//! Waiting inside the server: the wait queue's rules (`queue.rs`) applied to Redis.
//!
//! A caller that waits is blocked here ([`block`]: permits, a set's permits, or an empty
//! semaphore) and served after the next write to its semaphore (`write.rs`, `Step::serve`): a release
//! or a refresh inside its own command, so the grant is replicated with what freed it, in one
//! MULTI/EXEC; and the module's timer for what happens outside any command of ours: a lease
//! running out, a wait ending, a connection with BOUND permits closing, another client
//! deleting or overwriting the keys, a flush. Work that Redis reports where keys must not be
//! written (disconnect and free callbacks, key events, the command filter) is deferred to the
//! timer, which fires right after the current command.

use std::os::raw::c_void;

use redis_module::{Context, RedisResult, RedisString};

use crate::config;
use crate::error::SemError;
use crate::grant;
use crate::keys::{with_derived, COUNTER_SUFFIX, LIMIT_SUFFIX, OWNER_SUFFIX, PERMITS_SUFFIX};
use crate::memory;
use crate::queue::{Binding, Due, SemKey, WaiterId, Wants};
use crate::request::Ask;
use crate::semaphore::{self, Holder};
use crate::server::block;
use crate::server::events::{self, Needs};
pub use crate::server::hooks::Left;
use crate::server::memory as server_memory;
use crate::server::names as server_names;
use crate::server::{
    clock_ms, cluster_can_serve, is_primary, is_valkey, select_db, timer, writes_paused,
};
pub use crate::state::{
    any_bindings, follows_foreign_changes, queued, queued_anywhere, reset, scope,
};
use crate::state::{defer, is_waited, with, GiveBack, Work};
use crate::stats::{self, COUNTERS};
use crate::store::SemKeys;
use crate::write::{self, answer, binding, end_wait, Outcome, Slice, Step, Write};

/// A permit was granted BOUND to the caller's connection: follow connections closing.
pub fn follow_bound(ctx: &Context) {
    events::follow(ctx.ctx, Needs::Bound);
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
    with(|s| Line {
        waiters: s.registry.queued(sem),
        longest_wait_ms: s.registry.longest_wait_ms(sem, now_ms),
        ages_ms: s.registry.ages_ms(sem, now_ms),
        waiting_for_empty: s.registry.waiting_for_empty(sem),
    })
}

/// The bounds on waiters' memory the settings give now.
fn memory_bounds() -> memory::Bounds {
    memory::Bounds {
        percent: config::WAITERS_MAXMEMORY_PERCENT.get() as u64,
        max_bytes: config::MAX_WAITERS_MEMORY.get() as u64,
    }
}

/// What one more waiting client costs this server, in bytes.
fn per_waiter_bytes() -> u64 {
    memory::per_waiter_bytes(is_valkey())
}

/// The gauges of `INFO sem`.
pub fn gauges() -> Vec<(&'static str, u64)> {
    let (semaphores, waiters, empty, scheduled, bound, blocked) = with(|s| {
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
        ("armed_timers", u64::from(timer::is_armed())),
        ("event_subscriptions", events::subscriptions()),
        ("bound_holders", bound as u64),
        ("waiters_memory", blocked as u64 * per_waiter_bytes()),
        (
            "waiters_memory_limit",
            memory::limit(server_memory::now(), memory_bounds()),
        ),
    ]
}

/// Whether one more may wait for each of `sems` (`sem.max-waiters-per-semaphore`), on the
/// server (`sem.max-waiters`), and in the memory waiters may take (`memory.rs`).
fn check_room<'a>(mut sems: impl Iterator<Item = &'a SemKey>) -> Result<(), SemError> {
    with(|s| {
        let per_semaphore = config::MAX_WAITERS_PER_SEMAPHORE.get();
        let total = config::MAX_WAITERS.get();
        let crowded = sems.any(|sem| {
            let here = s.registry.queued(sem) + s.registry.waiting_for_empty(sem);
            here as i64 >= per_semaphore
        });
        if crowded {
            Err(SemError::TooManyWaiters {
                per_semaphore: true,
                max: per_semaphore,
            })
        } else if s.registry.total_waiters() as i64 >= total {
            Err(SemError::TooManyWaiters {
                per_semaphore: false,
                max: total,
            })
        } else {
            Ok(s.registry.total_waiters() as u64)
        }
    })
    .and_then(|waiters| {
        memory::admit(
            waiters,
            per_waiter_bytes(),
            server_memory::now(),
            memory_bounds(),
        )
        .inspect_err(|_| stats::count(&COUNTERS.waits_refused_memory))
    })
}

/// Blocks the caller (connection `client`) for what it `wants` (permits, a set's permits, or an empty semaphore) in
/// the line of each of `sems`, each with its soonest lease end. The timer is armed for the
/// wait's end (`wait_ms`, 0: none) and the next lease end.
pub fn block(
    ctx: &Context,
    client: u64,
    wants: Wants,
    sems: &[(SemKey, Option<i64>)],
    now_ms: i64,
    wait_ms: i64,
) -> Result<(), SemError> {
    check_room(sems.iter().map(|(sem, _)| sem))?;
    events::follow_waits(ctx.ctx)?;
    let bound = match &wants {
        Wants::Permits(ask) => ask.bound,
        Wants::Set(parts) => parts.iter().any(|(_, ask)| ask.bound),
        Wants::Empty => false,
    };
    if bound {
        events::follow(ctx.ctx, Needs::Bound);
    }
    let blocked = block::block(ctx).ok_or(SemError::CannotWait)?;
    let until = (wait_ms > 0).then(|| now_ms.saturating_add(wait_ms));
    for (sem, _) in sems {
        server_names::watch(sem.db, &sem.name);
    }
    let due = with(|s| {
        let first = sems[0].0.clone();
        s.registry
            .enqueue(first, client, wants, now_ms, until, blocked);
        for (sem, next) in sems {
            s.registry.set_lease_end(sem, *next);
        }
        s.registry.next_due_ms()
    });
    if let Some(at) = due {
        timer::arm(at, now_ms);
    }
    Ok(())
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
    let waited: Vec<SemKey> = with(|s| {
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

/// The module's timer fired: end the waits that are over, serve the semaphores whose lease
/// ended, and do the deferred work, one item at a time, each at the time read for it. Work
/// left when the slice runs out goes on at the next turn of the event loop, after other
/// clients are answered.
pub fn on_timer(ctx: &Context) {
    scope(ctx, true, || timer_run(ctx));
}

/// Steps a slice of the timer takes without answering anybody before its time may end it.
const IDLE_STEPS: u32 = 1000;

fn timer_run(ctx: &Context) {
    if !is_primary(ctx) {
        // A replica grants nothing; `became_replica` answered the waiters.
        with(|s| s.work.clear());
        return;
    }
    if writes_paused() {
        wait_for_writes(clock_ms());
        return;
    }
    stats::count(&COUNTERS.timer_runs);
    let slice = Slice::start();
    let mut steps = 0;
    loop {
        if slice.is_over(steps, IDLE_STEPS) {
            stats::count(&COUNTERS.timer_runs_continued);
            let now = clock_ms();
            timer::arm(now, now);
            return;
        }
        steps += 1;
        if let Some(due) = with(|s| s.registry.take_one_due(clock_ms())) {
            let sems = match due {
                Due::Timeout(id) => {
                    serve_before_time_up(ctx, id, slice);
                    time_up(id)
                }
                Due::LeaseEnd(sem) => vec![sem],
            };
            // Whoever stood behind a waiter that left may fit now.
            with(|s| s.work.extend(sems.into_iter().map(Work::Serve)));
            continue;
        }
        let Some(work) = with(|s| s.work.pop_first()) else {
            break;
        };
        match work {
            Work::Serve(sem) => serve_outside(ctx, &sem, slice),
            Work::ServeDb(db) => with(|s| {
                let sems = s.registry.waited(db);
                s.work.extend(sems.into_iter().map(Work::Serve));
            }),
            Work::GiveBack(binding, why) => give_back(ctx, &binding, why, slice),
            Work::ServeSet(id) => serve_set(ctx, id, slice),
        }
    }
    if let Some(at) = with(|s| s.registry.next_due_ms()) {
        timer::arm(at, clock_ms());
    }
}

/// Waiter `id`'s time is up, but a permit may have come free unseen (another client's `ZREM`
/// of a holder writes nothing the module follows): its lines are served first, so a waiter
/// whose turn it is takes what is free rather than timing out, and the head of a line is never
/// skipped for whoever stands behind it.
fn serve_before_time_up(ctx: &Context, id: WaiterId, slice: Slice) {
    let Some((sems, set)) = with(|s| {
        let waiter = s.registry.waiter(id)?;
        let set = matches!(waiter.wants, Wants::Set(_));
        Some((waiter.sems().cloned().collect::<Vec<SemKey>>(), set))
    }) else {
        return;
    };
    if set {
        serve_set(ctx, id, slice);
    } else {
        for sem in &sems {
            serve_outside(ctx, sem, slice);
        }
    }
}

/// Waiter `id`'s time is up: nil for permits, 0 for a wait for empty. Returns the lines it
/// stood in (none when it was answered meanwhile).
fn time_up(id: WaiterId) -> Vec<SemKey> {
    let Some((sems, for_empty)) = with(|s| {
        let waiter = s.registry.waiter(id)?;
        Some((waiter.sems().cloned().collect(), waiter.for_empty()))
    }) else {
        return Vec::new();
    };
    let outcome = if for_empty {
        Outcome::NotEmptied
    } else {
        Outcome::TimedOut
    };
    answer(id, outcome);
    sems
}

/// How often the timer looks again while writes are paused.
const PAUSE_RECHECK_MS: i64 = 10;

/// The timer fired while writes are paused: waits that are over still end (that writes
/// nothing); grants, lease ends and give-backs wait for the pause to end.
fn wait_for_writes(now: i64) {
    for item in with(|s| s.registry.take_due(now)) {
        let sems = match item {
            Due::Timeout(id) => time_up(id),
            Due::LeaseEnd(sem) => vec![sem],
        };
        with(|s| s.work.extend(sems.into_iter().map(Work::Serve)));
    }
    timer::arm(now + PAUSE_RECHECK_MS, now);
}

/// A semaphore's key names, made outside any command of ours.
struct KeyNames([RedisString; 5]);

impl KeyNames {
    /// Selects `sem`'s database; in Redis Cluster, only where this node may serve its keys.
    fn of(ctx: &Context, sem: &SemKey) -> Result<KeyNames, SemError> {
        select_db(ctx, sem.db);
        let derived = |suffix| {
            with_derived(&sem.name, suffix, |key| {
                RedisString::create_from_slice(ctx.ctx, key)
            })
        };
        let names = [
            RedisString::create_from_slice(ctx.ctx, &sem.name),
            derived(OWNER_SUFFIX),
            derived(COUNTER_SUFFIX),
            derived(PERMITS_SUFFIX),
            derived(LIMIT_SUFFIX),
        ];
        let [name, owner, counter, permits, limit] = &names;
        if !cluster_can_serve(ctx, &[name, owner, counter, permits, limit]) {
            return Err(SemError::SlotMoved);
        }
        Ok(KeyNames(names))
    }

    fn keys(&self) -> SemKeys<'_> {
        let [name, owner, counter, permits, limit] = &self.0;
        SemKeys {
            name,
            owner,
            counter,
            permits,
            limit,
        }
    }
}

/// Grants set waiter `id` if it heads every line it stands in and each of its semaphores would
/// grant its count, all in one step at the time read now (the same grant as a direct
/// `SEM.ACQUIREALL`); the ends of the writes then serve whoever stands behind it. If not, it
/// stays where it is (and holds its lines) until one of them changes again.
fn serve_set(ctx: &Context, id: WaiterId, slice: Slice) {
    let Some((parts, client)) = with(|s| {
        let waiter = s.registry.waiter(id)?;
        match &waiter.wants {
            Wants::Set(parts) if s.registry.heads_every_line(id) => {
                Some((parts.clone(), waiter.client))
            }
            _ => None,
        }
    }) else {
        return;
    };
    let (sems, asks): (Vec<SemKey>, Vec<Ask>) = parts.into_iter().unzip();
    let names: Result<Vec<KeyNames>, SemError> =
        sems.iter().map(|sem| KeyNames::of(ctx, sem)).collect();
    // Each write's end hands its line to `step`, which serves it at the end (below).
    let step = Step::for_timer(ctx, slice);
    grant_set(&step, id, client, &names, sems, &asks);
    step.serve();
}

/// The part of [`serve_set`] that writes, in `step`.
fn grant_set<'a>(
    step: &Step<'a>,
    id: WaiterId,
    client: u64,
    names: &'a Result<Vec<KeyNames>, SemError>,
    sems: Vec<SemKey>,
    asks: &[Ask],
) {
    let writes: Result<Vec<Write>, SemError> =
        names.as_ref().map_err(Clone::clone).and_then(|names| {
            names
                .iter()
                .map(|names| Write::open_to_serve(step, &names.keys()))
                .collect()
        });
    let mut writes = match writes {
        Ok(writes) => writes,
        Err(err) => {
            answer(id, Outcome::Failed(err));
            with(|s| s.work.extend(sems.into_iter().map(Work::Serve)));
            return;
        }
    };
    let now = clock_ms();
    let holder = writes[0].store().id(&asks[0].holder);
    let outcome = match grant::survey(writes.iter().map(Write::store), asks, &holder, now) {
        Ok(fits) if fits.iter().all(|&(fits, _)| fits) => {
            let refs: Vec<(i32, &[u8])> = sems.iter().map(|s| (s.db, &*s.name)).collect();
            let bind_to = asks[0].bound.then_some(client);
            match grant::grant_all(
                writes.iter_mut().map(Write::store_mut),
                &refs,
                asks,
                &holder,
                now,
                bind_to,
            ) {
                Ok(grants) => Outcome::GrantedSet {
                    grants: sems
                        .iter()
                        .map(|sem| binding(sem, &asks[0].holder))
                        .zip(grants)
                        .collect(),
                    with_ticket: asks[0].with_ticket,
                    delivered: false,
                },
                Err(err) => Outcome::Failed(err),
            }
        }
        Ok(_) => {
            // It stays at the head: its lines are looked at again when they change or a lease
            // in them ends.
            let due = with(|s| {
                for (sem, write) in sems.iter().zip(&writes) {
                    s.registry
                        .set_lease_end(sem, write.store().next_deadline(now));
                }
                s.registry.next_due_ms()
            });
            if let Some(at) = due {
                timer::arm(at, now);
            }
            writes.into_iter().for_each(Write::close_unchanged);
            return;
        }
        Err(err) => Outcome::Failed(err),
    };
    answer(id, outcome);
    // Whoever stood behind the set waiter may fit now: the step serves each line at its end.
    drop(writes);
}

/// Serves `sem`'s line from the timer. If its keys cannot be used (overwritten with another
/// type, or the slot left this node), every waiter is answered with the reason.
fn serve_outside(ctx: &Context, sem: &SemKey, slice: Slice) {
    if !is_waited(sem) {
        return;
    }
    let opened = KeyNames::of(ctx, sem).and_then(|names| {
        let step = Step::for_timer(ctx, slice);
        let opened = Write::open_to_serve(&step, &names.keys()).map(Write::commit);
        step.serve();
        opened
    });
    if let Err(err) = opened {
        let waiters = with(|s| {
            let mut waiters = Vec::new();
            while let Some(id) = s.registry.head(sem).map(|w| w.id) {
                waiters.extend(s.registry.remove(id));
            }
            waiters.extend(s.registry.take_empties(sem));
            waiters
        });
        for waiter in waiters {
            // A set waiter leaves its other lines too: whoever is behind it there may fit.
            for other in waiter.sems().filter(|&other| other != sem) {
                defer(Work::Serve(other.clone()));
            }
            let for_empty = waiter.for_empty();
            end_wait(waiter.handle, Outcome::Failed(err.clone()), for_empty);
        }
        crate::state::disarm_if_idle();
    }
}

/// Gives `binding`'s permit back, if it is still held: its BOUND connection closed, or its
/// grant never reached the client. The step serves the line after the write.
fn give_back(ctx: &Context, binding: &Binding, why: GiveBack, slice: Slice) {
    write::gave_back();
    with(|s| s.registry.unbind(binding));
    let Ok(names) = KeyNames::of(ctx, &binding.sem) else {
        return;
    };
    let step = Step::for_timer(ctx, slice);
    if let Ok(write) = Write::open_to_serve(&step, &names.keys()) {
        release_given_back(write, binding, why);
    }
    step.serve();
}

/// The write of [`give_back`].
fn release_given_back(mut write: Write, binding: &Binding, why: GiveBack) {
    let store = write.store_mut();
    let holder = store.id(&binding.holder);
    if let Ok(Holder::Live) = semaphore::release(store, clock_ms(), &holder, None) {
        if why == GiveBack::ConnectionClosed {
            stats::count(&COUNTERS.bound_released);
            store.released(&binding.holder);
        }
        store.notify(c"sem.release");
    }
}

/// The reply hook: `data` is the `Outcome` that `write::end_wait` handed to the unblocked client.
pub fn reply_hook(data: *mut c_void) -> RedisResult {
    // SAFETY: `end_wait` hands over a boxed `Outcome`, which Redis keeps until the free hook
    // and nothing else touches while the reply is made.
    write::reply(unsafe { &mut *data.cast::<Outcome>() })
}

/// The free hook: `data` is the `Outcome` that `end_wait` handed over, now done with.
pub fn free_hook(data: *mut c_void, _disconnected: bool) {
    // SAFETY: as for `reply_hook`; Redis calls the free hook once, last.
    let outcome = unsafe { Box::from_raw(data.cast::<Outcome>()) };
    write::free(*outcome);
}
