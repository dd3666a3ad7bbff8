//! The module's one timer. The waiting side keeps its own schedule (wait ends, lease ends, work
//! to do after the current command); this arms a single Redis timer at the earliest of them.

use std::os::raw::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
use std::sync::Mutex;

use redis_module::{raw, Context};

use crate::server::guard;
use crate::server::hooks::hooks;

/// A context of the module's own, for arming the timer where Redis passes none (the command
/// filter).
static DETACHED: AtomicPtr<raw::RedisModuleCtx> = AtomicPtr::new(std::ptr::null_mut());

/// The armed timer and when it fires (Unix ms).
static ARMED: Mutex<Option<(raw::RedisModuleTimerID, i64)>> = Mutex::new(None);

fn armed() -> std::sync::MutexGuard<'static, Option<(raw::RedisModuleTimerID, i64)>> {
    ARMED
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Whether the timer is armed.
pub fn is_armed() -> bool {
    armed().is_some()
}

/// Called once at load. A timer of an earlier load cannot be armed (Redis refuses to unload a
/// module with one), so what the static remembers of it is stale.
pub fn init(ctx: *mut raw::RedisModuleCtx) -> Result<(), String> {
    armed().take();
    // SAFETY: the OnLoad context; the detached context lives as long as the module.
    let detached = unsafe { raw::RedisModule_GetDetachedThreadSafeContext.unwrap()(ctx) };
    if detached.is_null() {
        return Err("the server refused a detached context".into());
    }
    DETACHED.store(detached, Ordering::Relaxed);
    Ok(())
}

/// Makes sure the timer fires at `at_ms` (Unix ms) or earlier.
pub fn arm(at_ms: i64, now_ms: i64) {
    let mut armed = armed();
    let at_ms = at_ms.min(now_ms.saturating_add(3_600_000));
    if armed.is_some_and(|(_, at)| at <= at_ms) {
        return;
    }
    let ctx = DETACHED.load(Ordering::Relaxed);
    if ctx.is_null() {
        return;
    }
    // SAFETY: the module's detached context, on the main thread; the ids are this module's.
    unsafe {
        if let Some((id, _)) = armed.take() {
            raw::RedisModule_StopTimer.unwrap()(ctx, id, std::ptr::null_mut());
        }
        // One millisecond late rather than early: the server's timers and its clock may
        // disagree by a fraction of one. At most an hour ahead (a deadline another client wrote
        // may be years away, and Redis computes the timer in microseconds): a timer that fires
        // early finds nothing due and is armed again.
        let period = at_ms.saturating_sub(now_ms).clamp(0, 3_600_000) + 1;
        let id =
            raw::RedisModule_CreateTimer.unwrap()(ctx, period, Some(fired), std::ptr::null_mut());
        *armed = Some((id, at_ms));
    }
}

/// Makes sure the timer fires right after the current command, in the same turn of the event
/// loop (a timer due at once is run after the commands of this turn, before their replies go
/// out), unless it is running now: then at the next turn.
pub fn arm_now() {
    let ctx = DETACHED.load(Ordering::Relaxed);
    let mut armed = armed();
    if ctx.is_null() || armed.is_some_and(|(_, at)| at == i64::MIN) {
        return;
    }
    // SAFETY: the module's detached context, on the main thread; the ids are this module's.
    unsafe {
        if let Some((id, _)) = armed.take() {
            raw::RedisModule_StopTimer.unwrap()(ctx, id, std::ptr::null_mut());
        }
        let id = raw::RedisModule_CreateTimer.unwrap()(ctx, 0, Some(fired), std::ptr::null_mut());
        *armed = Some((id, i64::MIN));
    }
}

/// A post-notification job asked for and not yet run.
static JOB: AtomicBool = AtomicBool::new(false);

/// Called at the end of a callback for another client's change (a key event, a flush, a swap,
/// an eviction): work that change deferred to the at-once timer runs instead right after the
/// command or event under way, before the server runs any other command (a pipelined one
/// included), where the server offers post-notification jobs (Redis 7.2 and later, Valkey).
/// Elsewhere (Redis 7.0), or where the server refuses a job (loading, a read-only replica), the
/// timer does it at the end of this turn of the event loop.
pub fn hurry(ctx: *mut raw::RedisModuleCtx) {
    if !armed().is_some_and(|(_, at)| at == i64::MIN) {
        return;
    }
    // SAFETY: a function pointer the server filled in at load (absent before Redis 7.2).
    let Some(add) = (unsafe { raw::RedisModule_AddPostNotificationJob }) else {
        return;
    };
    if JOB.swap(true, Ordering::Relaxed) {
        return;
    }
    // SAFETY: the context of the server's callback under way, on the main thread.
    let added = unsafe { add(ctx, Some(job), std::ptr::null_mut(), None) };
    if added != raw::REDISMODULE_OK as c_int {
        JOB.store(false, Ordering::Relaxed);
    }
}

unsafe extern "C" fn job(ctx: *mut raw::RedisModuleCtx, _data: *mut c_void) {
    JOB.store(false, Ordering::Relaxed);
    // The job does what the at-once timer was armed for; a later one is kept.
    {
        let mut armed = armed();
        let detached = DETACHED.load(Ordering::Relaxed);
        if let (Some((id, i64::MIN)), false) = (*armed, detached.is_null()) {
            // SAFETY: the module's detached context, on the main thread; the id is this module's.
            unsafe { raw::RedisModule_StopTimer.unwrap()(detached, id, std::ptr::null_mut()) };
            *armed = None;
        }
    }
    guard((), || (hooks().timer_fired)(&Context::new(ctx)));
}

/// Stops the timer: nothing is left to do (an armed timer keeps `MODULE UNLOAD` refused).
pub fn disarm() {
    let mut armed = armed();
    let ctx = DETACHED.load(Ordering::Relaxed);
    if let (Some((id, _)), false) = (armed.take(), ctx.is_null()) {
        // SAFETY: the module's detached context, on the main thread; the id is this module's.
        unsafe { raw::RedisModule_StopTimer.unwrap()(ctx, id, std::ptr::null_mut()) };
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
    armed().take();
    guard((), || (hooks().timer_fired)(&Context::new(ctx)));
}
