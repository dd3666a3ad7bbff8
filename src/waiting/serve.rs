//! The serving step, explicit as Redis's `handleClientsBlockedOnKeys` after `call()`: once the
//! writes of a command or a timer step have ended, [`serve_step`] forgets the bindings of the
//! permits that went and serves each written semaphore's line on the keys still open, so a grant
//! made for a waiter is replicated with what freed it, in one MULTI/EXEC. Serving a line
//! ([`serve`]) grants its head while the acquire rule would, through the one grant (`grant.rs`),
//! and answers it: the blocked client's reply is the grant's reply.

use std::time::{Duration, Instant};

use redis_module::Context;

use super::outcome::{self, Outcome};
use crate::error::SemError;
use crate::grant::{self, Try};
use crate::queue::{Binding, SemKey, WaiterId};
use crate::request::Ask;
use crate::semaphore;
use crate::server::block::Blocked;
use crate::server::{clock_ms, selected_db, timer};
use crate::state::{self, defer, read, with, Work};
use crate::stats::{self, COUNTERS};
use crate::store::RedisStore;
use crate::write::{Serve, Step, Written};

/// Serves what the writes of `step` may have changed, once they have ended: the end of every
/// command (after its handler) and of every timer step that writes. A command's lines are each
/// served in a slice of their own; a timer step's within the timer's `slice`.
pub fn serve_step(step: Step, slice: Option<Slice>) {
    let (ctx, writes) = step.end();
    for written in writes {
        follow(ctx, written, slice);
    }
}

/// What follows one write: the bindings of the permits it removed (or found gone with their
/// key) end; then the line is served, on the same open keys. The keys close after it, settling
/// their expiry after the line's grants.
fn follow(ctx: &Context, mut written: Written, slice: Option<Slice>) {
    let sem = || SemKey {
        db: selected_db(ctx),
        name: written.name.as_slice().into(),
    };
    if state::any_bindings() {
        let (all, removed) = written.store.take_gone();
        state::forget_gone(sem, all, &removed);
    }
    if !state::queued_anywhere() {
        return;
    }
    let serve_now = match written.when {
        Serve::IfFreed => written.store.may_have_freed(),
        Serve::Always => true,
        Serve::Never => false,
    };
    if serve_now {
        let slice = slice.unwrap_or_else(Slice::start);
        serve(&mut written.store, &sem(), &slice);
    }
}

/// How long the module works on waiters in one go before it lets the server answer other
/// clients (as Redis's own active expiry works in slices).
const SLICE: Duration = Duration::from_millis(2);

/// The end of a slice of work.
#[derive(Debug, Clone, Copy)]
pub struct Slice {
    end: Instant,
    answered_at_start: usize,
}

impl Slice {
    pub fn start() -> Slice {
        Slice {
            end: Instant::now() + SLICE,
            answered_at_start: state::answers(),
        }
    }

    /// Over once its time is up, and it answered somebody or took `steps` of `max_steps`
    /// without (bookkeeping, such as a database's lines listed or a set waiter handed on,
    /// never holds back the first answer, which a preempted process would otherwise give
    /// only after the server read the next command).
    pub fn is_over(&self, steps: u32, max_steps: u32) -> bool {
        let worked = state::answers() != self.answered_at_start || steps >= max_steps;
        worked && Instant::now() >= self.end
    }
}

/// The head of a line, as [`serve`] sees it.
enum Head {
    Permits(WaiterId, Ask, u64),
    /// A set waiter, and whether it heads every line it stands in.
    Set(WaiterId, bool),
}

