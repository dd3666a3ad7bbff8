//! The waiting side's state and its one owner (`Waiting`): the registry of waiters and BOUND
//! permits (`queue.rs`), the work left for the timer, the counts the hot paths read without a
//! borrow (waiters, bindings, pending work, commands under way, answers given) and the filter of
//! waited names the server's key callbacks ask first (`names.rs`, through the hooks table). A
//! change goes through [`with`], which keeps those counts and the names filter in step with the
//! registry and has the timer end the server events nothing needs any more; a look goes through
//! [`read`], which changes nothing. It also keeps what is followed of the server's events and
//! how the timer is armed (`server/events.rs`'s `Following`, `server/timer.rs`'s `Arming`),
//! which only those layer's functions change.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::Relaxed;
use std::thread::LocalKey;

use redis_module::{Context, RedisString};

use crate::names::Names;
use crate::queue::{Binding, Handle, Registry, SemKey, WaiterId};
use crate::server::block::{self, Blocked};
use crate::server::events::{self, Following};
use crate::server::timer::{self, Arming};

/// Work to do from the timer, where keys may be written.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Work {
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
pub enum GiveBack {
    /// Its BOUND connection closed.
    ConnectionClosed,
    /// Its grant never reached the waiter.
    Undelivered,
}

#[derive(Default)]
pub struct State {
    pub registry: Registry<Blocked>,
    pub work: BTreeSet<Work>,
}

/// The registry indexes waiters by their blocked-client handle, which the disconnect callback
/// names them by.
impl Handle for Blocked {
    fn key(&self) -> usize {
        Blocked::key(self)
    }
}

/// The one owner of the waiting side's state. What the hot paths and the server's callbacks
/// read (the counts, the names filter, what is followed, the timer as armed) is kept where it
/// is read without a borrow or a thread-local look-up; the registry and the timer's work sit
/// behind a borrow on the main thread.
struct Waiting {
    /// Borrowed by [`read`] and [`with`] only.
    state: &'static LocalKey<RefCell<Option<State>>>,
    /// Waiters and bindings: the hot paths of commands and the filter only look further when
    /// they are not zero.
    waiters: AtomicUsize,
    bindings: AtomicUsize,
    /// Work waiting for the timer.
    pending: AtomicUsize,
    /// Waiters answered and permits given back since the module loaded: a slice of work ends
    /// only after real work, so the first answer due after a command comes before the next
    /// command is read.
    answered: AtomicUsize,
    /// Commands of the module and timer runs under way (a module's call from a keyspace event
    /// may run one inside another).
    scopes: AtomicUsize,
    /// The names somebody waits on.
    names: Names,
    /// What is followed of the server's events now.
    following: Following,
    /// The module's timer, as armed.
    arming: Arming,
}

thread_local! {
    /// Redis runs every command, callback and timer on its main thread: a re-entry (a callback
    /// coming back while the state is borrowed) is a clear panic, never a deadlock.
    static STATE: RefCell<Option<State>> = const { RefCell::new(None) };
}

static WAITING: Waiting = Waiting {
    state: &STATE,
    waiters: AtomicUsize::new(0),
    bindings: AtomicUsize::new(0),
    pending: AtomicUsize::new(0),
    answered: AtomicUsize::new(0),
    scopes: AtomicUsize::new(0),
    names: Names::new(),
    following: Following::new(),
    arming: Arming::new(),
};

fn waiting<T>(f: impl FnOnce(&Waiting) -> T) -> T {
    f(&WAITING)
}

/// Looks at the state; changes nothing. Never call into Redis inside: a callback could come back
/// here.
pub fn read<T>(f: impl FnOnce(&State) -> T) -> T {
    waiting(|w| {
        w.state.with(|cell| match &*cell.borrow() {
            Some(state) => f(state),
            None => f(&State::default()),
        })
    })
}

