//! A write to one semaphore's keys, and the step that follows it. Every writer, the module's
//! commands and its timer alike, changes a semaphore through a [`Write`] opened in a [`Step`]:
//! the writes of one command or timer step. A write's end, which no path can skip (it runs when
//! the handle goes, `?` included), only hands its open keys back to the `Step`. Whoever made the
//! step ends it with [`Step::serve`], as Redis calls `handleClientsBlockedOnKeys` after a
//! command: the bindings of permits that went are forgotten, each written semaphore's line is
//! served on the same open keys, and the keys close, settling their expiry. So a grant made for a
//! waiter is replicated with what freed it, in one MULTI/EXEC.
//!
//! Serving a line ([`serve`]) grants its head while the acquire rule would, through the one
//! grant (`grant.rs`), and answers it: the blocked client's reply is the grant's reply.

use std::cell::RefCell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use redis_module::{Context, RedisResult, RedisString, RedisValue};

use crate::error::SemError;
use crate::grant::{self, Try};
use crate::queue::{Binding, SemKey, WaiterId};
use crate::request::Ask;
use crate::semaphore;
use crate::server::block::{self, Blocked};
use crate::server::key::Access;
use crate::server::{clock_ms, selected_db, timer};
use crate::state::{self, defer, with, GiveBack, Work};
use crate::stats::{self, COUNTERS};
use crate::store::{RedisStore, SemKeys};

/// The writes of one command, or of one step of the timer. A write's end hands its keys, still
/// open, back to its `Step`; whoever made the step calls [`Step::serve`] once the handler (or
/// the timer's step) is done, as Redis serves the keys its commands signalled ready once the
/// command is done. A grant made for a waiter is then replicated with what freed it, in one
/// MULTI/EXEC.
pub struct Step<'a> {
    ctx: &'a Context,
    /// The timer's slice of work, when the timer writes.
    slice: Option<Slice>,
    /// The writes kept for the end: the first inline (most calls write one semaphore, and
    /// need no allocation), then the others.
    first: RefCell<Option<Written<'a>>>,
    more: RefCell<Vec<Written<'a>>>,
}

/// A write whose end may concern a waiter or a binding.
struct Written<'a> {
    store: RedisStore<'a>,
    name: &'a RedisString,
    when: Serve,
}

impl<'a> Step<'a> {
    /// For a command.
    pub fn for_command(ctx: &'a Context) -> Step<'a> {
        Step {
            ctx,
            slice: None,
            first: RefCell::new(None),
            more: RefCell::new(Vec::new()),
        }
    }

    /// For a step of the timer, within its `slice`.
    pub fn for_timer(ctx: &'a Context, slice: Slice) -> Step<'a> {
        Step {
            ctx,
            slice: Some(slice),
            first: RefCell::new(None),
            more: RefCell::new(Vec::new()),
        }
    }

    /// Keeps a write that ended for the end of the step.
    fn written(&self, written: Written<'a>) {
        let mut first = self.first.borrow_mut();
        if first.is_none() {
            *first = Some(written);
        } else {
            self.more.borrow_mut().push(written);
        }
    }

    /// The end of the step, once its writes have ended: for each written semaphore, the
    /// bindings of the permits it lost end and its line is served, on the same open keys; the
    /// keys close after it, settling their expiry after the line's grants.
    pub fn serve(self) {
        if let Some(written) = self.first.take() {
            self.follow(written);
            for written in self.more.take() {
                self.follow(written);
            }
        }
    }

    /// What follows one write (see [`Step::serve`]).
    fn follow(&self, mut written: Written<'a>) {
        let sem = || SemKey {
            db: selected_db(self.ctx),
            name: written.name.as_slice().into(),
        };
        if state::any_bindings() {
            state::forget_gone(&mut written.store, sem);
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
            let slice = self.slice.unwrap_or_else(Slice::start);
            serve(&mut written.store, &sem(), &slice);
        }
    }
}

impl Drop for Step<'_> {
    /// Only checks that the step was served: a panic (a bug) unwinding through a command leaves
    /// the lines to the next write or the timer, and nothing more runs on a state that may be
    /// half changed.
    fn drop(&mut self) {
        debug_assert!(
            std::thread::panicking()
                || (self.first.get_mut().is_none() && self.more.get_mut().is_empty()),
            "a step with writes ended without Step::serve"
        );
    }
}

/// One semaphore's keys, open for a write in a [`Step`]; its end hands them back to the step
/// (a hand-over only: the step serves them when it is served).
pub struct Write<'r, 'a> {
    step: &'r Step<'a>,
    store: Option<RedisStore<'a>>,
    name: &'a RedisString,
    when: Serve,
    /// Whether the caller ended the write; one dropped on an error path ends it only if it
    /// changed a key (an error before any change leaves everything as it was).
    committed: bool,
}

/// When a write's end serves the line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Serve {
    /// If the write may have freed permits.
    IfFreed,
    /// Whatever the write: the timer writes because something else (a lease end, another
    /// client) changed the semaphore.
    Always,
    /// Never: a timer's survey that found a set waiter still does not fit and changed nothing
    /// (serving would only hand that waiter back to the timer).
    Never,
}

