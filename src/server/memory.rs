//! The server's memory settings as the module needs them: `maxmemory` and whether its policy
//! evicts, read at load and again when `CONFIG SET` changes either (the config server event),
//! so that admitting a waiter reads two atomics and one ratio; and evictions, handed to the
//! `key_evicted` hook, the first of a semaphore's key logged.

use std::ffi::CStr;
use std::os::raw::{c_char, c_int};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use redis_module::{raw, Context};

use crate::server::guard;
use crate::server::hooks::hooks;

/// The server's memory as the admission of a waiter sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Memory {
    /// `maxmemory`, 0 when unset.
    pub maxmemory: u64,
    /// The memory the server counts against `maxmemory` now (0 when unset).
    pub used: u64,
}

/// `maxmemory` in bytes, 0 when unset.
static MAXMEMORY: AtomicU64 = AtomicU64::new(0);
/// The `maxmemory-policy` in force, for the warning.
static POLICY: Mutex<String> = Mutex::new(String::new());
/// Whether the module follows evictions (once subscribed, for the rest of the load).
static FOLLOWING_EVICTIONS: AtomicBool = AtomicBool::new(false);
/// Whether the first eviction of a semaphore's key was logged.
static WARNED: AtomicBool = AtomicBool::new(false);

/// The memory the admission of a waiter looks at: `maxmemory`, and what the server counts
/// against it now (`RedisModule_GetUsedMemoryRatio`, the ratio eviction itself uses).
pub fn now() -> Memory {
    let maxmemory = MAXMEMORY.load(Ordering::Relaxed);
    if maxmemory == 0 {
        return Memory { maxmemory, used: 0 };
    }
    // SAFETY: a plain read of the server's memory state, on the main thread.
    let ratio = unsafe { raw::RedisModule_GetUsedMemoryRatio.unwrap()() };
    Memory {
        maxmemory,
        used: (f64::from(ratio) * maxmemory as f64) as u64,
    }
}

/// Reads `maxmemory` and `maxmemory-policy` (at load, and after `CONFIG SET` of either); once
/// the policy may evict with a `maxmemory` set, starts following evictions.
pub fn refresh(ctx: *mut raw::RedisModuleCtx) {
    // SAFETY: no context (the data is freed by hand below); the field strings are copied
    // before it is freed.
    let (maxmemory, policy) = unsafe {
        let info =
            raw::RedisModule_GetServerInfo.unwrap()(std::ptr::null_mut(), c"memory".as_ptr());
        if info.is_null() {
            return;
        }
        let mut err: c_int = 0;
        let maxmemory = raw::RedisModule_ServerInfoGetFieldUnsigned.unwrap()(
            info,
            c"maxmemory".as_ptr(),
            &mut err,
        );
        let policy =
            raw::RedisModule_ServerInfoGetFieldC.unwrap()(info, c"maxmemory_policy".as_ptr());
        let policy = match policy.is_null() {
            true => String::new(),
            false => CStr::from_ptr(policy).to_string_lossy().into_owned(),
        };
        raw::RedisModule_FreeServerInfo.unwrap()(std::ptr::null_mut(), info);
        (if err == 0 { maxmemory } else { 0 }, policy)
    };
    MAXMEMORY.store(maxmemory, Ordering::Relaxed);
    let evicts = maxmemory > 0 && policy != "noeviction";
    *POLICY.lock().unwrap_or_else(|p| p.into_inner()) = policy;
    if evicts && !FOLLOWING_EVICTIONS.load(Ordering::Relaxed) {
        // SAFETY: a context of the module; the callback is a plain function. Redis 7 cannot
        // unsubscribe: the subscription lasts while the module is loaded, and costs only
        // evictions (one callback each).
        let status = unsafe {
            raw::RedisModule_SubscribeToKeyspaceEvents.unwrap()(
                ctx,
                raw::REDISMODULE_NOTIFY_EVICTED,
                Some(on_evicted),
            )
        };
        FOLLOWING_EVICTIONS.store(status == raw::REDISMODULE_OK as c_int, Ordering::Relaxed);
    }
}

/// Whether the module follows evictions.
pub fn follows_evictions() -> bool {
    FOLLOWING_EVICTIONS.load(Ordering::Relaxed)
}

/// Forgets what an earlier load of the module knew.
pub fn reset() {
    MAXMEMORY.store(0, Ordering::Relaxed);
    FOLLOWING_EVICTIONS.store(false, Ordering::Relaxed);
    WARNED.store(false, Ordering::Relaxed);
}

/// Whether a `CONFIG SET` changed `maxmemory` or `maxmemory-policy` (`names`: the changed
/// configs' names).
pub fn concerns_memory(names: &[&[u8]]) -> bool {
    names.iter().any(|name| {
        name.eq_ignore_ascii_case(b"maxmemory") || name.eq_ignore_ascii_case(b"maxmemory-policy")
    })
}

extern "C" fn on_evicted(
    ctx: *mut raw::RedisModuleCtx,
    _type: c_int,
    _event: *const c_char,
    key: *mut raw::RedisModuleString,
) -> c_int {
    if key.is_null() {
        return raw::REDISMODULE_OK as c_int;
    }
    let mut len = 0;
    // SAFETY: Redis passes the key's name, valid for the callback, and a context whose
    // selected database is the key's.
    let (db, name) = unsafe {
        let ptr = raw::RedisModule_StringPtrLen.unwrap()(key, &mut len);
        (
            raw::RedisModule_GetSelectedDb.unwrap()(ctx),
            std::slice::from_raw_parts(ptr.cast::<u8>(), len),
        )
    };
    let concerned = guard(false, || (hooks().key_evicted)(db, name));
    if concerned {
        (hooks().hurry)(&Context::new(ctx));
    }
    guard((), || {
        if !concerned {
            return;
        }
        if !WARNED.swap(true, Ordering::Relaxed) {
            let policy = POLICY.lock().unwrap_or_else(|p| p.into_inner()).clone();
            let message = format!(
                "redsem: the server evicted {}, a semaphore's key, under maxmemory-policy \
                 {policy}: the permits or tickets it held are lost (sem_evicted_keys counts \
                 such evictions); only noeviction keeps semaphores whole",
                String::from_utf8_lossy(name)
            );
            super::log_warning(ctx, &message);
        }
    });
    raw::REDISMODULE_OK as c_int
}
