//! The module's one timer. The waiting side keeps its own schedule (wait ends, lease ends, work
//! to do after the current command); this arms a single Redis timer at the earliest of them.
//! What is armed ([`Arming`]) is kept by the waiting side's owner (`state.rs`) and changed only
//! here; the timer's callbacks hand on to the hooks, which come back here with it.

use std::os::raw::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
use std::sync::{Mutex, MutexGuard};

use redis_module::{raw, Context};

use crate::server::guard;
use crate::server::hooks::hooks;

/// A context of the module's own, for arming the timer where Redis passes none (the command
/// filter). Made at load, freed at unload: a handle, not state.
static DETACHED: AtomicPtr<raw::RedisModuleCtx> = AtomicPtr::new(std::ptr::null_mut());

/// The timer as armed: its id and when it fires (Unix ms; `i64::MIN`: at once), and whether a
/// post-notification job is asked for and not yet run.
pub struct Arming {
    armed: Mutex<Option<(raw::RedisModuleTimerID, i64)>>,
    job: AtomicBool,
}

impl Arming {
    pub const fn new() -> Arming {
        Arming {
            armed: Mutex::new(None),
            job: AtomicBool::new(false),
        }
    }

    fn armed(&self) -> MutexGuard<'_, Option<(raw::RedisModuleTimerID, i64)>> {
        self.armed
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Whether the timer is armed.
    pub fn is_armed(&self) -> bool {
        self.armed().is_some()
    }
}

/// Called once at load. A timer of an earlier load cannot be armed (Redis refuses to unload a
/// module with one), so what `arming` remembers of it is stale.
pub fn init(ctx: *mut raw::RedisModuleCtx, arming: &Arming) -> Result<(), String> {
    *arming.armed() = None;
    arming.job.store(false, Ordering::Relaxed);
    // SAFETY: the OnLoad context; the detached context lives as long as the module.
    let detached = unsafe { raw::RedisModule_GetDetachedThreadSafeContext.unwrap()(ctx) };
    if detached.is_null() {
        return Err("the server refused a detached context".into());
    }
    DETACHED.store(detached, Ordering::Relaxed);
    Ok(())
}

/// Stops the armed timer, if any (`ctx`: the module's detached context).
fn stop(ctx: *mut raw::RedisModuleCtx, arming: &Arming) {
    let taken = arming.armed().take();
    if let Some((id, _)) = taken {
        // SAFETY: the module's detached context, on the main thread; the id is this module's.
        unsafe { raw::RedisModule_StopTimer.unwrap()(ctx, id, std::ptr::null_mut()) };
    }
}

/// Makes sure the timer fires at `at_ms` (Unix ms) or earlier.
pub fn arm(arming: &Arming, at_ms: i64, now_ms: i64) {
    let at_ms = at_ms.min(now_ms.saturating_add(3_600_000));
    if arming.armed().is_some_and(|(_, at)| at <= at_ms) {
        return;
    }
    let ctx = DETACHED.load(Ordering::Relaxed);
    if ctx.is_null() {
        return;
    }
    stop(ctx, arming);
    // One millisecond late rather than early: the server's timers and its clock may disagree
    // by a fraction of one. At most an hour ahead (a deadline another client wrote may be years
    // away, and Redis computes the timer in microseconds): a timer that fires early finds
    // nothing due and is armed again.
    let period = at_ms.saturating_sub(now_ms).clamp(0, 3_600_000) + 1;
    // SAFETY: the module's detached context, on the main thread; the callback is a plain
    // function.
    let id = unsafe {
        raw::RedisModule_CreateTimer.unwrap()(ctx, period, Some(fired), std::ptr::null_mut())
    };
    *arming.armed() = Some((id, at_ms));
}

/// Makes sure the timer fires right after the current command, in the same turn of the event
/// loop (a timer due at once is run after the commands of this turn, before their replies go
/// out), unless it is running now: then at the next turn.
pub fn arm_now(arming: &Arming) {
    let ctx = DETACHED.load(Ordering::Relaxed);
    if ctx.is_null() || arming.armed().is_some_and(|(_, at)| at == i64::MIN) {
        return;
    }
    stop(ctx, arming);
    // SAFETY: the module's detached context, on the main thread; the callback is a plain
    // function.
    let id =
        unsafe { raw::RedisModule_CreateTimer.unwrap()(ctx, 0, Some(fired), std::ptr::null_mut()) };
    *arming.armed() = Some((id, i64::MIN));
}

/// Called at the end of a callback for another client's change (a key event, a flush, a swap,
/// an eviction): work that change deferred to the at-once timer runs instead right after the
/// command or event under way, before the server runs any other command (a pipelined one
/// included), where the server offers post-notification jobs (Redis 7.2 and later, Valkey).
/// Elsewhere (Redis 7.0), or where the server refuses a job (loading, a read-only replica), the
/// timer does it at the end of this turn of the event loop.
pub fn hurry(ctx: *mut raw::RedisModuleCtx, arming: &Arming) {
    if arming.armed().is_none_or(|(_, at)| at != i64::MIN) {
        return;
    }
    // SAFETY: a function pointer the server filled in at load (absent before Redis 7.2).
    let Some(add) = (unsafe { raw::RedisModule_AddPostNotificationJob }) else {
        return;
    };
    if arming.job.swap(true, Ordering::Relaxed) {
        return;
    }
    // SAFETY: the context of the server's callback under way, on the main thread.
    let added = unsafe { add(ctx, Some(job), std::ptr::null_mut(), None) };
    if added != raw::REDISMODULE_OK as c_int {
        arming.job.store(false, Ordering::Relaxed);
    }
}

/// What a post-notification job asked by [`hurry`] does first: the job does what the at-once
/// timer was armed for, so that timer stops (a later one is kept).
pub fn job_runs(arming: &Arming) {
    arming.job.store(false, Ordering::Relaxed);
    let detached = DETACHED.load(Ordering::Relaxed);
    if !detached.is_null() && arming.armed().is_some_and(|(_, at)| at == i64::MIN) {
        stop(detached, arming);
    }
}

/// What the timer's firing does first: it is armed no more.
pub fn fires(arming: &Arming) {
    *arming.armed() = None;
}

unsafe extern "C" fn job(ctx: *mut raw::RedisModuleCtx, _data: *mut c_void) {
    guard((), || (hooks().timer_job)(&Context::new(ctx)));
}

/// Stops the timer: nothing is left to do (an armed timer keeps `MODULE UNLOAD` refused).
pub fn disarm(arming: &Arming) {
    let ctx = DETACHED.load(Ordering::Relaxed);
    if !ctx.is_null() {
        stop(ctx, arming);
    }
}

/// Frees the module's own context, as the module unloads (Redis refuses to unload it while the
/// timer is armed).
pub fn shutdown() {
    let ctx = DETACHED.swap(std::ptr::null_mut(), Ordering::Relaxed);
    if !ctx.is_null() {
        // SAFETY: the detached context `init` made, freed once.
        unsafe { raw::RedisModule_FreeThreadSafeContext.unwrap()(ctx) };
    }
}

unsafe extern "C" fn fired(ctx: *mut raw::RedisModuleCtx, _data: *mut c_void) {
    guard((), || (hooks().timer_fired)(&Context::new(ctx)));
}
