//! Waiting inside the server: the wait queue's rules (`queue.rs`) applied to Redis.
//!
//! Everything that can free a permit ends in [`serve`], which grants the head of the line while
//! the acquire rule would grant it, on the same open keys: a release or a refresh inside its own
//! command (so the grant is replicated with what freed it, in one MULTI/EXEC), and the module's
//! timer for what happens outside any command of ours: a lease running out, a wait ending, a
//! connection with BOUND permits closing, another client deleting or overwriting the keys, a
//! flush. Work that Redis reports where keys must not be written (disconnect and free callbacks,
//! the command filter) is deferred to the timer, which fires right after the current command.

use std::collections::BTreeSet;
use std::os::raw::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use redis_module::{Context, RedisResult, RedisString, RedisValue};

use crate::config;
use crate::error::SemError;
use crate::fencing;
use crate::keys::{with_derived, COUNTER_SUFFIX, LIMIT_SUFFIX, OWNER_SUFFIX, PERMITS_SUFFIX};
use crate::memory;
use crate::queue::{Ask, Binding, Due, IdMap, Registry, SemKey, WaiterId, Wants};
use crate::semaphore::{self, AcquireRequest, Acquired, Holder};
use crate::server::block::{self, Blocked};
use crate::server::events::{self, Needs};
pub use crate::server::hooks::Left;
use crate::server::key::Access;
use crate::server::memory as server_memory;
use crate::server::names as server_names;
use crate::server::{
    clock_ms, cluster_can_serve, is_primary, is_valkey, select_db, timer, writes_paused,
};
use crate::stats::{self, COUNTERS};
use crate::store::{RedisStore, SemKeys};