impl<'r, 'a> Write<'r, 'a> {
    /// Opens the keys for writing. A key of the wrong type is an error before anything changes.
    pub fn open(step: &'r Step<'a>, keys: &SemKeys<'a>) -> Result<Write<'r, 'a>, SemError> {
        let mut store = RedisStore::open(step.ctx, keys, Access::Write)?;
        // While some connection holds BOUND permits, the removed holders are kept so their
        // bindings can go too.
        if state::any_bindings() {
            store.keep_removed();
        }
        Ok(Write {
            step,
            store: Some(store),
            name: keys.name,
            when: Serve::IfFreed,
            committed: false,
        })
    }

    /// Opens the keys from the timer, to serve the line whatever the write.
    pub fn open_to_serve(
        step: &'r Step<'a>,
        keys: &SemKeys<'a>,
    ) -> Result<Write<'r, 'a>, SemError> {
        let mut write = Write::open(step, keys)?;
        write.store_mut().keep_removed();
        write.when = Serve::Always;
        write.committed = true;
        Ok(write)
    }

    /// The semaphore, as the grant and the waiting side name it.
    pub fn sem(&self) -> (i32, &'a [u8]) {
        (selected_db(self.step.ctx), self.name.as_slice())
    }

    /// The semaphore, as the waiting side keys it.
    pub fn key(&self) -> SemKey {
        SemKey {
            db: selected_db(self.step.ctx),
            name: self.name.as_slice().into(),
        }
    }

    /// The semaphore's keys, to read.
    pub fn store(&self) -> &RedisStore<'a> {
        self.store.as_ref().expect("open until the write's end")
    }

    /// The semaphore's keys, to change.
    pub fn store_mut(&mut self) -> &mut RedisStore<'a> {
        self.store.as_mut().expect("open until the write's end")
    }

    /// Ends the write, changed or not (see [`Step`]).
    pub fn commit(mut self) {
        self.committed = true;
    }

    /// Ends a timer's write that changed nothing, without serving the line.
    pub fn close_unchanged(mut self) {
        self.when = Serve::Never;
        self.committed = true;
    }
}

impl Drop for Write<'_, '_> {
    /// The end of the write: one dropped on an error path before any change ends nothing.
    fn drop(&mut self) {
        let Some(store) = &self.store else {
            return;
        };
        let ended = self.committed || store.changed();
        // While nobody waits and nothing is bound (most calls), the keys close here.
        if !ended || (!state::queued_anywhere() && !state::any_bindings()) {
            return;
        }
        if let Some(store) = self.store.take() {
            self.step.written(Written {
                store,
                name: self.name,
                when: self.when,
            });
        }
    }
}

/// How long the module works on waiters in one go before it lets the server answer other
/// clients (as Redis's own active expiry works in slices).
const SLICE: Duration = Duration::from_millis(2);

/// Waiters answered and permits given back since the module loaded: a slice ends only after
/// real work, so the first answer due after a command comes before the next command is read.
static ANSWERED: AtomicUsize = AtomicUsize::new(0);

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
            answered_at_start: ANSWERED.load(Ordering::Relaxed),
        }
    }

    /// Over once its time is up, and it answered somebody or took `steps` of `max_steps`
    /// without (bookkeeping, such as a database's lines listed or a set waiter handed on,
    /// never holds back the first answer, which a preempted process would otherwise give
    /// only after the server read the next command).
    pub fn is_over(&self, steps: u32, max_steps: u32) -> bool {
        let worked =
            ANSWERED.load(Ordering::Relaxed) != self.answered_at_start || steps >= max_steps;
        worked && Instant::now() >= self.end
    }
}