/// Runs `f` with what is followed of the server's events (see `server/events.rs`).
pub fn following<T>(f: impl FnOnce(&Following) -> T) -> T {
    waiting(|w| f(&w.following))
}

/// Runs `f` with the module's timer as armed (see `server/timer.rs`).
pub fn arming<T>(f: impl FnOnce(&Arming) -> T) -> T {
    waiting(|w| f(&w.arming))
}

/// Counts an answer or a give-back as work done.
pub fn answered() {
    waiting(|w| w.answered.fetch_add(1, Relaxed));
}

/// Answers and give-backs so far (see [`answered`]).
pub fn answers() -> usize {
    waiting(|w| w.answered.load(Relaxed))
}

/// Somebody starts to wait on `name` of database `db` (see [`may_concern`]).
pub fn watch_name(db: i32, name: &[u8]) {
    waiting(|w| w.names.watch(db, name));
}

/// Whether `key` of database `db` may be a waited semaphore's, or one of its derived keys (the
/// names filter: a hash and a load).
pub fn may_concern(db: i32, key: &[u8]) -> bool {
    waiting(|w| w.names.may_concern(db, key))
}

/// Whether another hand's change to a key may concern a waiter: somebody waits, and no command
/// of the module or timer run is under way (those serve the lines they write themselves).
pub fn follows_foreign_changes() -> bool {
    waiting(|w| w.waiters.load(Relaxed) > 0 && w.scopes.load(Relaxed) == 0)
}

/// Changes the state with `f`. Never call into Redis inside: a callback could come back here.
pub fn with<T>(f: impl FnOnce(&mut State) -> T) -> T {
    let (result, waiters, bindings, scopes) = waiting(|w| {
        w.state.with(|cell| {
            let mut state = cell.borrow_mut();
            let state = state.get_or_insert_with(State::default);
            let result = f(state);
            let (waiters, bindings) =
                (state.registry.total_waiters(), state.registry.bound_count());
            if waiters == 0 && w.waiters.load(Relaxed) != 0 {
                w.names.forget_all();
            }
            w.waiters.store(waiters, Relaxed);
            w.bindings.store(bindings, Relaxed);
            w.pending.store(state.work.len(), Relaxed);
            (result, waiters, bindings, w.scopes.load(Relaxed))
        })
    });
    if scopes == 0 && following(|f| events::can_end(f, waiters > 0, bindings > 0)) {
        // Some events are not needed any more: the timer ends them right after this callback
        // (never here: it may run inside the server's walk of its listeners).
        arming(timer::arm_now);
    }
    result
}

/// Runs a command (`from_timer`: a timer run) that may end the last wait or BOUND permit; at its
/// end the events nothing needs any more end, where the server walks none of its lists of
/// listeners: the timer, and a command of a connection (a script's or a module's call may run
/// from inside a walk: then the timer ends them right after).
pub fn scope<T>(ctx: &Context, from_timer: bool, work: impl FnOnce() -> T) -> T {
    struct Leave;
    impl Drop for Leave {
        fn drop(&mut self) {
            waiting(|w| w.scopes.fetch_sub(1, Relaxed));
        }
    }
    waiting(|w| w.scopes.fetch_add(1, Relaxed));
    let leave = Leave;
    let result = work();
    drop(leave);
    let (waiters, bindings) = (queued_anywhere(), any_bindings());
    if waiting(|w| w.scopes.load(Relaxed)) == 0
        && following(|f| events::can_end(f, waiters, bindings))
    {
        if from_timer || block::from_connection(ctx) {
            settle(ctx);
        } else {
            arming(timer::arm_now);
        }
    }
    result
}

/// Ends the events nothing needs now (see [`scope`]): other commands stop paying for them; and
/// the timer once nothing is left for it.
fn settle(ctx: &Context) {
    let (waiting, bound) = (queued_anywhere(), any_bindings());
    if !following(|f| events::can_end(f, waiting, bound)) {
        return;
    }
    following(|f| events::settle(ctx.ctx, f, waiting, bound));
    if !waiting && !bound && !any_pending() && read(|s| s.registry.next_due_ms()).is_none() {
        arming(timer::disarm);
    }
}