/// Grants the head of `sem`'s line while the acquire rule would, on keys already open, each
/// grant at the server's time read for it; answers those waiting for it to empty; then
/// schedules the next lease end. When `slice` runs out, the timer goes on after the server has
/// answered other clients.
pub fn serve(store: &mut RedisStore, sem: &SemKey, slice: &Slice) {
    if !state::is_waited(sem) {
        return;
    }
    stats::count(&COUNTERS.lines_served);
    // Nothing is looked up once the last waiter anywhere is answered (a hand-off's usual end).
    let mut granted_any = false;
    // When the head was last looked at: a lease that ends after that may free its permits.
    let mut looked_at = None;
    while state::queued_anywhere() {
        let head = read(|s| {
            let head = s.registry.head(sem)?;
            Some(match head.ask() {
                Some(ask) => Head::Permits(head.id, ask.clone(), head.client),
                None => Head::Set(head.id, s.registry.heads_every_line(head.id)),
            })
        });
        let (id, ask, client) = match head {
            Some(Head::Permits(id, ask, client)) => (id, ask, client),
            // A set waiter: the timer serves it once it heads all of its lines (it needs their
            // keys); until then nobody behind it here is served.
            Some(Head::Set(id, true)) => {
                defer(Work::ServeSet(id));
                break;
            }
            Some(Head::Set(_, false)) | None => break,
        };
        // A line, once begun, gets at least one grant: the slice is looked at between grants
        // (and by the timer between lines), so no line is served twice for one change.
        if granted_any && slice.is_over(0, 1) {
            defer(Work::Serve(sem.clone()));
            break;
        }
        granted_any = true;
        let holder = store.id(&ask.holder);
        let bind_to = ask.bind_to(client);
        let sem_ref = (sem.db, &*sem.name);
        let now_ms = clock_ms();
        looked_at = Some(now_ms);
        let granted =
            grant::try_grant(store, sem_ref, &ask, &holder, now_ms, Try::Acquire, bind_to);
        let outcome = match granted {
            Ok(None) | Err(SemError::KindMismatch { .. }) => break,
            Ok(Some(grant)) => Outcome::Granted {
                with_ticket: ask.with_ticket,
                // The waiter's own copy of its request: its identifier moves on.
                binding: Binding {
                    sem: sem.clone(),
                    holder: ask.holder,
                },
                grant,
                delivered: false,
            },
            Err(err) => Outcome::Failed(err),
        };
        answer(id, outcome);
    }
    if !state::queued_anywhere() {
        return;
    }
    let now_ms = clock_ms();
    answer_if_empty(store, sem, now_ms);
    // The next lease end matters only to a line still waited (a walk of the holders): the first
    // after the head was looked at (one that has passed since is due at once).
    let next = state::is_waited(sem).then(|| store.next_deadline(looked_at.unwrap_or(now_ms)));
    let due = with(|s| {
        if let Some(next) = next.filter(|_| s.registry.is_waited(sem)) {
            s.registry.set_lease_end(sem, next);
        }
        s.registry.next_due_ms()
    });
    if let Some(at) = due {
        state::arming(|a| timer::arm(a, at, now_ms));
    }
}

/// `holder`'s permit in `sem`.
pub fn binding(sem: &SemKey, holder: &[u8]) -> Binding {
    Binding {
        sem: sem.clone(),
        holder: holder.to_vec(),
    }
}

/// Answers those who wait for `sem` to empty, if it has no live holder now (or its keys cannot
/// be read: then with the error).
fn answer_if_empty(store: &RedisStore, sem: &SemKey, now_ms: i64) {
    if read(|s| s.registry.waiting_for_empty(sem)) == 0 {
        return;
    }
    let failed = match semaphore::in_use(store, now_ms) {
        Ok(0) => None,
        Ok(_) => return,
        Err(err) => Some(err),
    };
    for waiter in with(|s| s.registry.take_empties(sem)) {
        let outcome = match &failed {
            None => Outcome::Emptied,
            Some(err) => Outcome::Failed(err.clone()),
        };
        end_wait(waiter.handle, outcome, true);
    }
    state::disarm_if_idle();
}

/// Takes waiter `id` out of its line and unblocks it with `outcome`.
pub fn answer(id: WaiterId, outcome: Outcome) {
    let (waiter, idle) = with(|s| (s.registry.remove(id), state::is_idle(s)));
    if let Some(waiter) = waiter {
        let for_empty = waiter.for_empty();
        end_wait(waiter.handle, outcome, for_empty);
    }
    // Nothing left for the timer: an armed timer keeps `MODULE UNLOAD` refused.
    if idle {
        state::arming(timer::disarm);
    }
}

/// Unblocks a waiter already taken out of its line (of waiters for permits, or `for_empty`),
/// counting how its wait ended.
pub fn end_wait(handle: Blocked, outcome: Outcome, for_empty: bool) {
    if let Outcome::Granted { .. } | Outcome::GrantedSet { .. } = &outcome {
        stats::WAIT_TIME.record(handle.waited());
    }
    if let Outcome::GrantedSet { .. } = &outcome {
        stats::count(&COUNTERS.set_acquired);
    }
    stats::count(match outcome {
        Outcome::Granted { .. } | Outcome::GrantedSet { .. } => &COUNTERS.waits_granted,
        Outcome::TimedOut => &COUNTERS.waits_timed_out,
        Outcome::Emptied => &COUNTERS.empty_waits_emptied,
        Outcome::NotEmptied => &COUNTERS.empty_waits_timed_out,
        Outcome::Failed(_) if for_empty => &COUNTERS.empty_waits_cancelled,
        Outcome::Failed(_) => &COUNTERS.waits_cancelled,
    });
    state::answered();
    outcome::unblock(handle, outcome);
}