/// Counts a permit given back as work done in the slice.
pub fn gave_back() {
    ANSWERED.fetch_add(1, Ordering::Relaxed);
}

/// What became of a wait, handed to Redis with the unblocked client and back to [`reply`] and
/// [`free`].
#[derive(Debug)]
pub enum Outcome {
    /// Permits on one semaphore.
    Granted {
        binding: Binding,
        grant: grant::Grant,
        with_ticket: bool,
        /// Whether the client got the reply; if not, a new permit is given back.
        delivered: bool,
    },
    /// Permits on each of a set's semaphores, in the order named.
    GrantedSet {
        grants: Vec<(Binding, grant::Grant)>,
        with_ticket: bool,
        delivered: bool,
    },
    /// The wait ended without a permit.
    TimedOut,
    /// `SEM.WAITEMPTY`: the semaphore has no live holder (reply 1).
    Emptied,
    /// `SEM.WAITEMPTY`: the wait ended while it still had one (reply 0).
    NotEmptied,
    Failed(SemError),
}

/// The reply of an unblocked waiter.
pub fn reply(outcome: &mut Outcome) -> RedisResult {
    match outcome {
        Outcome::Granted {
            binding,
            grant,
            with_ticket,
            delivered,
        } => {
            // Delivered: nothing is given back, so the identifier moves into the reply.
            *delivered = true;
            let id = RedisValue::StringBuffer(std::mem::take(&mut binding.holder));
            Ok(grant::reply(id, [grant.ticket], false, *with_ticket))
        }
        Outcome::GrantedSet {
            grants,
            with_ticket,
            delivered,
        } => {
            *delivered = true;
            let holder = grants
                .first_mut()
                .map(|(b, _)| std::mem::take(&mut b.holder))
                .unwrap_or_default();
            let tickets = grants.iter().map(|(_, g)| g.ticket);
            Ok(grant::reply(
                RedisValue::StringBuffer(holder),
                tickets,
                true,
                *with_ticket,
            ))
        }
        Outcome::TimedOut => Ok(RedisValue::Null),
        Outcome::Emptied => Ok(RedisValue::Integer(1)),
        Outcome::NotEmptied => Ok(RedisValue::Integer(0)),
        Outcome::Failed(err) => Err(err.clone().into()),
    }
}

/// The end of an unblocked waiter. New permits granted to a client that disconnected before
/// its reply went out are given back (a renewal only moved a deadline: never).
pub fn free(outcome: Outcome) {
    let grants = match outcome {
        Outcome::Granted {
            binding,
            grant,
            delivered: false,
            ..
        } => vec![(binding, grant)],
        Outcome::GrantedSet {
            grants,
            delivered: false,
            ..
        } => grants,
        _ => return,
    };
    for (binding, _) in grants.into_iter().filter(|(_, g)| !g.renewed) {
        defer(Work::GiveBack(binding, GiveBack::Undelivered));
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
    while state::queued_anywhere() {
        let head = with(|s| {
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
        let bind_to = ask.bound.then_some(client);
        let sem_ref = (sem.db, &*sem.name);
        let granted = grant::try_grant(
            store,
            sem_ref,
            &ask,
            &holder,
            clock_ms(),
            Try::Acquire,
            bind_to,
        );
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
    // The next lease end matters only to a line still waited (a walk of the holders).
    let next = state::is_waited(sem).then(|| store.next_deadline(now_ms));
    let due = with(|s| {
        if let Some(next) = next.filter(|_| s.registry.is_waited(sem)) {
            s.registry.set_lease_end(sem, next);
        }
        s.registry.next_due_ms()
    });
    if let Some(at) = due {
        timer::arm(at, now_ms);
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
    if with(|s| s.registry.waiting_for_empty(sem)) == 0 {
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
        timer::disarm();
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
    ANSWERED.fetch_add(1, Ordering::Relaxed);
    block::unblock(handle, Box::into_raw(Box::new(outcome)).cast());
}
