//! The module's timer: waits that end, leases that end, and the work deferred to it (lines to
//! serve, set waiters at the head of all their lines, permits to give back), each at the time
//! read for it, in slices so other clients are answered between them.

use redis_module::{Context, RedisString};

use super::outcome::Outcome;
use super::serve::{answer, binding, end_wait, serve_step, Slice};
use crate::error::SemError;
use crate::grant;
use crate::keys::{with_derived, COUNTER_SUFFIX, LIMIT_SUFFIX, OWNER_SUFFIX, PERMITS_SUFFIX};
use crate::queue::{Binding, Due, SemKey, WaiterId, Wants};
use crate::request::Ask;
use crate::semaphore;
use crate::server::{clock_ms, cluster_can_serve, is_primary, select_db, timer, writes_paused};
use crate::state::{self, defer, is_waited, read, scope, with, GiveBack, Work};
use crate::stats::{self, COUNTERS};
use crate::store::{Ending, SemKeys};
use crate::write::{Step, Write};

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
            state::arming(|a| timer::arm(a, now, now));
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
    if let Some(at) = read(|s| s.registry.next_due_ms()) {
        state::arming(|a| timer::arm(a, at, clock_ms()));
    }
}

/// Waiter `id`'s time is up, but a permit may have come free unseen (another client's `ZREM`
/// of a holder writes nothing the module follows): its lines are served first, so a waiter
/// whose turn it is takes what is free rather than timing out, and the head of a line is never
/// skipped for whoever stands behind it.
fn serve_before_time_up(ctx: &Context, id: WaiterId, slice: Slice) {
    let Some((sems, set)) = read(|s| {
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
    let Some((sems, for_empty)) = read(|s| {
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
    state::arming(|a| timer::arm(a, now + PAUSE_RECHECK_MS, now));
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
    let Some((parts, client)) = read(|s| {
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
    let step = Step::new(ctx);
    grant_set(&step, id, client, &names, sems, &asks);
    serve_step(step, Some(slice));
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
        Ok(planned) if planned.iter().all(|p| p.fits) => {
            let refs: Vec<(i32, &[u8])> = sems.iter().map(|s| (s.db, &*s.name)).collect();
            let bind_to = asks[0].bind_to(client);
            match grant::grant_all(
                writes.iter_mut().map(Write::store_mut),
                &refs,
                asks,
                planned,
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
                state::arming(|a| timer::arm(a, at, now));
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
        let step = Step::new(ctx);
        let opened = Write::open_to_serve(&step, &names.keys()).map(Write::commit);
        serve_step(step, Some(slice));
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
    state::answered();
    with(|s| s.registry.unbind(binding));
    let Ok(names) = KeyNames::of(ctx, &binding.sem) else {
        return;
    };
    let step = Step::new(ctx);
    if let Ok(write) = Write::open_to_serve(&step, &names.keys()) {
        release_given_back(write, binding, why);
    }
    serve_step(step, Some(slice));
}

/// The write of [`give_back`].
fn release_given_back(mut write: Write, binding: &Binding, why: GiveBack) {
    let store = write.store_mut();
    let holder = store.id(&binding.holder);
    let why = match why {
        GiveBack::ConnectionClosed => Ending::ConnectionClosed,
        GiveBack::Undelivered => Ending::Undelivered,
    };
    if let Ok(found) = semaphore::release(store, clock_ms(), &holder, None) {
        store.holder_ended(found, &binding.holder, why);
    }
}