/// Stops the timer once nobody waits and nothing is left to do: an armed timer keeps
/// `MODULE UNLOAD` refused.
pub fn disarm_if_idle() {
    if read(is_idle) {
        arming(timer::disarm);
    }
}

/// Whether nothing is left for the timer: no wait or lease end due, no work deferred.
pub fn is_idle(s: &State) -> bool {
    s.registry.next_due_ms().is_none() && s.work.is_empty()
}

/// Whether anybody waits for any semaphore (no borrow).
pub fn queued_anywhere() -> bool {
    waiting(|w| w.waiters.load(Relaxed) > 0)
}

/// Whether some connection holds BOUND permits.
pub fn any_bindings() -> bool {
    waiting(|w| w.bindings.load(Relaxed) > 0)
}

/// Whether work waits for the timer.
pub fn any_pending() -> bool {
    waiting(|w| w.pending.load(Relaxed) > 0)
}

/// Waiters of `sem`, without a borrow when nobody waits anywhere.
pub fn queued(sem: &SemKey) -> usize {
    if !queued_anywhere() {
        return 0;
    }
    read(|s| s.registry.queued(sem))
}

/// Whether anybody waits for `sem`, for permits or for it to empty.
pub fn is_waited(sem: &SemKey) -> bool {
    queued_anywhere() && read(|s| s.registry.is_waited(sem))
}

/// Hands `work` to the timer, which does it right after the current command, in the same turn
/// of the event loop: before the server reads another command.
pub fn defer(work: Work) {
    with(|s| s.work.insert(work));
    arming(timer::arm_now);
}

/// The bindings that follow a grant of `holder` in `sem`: a give-back of its old permit still
/// pending must not take the new one; a BOUND grant binds the permit to connection `bind_to`;
/// another new permit of the identifier ends an old binding of it, whose permit is gone. Looks
/// nothing up while nothing is bound or pending (most grants).
pub fn granted(sem: impl Fn() -> SemKey, holder: &[u8], renewed: bool, bind_to: Option<u64>) {
    let pending = any_pending();
    if !pending && bind_to.is_none() && (renewed || !any_bindings()) {
        return;
    }
    let binding = Binding {
        sem: sem(),
        holder: holder.to_vec(),
    };
    with(|s| {
        if pending {
            for why in [GiveBack::ConnectionClosed, GiveBack::Undelivered] {
                s.work.remove(&Work::GiveBack(binding.clone(), why));
            }
        }
        match bind_to {
            Some(client) => s.registry.bind(client, binding),
            None if !renewed => s.registry.unbind(&binding),
            None => {}
        }
    });
}

/// Forgets the bindings of permits a write found gone (`RedisStore::take_gone`): every binding of
/// the semaphore when its holder set was missing (`all`: its key expired, or another client
/// deleted it), else those of the holders it `removed` (released, lost, or pruned as expired).
pub fn forget_gone(sem: impl FnOnce() -> SemKey, all: bool, removed: &[RedisString]) {
    if !any_bindings() {
        return;
    }
    let sem = sem();
    with(|s| {
        if all {
            s.registry.unbind_all(&sem);
        } else {
            unbind(s, &sem, removed);
        }
    });
}

/// Forgets the bindings of `holders` of `sem`.
pub fn unbind(s: &mut State, sem: &SemKey, holders: &[RedisString]) {
    for holder in holders {
        s.registry.unbind(&Binding {
            sem: sem.clone(),
            holder: holder.as_slice().to_vec(),
        });
    }
}

/// Forgets everything (a new load of the module; an unload is refused while anybody waits or
/// holds a BOUND permit, so nothing is lost).
pub fn reset() {
    with(|s| *s = State::default());
}