/// What became of a wait, handed to Redis with the unblocked client and back to [`reply`] and
/// [`free`].
#[derive(Debug)]
pub enum Outcome {
    Granted {
        binding: Binding,
        ticket: Option<u64>,
        with_ticket: bool,
        /// Whether the grant only renewed a live permit of the identifier (which may be
        /// another connection's): that one is never given back.
        renewed: bool,
        /// Whether the client got the reply; if not, a new permit is given back.
        delivered: bool,
    },
    /// A set waiter's grant: one per semaphore, in the order named.
    GrantedSet {
        holder: Vec<u8>,
        grants: Vec<SetGrant>,
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

/// One semaphore's part of a set waiter's grant.
#[derive(Debug)]
pub struct SetGrant {
    binding: Binding,
    ticket: Option<u64>,
    /// Whether it only renewed a live permit of the identifier (never given back).
    renewed: bool,
}

/// Work to do from the timer, where keys may be written.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Work {
    /// Serve the line of one semaphore.
    Serve(SemKey),
    /// Serve every line in one database, or in all.
    ServeDb(Option<i32>),
    /// Try to grant a set waiter that heads every line it stands in: it needs the keys of
    /// several semaphores, which only the timer may open (a command declares its own only).
    ServeSet(WaiterId),
    /// Give a permit back.
    GiveBack(Binding, GiveBack),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum GiveBack {
    /// Its BOUND connection closed.
    ConnectionClosed,
    /// Its grant never reached the waiter.
    Undelivered,
}

#[derive(Default)]
struct State {
    registry: Registry<Blocked>,
    /// Blocked-client handles to their waiters, for the disconnect callback.
    by_handle: IdMap<usize, WaiterId>,
    work: BTreeSet<Work>,
}

static STATE: Mutex<Option<State>> = Mutex::new(None);
/// Waiters and bindings, readable without the lock: the hot paths of commands and the filter
/// only look further when they are not zero.
static WAITERS: AtomicUsize = AtomicUsize::new(0);
static BINDINGS: AtomicUsize = AtomicUsize::new(0);
/// Work waiting for the timer.
static PENDING: AtomicUsize = AtomicUsize::new(0);

/// Runs `f` on the state. Never call into Redis inside: a callback could come back here.
fn with<T>(f: impl FnOnce(&mut State) -> T) -> T {
    let (result, waiters, bindings) = {
        let mut guard: MutexGuard<'_, Option<State>> = STATE
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let state = guard.get_or_insert_with(State::default);
        let result = f(state);
        let (waiters, bindings) = (state.registry.total_waiters(), state.registry.bound_count());
        if waiters == 0 && WAITERS.load(Ordering::Relaxed) != 0 {
            server_names::forget_all();
        }
        WAITERS.store(waiters, Ordering::Relaxed);
        BINDINGS.store(bindings, Ordering::Relaxed);
        PENDING.store(state.work.len(), Ordering::Relaxed);
        (result, waiters, bindings)
    };
    if SCOPES.load(Ordering::Relaxed) == 0 && events::can_end(waiters > 0, bindings > 0) {
        // Some events are not needed any more: the timer ends them right after this callback
        // (never here: it may run inside the server's walk of its listeners).
        timer::arm_now();
    }
    result
}

/// Commands of the module and timer runs under way (a module's call from a keyspace event may
/// run one inside another).
static SCOPES: AtomicUsize = AtomicUsize::new(0);

/// Runs a command (`from_timer`: a timer run) that may end the last wait or BOUND permit; at its
/// end the events nothing needs any more end, where the server walks none of its lists of
/// listeners: the timer, and a command of a connection (a script's or a module's call may run
/// from inside a walk: then the timer ends them right after).
pub fn scope<T>(ctx: &Context, from_timer: bool, work: impl FnOnce() -> T) -> T {
    struct Leave;
    impl Drop for Leave {
        fn drop(&mut self) {
            SCOPES.fetch_sub(1, Ordering::Relaxed);
        }
    }
    SCOPES.fetch_add(1, Ordering::Relaxed);
    let leave = Leave;
    let result = work();
    drop(leave);
    if SCOPES.load(Ordering::Relaxed) == 0 && events::can_end(queued_anywhere(), any_bindings()) {
        if from_timer || block::from_connection(ctx) {
            settle(ctx);
        } else {
            timer::arm_now();
        }
    }
    result
}

/// A permit was granted BOUND to the caller's connection: follow connections closing.
pub fn follow_bound(ctx: &Context) {
    events::follow(ctx.ctx, Needs::Bound);
}

/// Forgets everything (a new load of the module; an unload is refused while anybody waits or
/// holds a BOUND permit, so nothing is lost).
pub fn reset() {
    with(|s| *s = State::default());
}

/// Whether anybody waits for any semaphore (no lock).
pub fn queued_anywhere() -> bool {
    WAITERS.load(Ordering::Relaxed) > 0
}

/// Whether another hand's change to a key may concern a waiter: somebody waits, and no command
/// of the module or timer run is under way (those serve the lines they write themselves).
pub fn follows_foreign_changes() -> bool {
    queued_anywhere() && SCOPES.load(Ordering::Relaxed) == 0
}

/// Waiters of `sem`, without taking the lock when nobody waits anywhere.
pub fn queued(sem: &SemKey) -> usize {
    if WAITERS.load(Ordering::Relaxed) == 0 {
        return 0;
    }
    with(|s| s.registry.queued(sem))
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
    if WAITERS.load(Ordering::Relaxed) == 0 {
        return Line::default();
    }
    with(|s| Line {
        waiters: s.registry.queued(sem),
        longest_wait_ms: s.registry.longest_wait_ms(sem, now_ms),
        ages_ms: s.registry.ages_ms(sem, now_ms),
        waiting_for_empty: s.registry.waiting_for_empty(sem),
    })
}

/// Whether anybody waits for `sem`, for permits or for it to empty.
fn is_waited(sem: &SemKey) -> bool {
    WAITERS.load(Ordering::Relaxed) > 0 && with(|s| s.registry.is_waited(sem))
}

/// Whether anybody waits for the semaphore `name` of database `db`.
pub fn waits_on(db: i32, name: &[u8]) -> bool {
    WAITERS.load(Ordering::Relaxed) > 0
        && is_waited(&SemKey {
            db,
            name: name.to_vec(),
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

/// Whether some connection holds BOUND permits.
pub fn any_bindings() -> bool {
    BINDINGS.load(Ordering::Relaxed) > 0
}

/// Blocks the caller at the end of `sem`'s line. The timer is armed for its wait's end and the
/// next lease end (`next_deadline`, the soonest deadline of a live holder).
pub fn wait(
    ctx: &Context,
    sem: SemKey,
    ask: Ask,
    now_ms: i64,
    wait_ms: i64,
    next_deadline: Option<i64>,
) -> Result<(), SemError> {
    block_caller(ctx, sem, Some(ask), now_ms, wait_ms, next_deadline)
}

/// Blocks the caller until `sem` has no live holder (`SEM.WAITEMPTY`); the timer is armed for
/// its wait's end and the next lease end.
pub fn wait_empty(
    ctx: &Context,
    sem: SemKey,
    now_ms: i64,
    wait_ms: i64,
    next_deadline: Option<i64>,
) -> Result<(), SemError> {
    block_caller(ctx, sem, None, now_ms, wait_ms, next_deadline)
}

/// Blocks the caller at the end of the line of every semaphore of a set acquire (`parts`), each
/// with its soonest lease end (`next_deadlines`, in the same order).
pub fn wait_set(
    ctx: &Context,
    parts: Vec<(SemKey, Ask)>,
    now_ms: i64,
    wait_ms: i64,
    next_deadlines: Vec<Option<i64>>,
) -> Result<(), SemError> {
    let sems: Vec<SemKey> = parts.iter().map(|(sem, _)| sem.clone()).collect();
    check_room(&sems)?;
    events::follow_waits(ctx.ctx)?;
    if parts.iter().any(|(_, ask)| ask.bound) {
        events::follow(ctx.ctx, Needs::Bound);
    }
    let blocked = block::block(ctx).ok_or(SemError::CannotWait)?;
    let key = blocked.key();
    let client = block::client_id(ctx);
    let until = (wait_ms > 0).then(|| now_ms.saturating_add(wait_ms));
    for sem in &sems {
        server_names::watch(sem.db, &sem.name);
    }
    let due = with(|s| {
        let id = s
            .registry
            .enqueue_set(parts, client, now_ms, until, blocked);
        s.by_handle.insert(key, id);
        for (sem, next) in sems.iter().zip(next_deadlines) {
            s.registry.set_lease_end(sem, next);
        }
        s.registry.next_due_ms()
    });
    if let Some(at) = due {
        timer::arm(at, now_ms);
    }
    Ok(())
}

/// Whether one more may wait for each of `sems` (`sem.max-waiters-per-semaphore`), on the
/// server (`sem.max-waiters`), and in the memory waiters may take (`memory.rs`).
fn check_room(sems: &[SemKey]) -> Result<(), SemError> {
    with(|s| {
        let per_semaphore = config::MAX_WAITERS_PER_SEMAPHORE.get();
        let total = config::MAX_WAITERS.get();
        let crowded = sems.iter().any(|sem| {
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

/// Blocks the caller for permits (`ask`) or for `sem` to empty (`None`).
fn block_caller(
    ctx: &Context,
    sem: SemKey,
    ask: Option<Ask>,
    now_ms: i64,
    wait_ms: i64,
    next_deadline: Option<i64>,
) -> Result<(), SemError> {
    check_room(std::slice::from_ref(&sem))?;
    events::follow_waits(ctx.ctx)?;
    if ask.as_ref().is_some_and(|ask| ask.bound) {
        events::follow(ctx.ctx, Needs::Bound);
    }
    let blocked = block::block(ctx).ok_or(SemError::CannotWait)?;
    let key = blocked.key();
    let client = block::client_id(ctx);
    let until = (wait_ms > 0).then(|| now_ms.saturating_add(wait_ms));
    server_names::watch(sem.db, &sem.name);
    let due = with(|s| {
        let id = match ask {
            Some(ask) => s
                .registry
                .enqueue(sem.clone(), client, ask, now_ms, until, blocked),
            None => s
                .registry
                .enqueue_empty(sem.clone(), client, now_ms, until, blocked),
        };
        s.by_handle.insert(key, id);
        s.registry.set_lease_end(&sem, next_deadline);
        s.registry.next_due_ms()
    });
    if let Some(at) = due {
        timer::arm(at, now_ms);
    }
    Ok(())
}

/// After a grant of `holder` in `sem` (made lazily: most grants need neither): a give-back of
/// its old permit still pending must not take the new one; a BOUND grant binds the permit to
/// connection `bind_to`; another new permit of the identifier ends an old binding of it, whose
/// permit is gone.
pub fn after_grant(sem: impl Fn() -> SemKey, holder: &[u8], renewed: bool, bind_to: Option<u64>) {
    granted_again(&sem, holder);
    match bind_to {
        Some(client) => {
            let binding = Binding {
                sem: sem(),
                holder: holder.to_vec(),
            };
            with(|s| s.registry.bind(client, binding));
        }
        None if !renewed && any_bindings() => {
            let binding = Binding {
                sem: sem(),
                holder: holder.to_vec(),
            };
            with(|s| s.registry.unbind(&binding));
        }
        None => {}
    }
}

/// Forgets the bindings of permits a write found gone: every binding of the semaphore when its
/// holder set was missing (its key expired, or another client deleted it), else those the write
/// removed (released, lost, or pruned as expired).
pub fn forget_gone(store: &mut RedisStore, sem: &SemKey) {
    // Taken even when nothing is bound: what they tell is about this moment only.
    let removed = store.take_removed();
    let opened_empty = store.take_opened_empty();
    if !any_bindings() {
        return;
    }
    if opened_empty {
        with(|s| s.registry.unbind_all(sem));
    } else {
        unbind(sem, &removed);
    }
}

/// Forgets the bindings of permits that are gone: released, lost, or pruned as expired.
fn unbind(sem: &SemKey, holders: &[RedisString]) {
    if !any_bindings() {
        return;
    }
    with(|s| {
        for holder in holders {
            s.registry.unbind(&Binding {
                sem: sem.clone(),
                holder: holder.as_slice().to_vec(),
            });
        }
    });
}

/// How long the module works on waiters in one go before it lets the server answer other
/// clients (as Redis's own active expiry works in slices).
const SLICE: Duration = Duration::from_millis(2);

/// Steps a slice takes without answering anybody before its time may end it: bookkeeping (a
/// database's lines listed, a set waiter handed on) never holds back the first answer, which a
/// preempted process would otherwise give only after the server read the next command.
const IDLE_STEPS: u32 = 1000;

/// Waiters answered and permits given back since the module loaded: a slice ends only after
/// real work, so the first answer due after a command comes before the next command is read.
static ANSWERED: AtomicUsize = AtomicUsize::new(0);

/// The end of a slice of work.
pub struct Slice {
    end: Instant,
    answered_at_start: usize,
    steps: std::cell::Cell<u32>,
}

impl Slice {
    pub fn start() -> Slice {
        Slice {
            end: Instant::now() + SLICE,
            answered_at_start: ANSWERED.load(Ordering::Relaxed),
            steps: std::cell::Cell::new(0),
        }
    }

    /// One more step of the timer's work.
    fn step(&self) {
        self.steps.set(self.steps.get().saturating_add(1));
    }

    fn is_over(&self) -> bool {
        let worked = ANSWERED.load(Ordering::Relaxed) != self.answered_at_start
            || self.steps.get() >= IDLE_STEPS;
        worked && Instant::now() >= self.end
    }
}

/// Grants the head of `sem`'s line while the acquire rule would, on keys already open, each
/// grant at the server's time read for it; then schedules the next lease end. Call it after
/// every change that may free a permit. When `slice` runs out, the timer goes on after the
/// server has answered other clients.
pub fn serve(store: &mut RedisStore, sem: &SemKey, slice: &Slice) {
    if !is_waited(sem) {
        return;
    }
    stats::count(&COUNTERS.lines_served);
    loop {
        let head = with(|s| {
            let head = s.registry.head(sem)?;
            Some(match head.ask() {
                Some(ask) => Head::Permits(head.id, ask.clone()),
                None => Head::Set(head.id, s.registry.heads_every_line(head.id)),
            })
        });
        let (id, ask) = match head {
            Some(Head::Permits(id, ask)) => (id, ask),
            // A set waiter: the timer serves it once it heads all of its lines (it needs their
            // keys); until then nobody behind it here is served.
            Some(Head::Set(id, true)) => {
                defer(Work::ServeSet(id));
                break;
            }
            Some(Head::Set(_, false)) | None => break,
        };
        if slice.is_over() {
            defer(Work::Serve(sem.clone()));
            break;
        }
        let now_ms = clock_ms();
        store.keep_removed();
        let holder = store.id(&ask.holder);
        let request = AcquireRequest {
            kind: ask.kind,
            limit: ask.limit,
            lease_ms: ask.lease_ms,
            count: ask.count,
            ticket_floor: fencing::floor(),
        };
        let result = semaphore::acquire(store, now_ms, &holder, &request);
        // Bindings of permits this step removed go first: one may be an expired permit of the
        // identifier granted now.
        forget_gone(store, sem);
        let outcome = match result {
            Ok(Acquired::Full) | Err(SemError::KindMismatch { .. }) => break,
            Ok(Acquired::Granted { ticket, renewed }) => {
                store.record_grant(&ask.holder, renewed);
                let bind_to = ask
                    .bound
                    .then(|| with(|s| s.registry.waiter(id).map(|w| w.client)))
                    .flatten();
                after_grant(|| sem.clone(), &ask.holder, renewed, bind_to);
                let binding = Binding {
                    sem: sem.clone(),
                    holder: ask.holder.clone(),
                };
                Outcome::Granted {
                    binding,
                    ticket,
                    with_ticket: ask.with_ticket,
                    renewed,
                    delivered: false,
                }
            }
            Err(err) => Outcome::Failed(err),
        };
        answer(id, outcome);
    }
    let now_ms = clock_ms();
    answer_if_empty(store, sem, now_ms);
    // The next lease end matters only to a line still waited (a walk of the holders).
    let next = is_waited(sem).then(|| store.next_deadline(now_ms));
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
    for waiter in with(|s| {
        let waiters = s.registry.take_empties(sem);
        for waiter in &waiters {
            s.by_handle.remove(&waiter.handle.key());
        }
        waiters
    }) {
        let outcome = match &failed {
            None => Outcome::Emptied,
            Some(err) => Outcome::Failed(err.clone()),
        };
        end_wait(waiter.handle, outcome, true);
    }
    disarm_if_idle();
}

/// The head of a line, as [`serve`] sees it.
enum Head {
    Permits(WaiterId, Ask),
    /// A set waiter, and whether it heads every line it stands in.
    Set(WaiterId, bool),
}

/// Takes waiter `id` out of its line and unblocks it with `outcome`.
fn answer(id: WaiterId, outcome: Outcome) {
    let waiter = with(|s| {
        let waiter = s.registry.remove(id)?;
        s.by_handle.remove(&waiter.handle.key());
        Some(waiter)
    });
    if let Some(waiter) = waiter {
        let for_empty = waiter.for_empty();
        end_wait(waiter.handle, outcome, for_empty);
    }
    disarm_if_idle();
}

/// Unblocks a waiter already taken out of its line (of waiters for permits, or `for_empty`),
/// counting how its wait ended.
fn end_wait(handle: Blocked, outcome: Outcome, for_empty: bool) {
    if matches!(
        outcome,
        Outcome::Granted { .. } | Outcome::GrantedSet { .. }
    ) {
        stats::WAIT_TIME.record(handle.waited());
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

/// Stops the timer once nobody waits and nothing is left to do: an armed timer keeps
/// `MODULE UNLOAD` refused.
fn disarm_if_idle() {
    if with(|s| s.registry.next_due_ms().is_none() && s.work.is_empty()) {
        timer::disarm();
    }
}

/// The reply of an unblocked waiter.
fn reply(outcome: &mut Outcome) -> RedisResult {
    match outcome {
        Outcome::Granted {
            binding,
            ticket,
            with_ticket,
            delivered,
            ..
        } => {
            *delivered = true;
            let id = RedisValue::StringBuffer(binding.holder.clone());
            Ok(match ticket {
                Some(ticket) if *with_ticket => {
                    RedisValue::Array(vec![id, RedisValue::Integer(*ticket as i64)])
                }
                _ => id,
            })
        }
        Outcome::GrantedSet {
            holder,
            grants,
            with_ticket,
            delivered,
        } => {
            *delivered = true;
            let id = RedisValue::StringBuffer(holder.clone());
            Ok(if *with_ticket {
                let tickets = grants
                    .iter()
                    .map(|grant| RedisValue::Integer(grant.ticket.unwrap_or(0) as i64))
                    .collect();
                RedisValue::Array(vec![id, RedisValue::Array(tickets)])
            } else {
                id
            })
        }
        Outcome::TimedOut => Ok(RedisValue::Null),
        Outcome::Emptied => Ok(RedisValue::Integer(1)),
        Outcome::NotEmptied => Ok(RedisValue::Integer(0)),
        Outcome::Failed(err) => Err(err.clone().into()),
    }
}

/// The reply hook: `data` is the `Outcome` that [`end_wait`] handed to the unblocked client.
pub fn reply_hook(data: *mut c_void) -> RedisResult {
    // SAFETY: `end_wait` hands over a boxed `Outcome`, which Redis keeps until the free hook
    // and nothing else touches while the reply is made.
    reply(unsafe { &mut *data.cast::<Outcome>() })
}

/// The free hook: `data` is the `Outcome` that [`end_wait`] handed over, now done with.
pub fn free_hook(data: *mut c_void, disconnected: bool) {
    // SAFETY: as for `reply_hook`; Redis calls the free hook once, last.
    let outcome = unsafe { Box::from_raw(data.cast::<Outcome>()) };
    free(*outcome, disconnected);
}

/// The end of an unblocked waiter. A new permit granted to a client that disconnected before
/// its reply went out is given back.
fn free(outcome: Outcome, _disconnected: bool) {
    match outcome {
        Outcome::Granted {
            binding,
            renewed: false,
            delivered: false,
            ..
        } => defer(Work::GiveBack(binding, GiveBack::Undelivered)),
        Outcome::GrantedSet {
            grants,
            delivered: false,
            ..
        } => {
            for grant in grants.into_iter().filter(|grant| !grant.renewed) {
                defer(Work::GiveBack(grant.binding, GiveBack::Undelivered));
            }
        }
        _ => {}
    }
}

/// A waiter left on its own: it disconnected, or `CLIENT UNBLOCK` ended its wait. Returns
/// whether it was still waiting; if not, the module already answered it (Redis reports a
/// disconnect even then, until the answer is processed) and its outcome reaches [`free`].
pub fn left(handle: usize) -> Left {
    let waiter = with(|s| {
        let id = s.by_handle.remove(&handle)?;
        s.registry.remove(id)
    });
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

/// `holder` of `sem` was granted again (renewed, or a new permit) by a command or a waiter's
/// grant: a give-back of its old permit still pending (its BOUND connection closed in the same
/// moment) must not take the new one away.
fn granted_again(sem: impl Fn() -> SemKey, holder: &[u8]) {
    // Give-backs are work for the timer: with none pending there is nothing to take back.
    if !any_pending() {
        return;
    }
    let binding = Binding {
        sem: sem(),
        holder: holder.to_vec(),
    };
    with(|s| {
        for why in [GiveBack::ConnectionClosed, GiveBack::Undelivered] {
            s.work.remove(&Work::GiveBack(binding.clone(), why));
        }
    });
}

/// Whether work waits for the timer (no lock).
fn any_pending() -> bool {
    PENDING.load(Ordering::Relaxed) > 0
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
    if WAITERS.load(Ordering::Relaxed) > 0 {
        defer(Work::ServeDb(db));
    }
}

/// `SWAPDB a b`: bindings follow their keys; waiters stay with their connection's database and
/// are served on what it holds now.
pub fn swapped(a: i32, b: i32) {
    stats::forget_grants();
    with(|s| s.registry.swap_binding_dbs(a, b));
    if WAITERS.load(Ordering::Relaxed) > 0 {
        defer(Work::ServeDb(Some(a)));
        defer(Work::ServeDb(Some(b)));
    }
}

/// The data may have changed under every semaphore (a load ended, a slot moved): serve all.
pub fn recheck_all() {
    if WAITERS.load(Ordering::Relaxed) > 0 {
        defer(Work::ServeDb(None));
    }
}

/// The server became a replica: it grants nothing any more, so every waiter is answered now,
/// and bindings end (the primary's data replaces this node's).
pub fn became_replica() {
    stats::forget_grants();
    let waiters = with(|s| {
        s.by_handle.clear();
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
                name: name.to_vec(),
            })
            .filter(|sem| s.registry.is_waited(sem))
            .collect()
    });
    for sem in waited {
        defer(Work::Serve(sem));
    }
}

/// Hands `work` to the timer, which does it right after the current command, in the same turn
/// of the event loop: before the server reads another command.
fn defer(work: Work) {
    with(|s| s.work.insert(work));
    timer::arm_now();
}

/// The module's timer fired: end the waits that are over, serve the semaphores whose lease
/// ended, and do the deferred work, one item at a time, each at the time read for it. Work
/// left when the slice runs out goes on at the next turn of the event loop, after other
/// clients are answered.
pub fn on_timer(ctx: &Context) {
    scope(ctx, true, || timer_run(ctx));
}

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
    loop {
        if slice.is_over() {
            stats::count(&COUNTERS.timer_runs_continued);
            let now = clock_ms();
            timer::arm(now, now);
            return;
        }
        slice.step();
        if let Some(due) = with(|s| s.registry.take_one_due(clock_ms())) {
            let sems = match due {
                Due::Timeout(id) => time_up(id),
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
            Work::Serve(sem) => serve_outside(ctx, &sem, &slice),
            Work::ServeDb(db) => with(|s| {
                let sems = s.registry.waited(db);
                s.work.extend(sems.into_iter().map(Work::Serve));
            }),
            Work::GiveBack(binding, why) => {
                give_back(ctx, &binding, why);
                with(|s| s.work.insert(Work::Serve(binding.sem)));
            }
            Work::ServeSet(id) => serve_set(ctx, id),
        }
    }
    if let Some(at) = with(|s| s.registry.next_due_ms()) {
        timer::arm(at, clock_ms());
    }
}

/// Ends the events nothing needs now (see [`scope`]): other commands stop paying for them; and
/// the timer once nothing is left for it.
fn settle(ctx: &Context) {
    let (waiting, bound) = (queued_anywhere(), any_bindings());
    if !events::can_end(waiting, bound) {
        return;
    }
    events::settle(ctx.ctx, waiting, bound);
    if !waiting && !bound && !any_pending() && with(|s| s.registry.next_due_ms()).is_none() {
        timer::disarm();
    }
}

/// Waiter `id`'s time is up: nil for permits, 0 for a wait for empty. Returns the lines it
/// stood in.
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

/// Runs `work` on `sem`'s keys outside any command of ours: in its database, and in Redis
/// Cluster only where this node may serve all three keys. `Err` when the keys cannot be used.
fn with_store(
    ctx: &Context,
    sem: &SemKey,
    work: impl FnOnce(&mut RedisStore),
) -> Result<(), SemError> {
    let names = KeyNames::of(ctx, sem)?;
    let mut store = RedisStore::open(ctx, &names.keys(), Access::Write)?;
    store.keep_removed();
    work(&mut store);
    forget_gone(&mut store, sem);
    Ok(())
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
/// grant its count, all in one step at the time read now; then whoever stands behind it may
/// fit. If not, it stays where it is (and holds its lines) until one of them changes again.
fn serve_set(ctx: &Context, id: WaiterId) {
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
    let sems: Vec<SemKey> = parts.iter().map(|(sem, _)| sem.clone()).collect();
    let names: Result<Vec<KeyNames>, SemError> =
        sems.iter().map(|sem| KeyNames::of(ctx, sem)).collect();
    let stores: Result<Vec<RedisStore>, SemError> =
        names.as_ref().map_err(Clone::clone).and_then(|names| {
            names
                .iter()
                .map(|names| {
                    let mut store = RedisStore::open(ctx, &names.keys(), Access::Write)?;
                    store.keep_removed();
                    Ok(store)
                })
                .collect()
        });
    let mut stores = match stores {
        Ok(stores) => stores,
        Err(err) => {
            answer(id, Outcome::Failed(err));
            with(|s| s.work.extend(sems.into_iter().map(Work::Serve)));
            return;
        }
    };
    let now = clock_ms();
    let holder = stores[0].id(&parts[0].1.holder);
    let requests: Vec<AcquireRequest> = parts
        .iter()
        .map(|(_, ask)| AcquireRequest {
            kind: ask.kind,
            limit: ask.limit,
            lease_ms: ask.lease_ms,
            count: ask.count,
            ticket_floor: fencing::floor(),
        })
        .collect();
    let fits: Result<bool, SemError> = stores
        .iter()
        .zip(&requests)
        .try_fold(true, |all, (store, request)| {
            Ok(semaphore::would_grant(store, now, &holder, request)? && all)
        });
    match fits {
        // The grants forget the bindings of what they removed, store by store.
        Ok(true) => grant_set(&mut stores, &parts, &requests, &holder, client, id, now),
        Ok(false) => {
            // It stays at the head: its lines are looked at again when they change or a lease
            // in them ends.
            let due = with(|s| {
                for (sem, store) in sems.iter().zip(&stores) {
                    s.registry.set_lease_end(sem, store.next_deadline(now));
                }
                s.registry.next_due_ms()
            });
            if let Some(at) = due {
                timer::arm(at, now);
            }
            return;
        }
        Err(err) => {
            // Nothing was written; a holder set found gone still ends its bindings.
            for (sem, store) in sems.iter().zip(stores.iter_mut()) {
                forget_gone(store, sem);
            }
            answer(id, Outcome::Failed(err));
        }
    }
    drop(stores);
    with(|s| s.work.extend(sems.into_iter().map(Work::Serve)));
}

/// Makes the grants of a set waiter that fits everywhere (surveyed at `now`), then answers it.
fn grant_set(
    stores: &mut [RedisStore],
    parts: &[(SemKey, Ask)],
    requests: &[AcquireRequest],
    holder: &RedisString,
    client: u64,
    id: WaiterId,
    now: i64,
) {
    let mut grants = Vec::with_capacity(parts.len());
    for ((store, (sem, ask)), request) in stores.iter_mut().zip(parts).zip(requests) {
        let (ticket, renewed) = match semaphore::acquire(store, now, holder, request) {
            Ok(Acquired::Granted { ticket, renewed }) => (ticket, renewed),
            // Nothing changed since the survey: neither can happen.
            Ok(Acquired::Full) | Err(_) => {
                answer(id, Outcome::Failed(SemError::Internal));
                return;
            }
        };
        store.record_grant(&ask.holder, renewed);
        // Bindings of permits this grant removed go first (as in `serve`).
        forget_gone(store, sem);
        after_grant(
            || sem.clone(),
            &ask.holder,
            renewed,
            ask.bound.then_some(client),
        );
        let binding = Binding {
            sem: sem.clone(),
            holder: ask.holder.clone(),
        };
        grants.push(SetGrant {
            binding,
            ticket,
            renewed,
        });
    }
    stats::count(&COUNTERS.set_acquired);
    answer(
        id,
        Outcome::GrantedSet {
            holder: parts[0].1.holder.clone(),
            grants,
            with_ticket: parts[0].1.with_ticket,
            delivered: false,
        },
    );
}

/// Serves `sem`'s line from the timer. If its keys cannot be used (overwritten with another
/// type, or the slot left this node), every waiter is answered with the reason.
fn serve_outside(ctx: &Context, sem: &SemKey, slice: &Slice) {
    if !is_waited(sem) {
        return;
    }
    if let Err(err) = with_store(ctx, sem, |store| serve(store, sem, slice)) {
        let waiters = with(|s| {
            let mut waiters = Vec::new();
            while let Some(id) = s.registry.head(sem).map(|w| w.id) {
                if let Some(waiter) = s.registry.remove(id) {
                    s.by_handle.remove(&waiter.handle.key());
                    waiters.push(waiter);
                }
            }
            for waiter in s.registry.take_empties(sem) {
                s.by_handle.remove(&waiter.handle.key());
                waiters.push(waiter);
            }
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
        disarm_if_idle();
    }
}

/// Gives `binding`'s permit back, if it is still held: its BOUND connection closed, or its
/// grant never reached the client.
fn give_back(ctx: &Context, binding: &Binding, why: GiveBack) {
    ANSWERED.fetch_add(1, Ordering::Relaxed);
    with(|s| s.registry.unbind(binding));
    let _ = with_store(ctx, &binding.sem, |store| {
        let holder = store.id(&binding.holder);
        if let Ok(Holder::Live) = semaphore::release(store, clock_ms(), &holder, None) {
            if why == GiveBack::ConnectionClosed {
                stats::count(&COUNTERS.bound_released);
                store.released(&binding.holder);
            }
            store.notify(c"sem.release");
        }
    });
}
