//! Server events the module follows. When this node's data may be behind what clients were told
//! (loading ended, or it became a primary), it takes a fencing floor from the clock: fair tickets
//! go on from there at least (`fencing.rs`). The waiting side
//! hears of connections closing (BOUND permits), flushes and swapped databases, and this node
//! becoming a replica: server events (the server walks its listeners twice per event-loop turn,
//! which costs other commands a little: docs/performance.md).
//!
//! While a client waits, it also hears of keys deleted, renamed, moved, expired or evicted
//! (keyspace events of the generic, expired and evicted classes): such a change to a waited
//! semaphore serves its line at once, whatever the number of waiters. The classes of writes
//! (string, hash, sorted set) are not followed: each event of a followed class costs the server
//! a module context (about 600 instructions) on every such write anywhere. A `ZREM`, or an
//! overwrite of a waited key by another client, is seen when the line is next served: at its
//! next lease end or a waiter's timeout.

use std::cell::Cell;
use std::os::raw::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

use redis_module::raw;

use crate::error::SemError;
use crate::server::guard;
use crate::server::hooks::hooks;

/// Subscribes to the events.
pub fn subscribe(ctx: *mut raw::RedisModuleCtx) -> Result<(), String> {
    let subscribe = |id: u64, callback: raw::RedisModuleEventCallback| {
        let event = raw::RedisModuleEvent { id, dataver: 1 };
        // SAFETY: called from OnLoad with its context; the callback is a plain function.
        let status =
            unsafe { raw::RedisModule_SubscribeToServerEvent.unwrap()(ctx, event, callback) };
        status == raw::REDISMODULE_OK as i32
    };
    let subscribed = subscribe(raw::REDISMODULE_EVENT_LOADING, Some(on_loading))
        && subscribe(
            raw::REDISMODULE_EVENT_REPLICATION_ROLE_CHANGED,
            Some(on_role_changed),
        )
        && subscribe(raw::REDISMODULE_EVENT_CLIENT_CHANGE, Some(on_client_change))
        && subscribe(raw::REDISMODULE_EVENT_FLUSHDB, Some(on_flush))
        && subscribe(raw::REDISMODULE_EVENT_SWAPDB, Some(on_swap))
        && subscribe(raw::REDISMODULE_EVENT_CONFIG, Some(on_config_change));
    FOLLOWING_KEYS.store(false, Ordering::Relaxed);
    if subscribed {
        Ok(())
    } else {
        Err("the server refused the event subscriptions".into())
    }
}

/// Whether the module follows keyspace events (while anybody waits, or since the first wait on
/// a server that cannot unsubscribe), and the classes it subscribed to.
static FOLLOWING_KEYS: AtomicBool = AtomicBool::new(false);
static CLASSES: AtomicI32 = AtomicI32::new(0);

/// Starts following deletions, renames, moves, expiries and evictions of keys when a client
/// waits (and the module does not follow them already): until then nothing needs them. Where
/// the server can, a timer run that finds nobody waiting stops again (`stop_following_keys`).
/// What is left out, and why: see the module comment.
pub fn follow_keys(ctx: *mut raw::RedisModuleCtx) -> Result<(), SemError> {
    if FOLLOWING_KEYS.load(Ordering::Relaxed) {
        return Ok(());
    }
    // SAFETY: a command's context (the module pointer is what Redis takes from it); the
    // callback is a plain function.
    let mut classes = raw::REDISMODULE_NOTIFY_EXPIRED | raw::REDISMODULE_NOTIFY_EVICTED;
    if follows_generic_events() {
        classes |= raw::REDISMODULE_NOTIFY_GENERIC;
    }
    let status = unsafe {
        raw::RedisModule_SubscribeToKeyspaceEvents.unwrap()(ctx, classes, Some(on_key_event))
    };
    if status != raw::REDISMODULE_OK as c_int {
        return Err(SemError::Internal);
    }
    CLASSES.store(classes, Ordering::Relaxed);
    FOLLOWING_KEYS.store(true, Ordering::Relaxed);
    Ok(())
}

/// Stops following keyspace events (a timer run found nobody waiting), where the server can
/// (Redis 8.2 and later): every write's event costs other commands a walk of the subscribers.
/// Redis 7 and Valkey cannot unsubscribe; there the subscription lasts. Only from the module's
/// timer: the server walks its list of subscribers during a notification, and must not see it
/// change. The next wait subscribes again.
pub fn stop_following_keys(ctx: *mut raw::RedisModuleCtx) {
    if !FOLLOWING_KEYS.load(Ordering::Relaxed) {
        return;
    }
    // SAFETY: a copy of the pointer the module API filled in at load.
    let Some(unsubscribe) = (unsafe { raw::RedisModule_UnsubscribeFromKeyspaceEvents }) else {
        return;
    };
    // SAFETY: the timer's context (the module is what Redis matches); the same classes and
    // callback as the subscription.
    let status = unsafe {
        unsubscribe(
            ctx,
            CLASSES.load(Ordering::Relaxed) as c_int,
            Some(on_key_event),
        )
    };
    if status == raw::REDISMODULE_OK as c_int {
        FOLLOWING_KEYS.store(false, Ordering::Relaxed);
    }
}

/// Whether the module follows the generic class (deletions, renames, moves). Valkey 8 delivers
/// a keyspace event through the executing client and leaves that client in the event's
/// database: with a subscriber, `MOVE key 5` or `COPY a b DB 5` would switch the caller's
/// connection to database 5. There the module follows expiries and evictions only, and a
/// deletion, rename or move is seen at the line's next lease end or a waiter's timeout.
pub fn follows_generic_events() -> bool {
    !(super::is_valkey() && super::valkey_major() == 8)
}

extern "C" fn on_loading(
    _ctx: *mut raw::RedisModuleCtx,
    _event: raw::RedisModuleEvent,
    subevent: u64,
    _data: *mut c_void,
) {
    if subevent == raw::REDISMODULE_SUBEVENT_LOADING_ENDED {
        guard((), hooks().loading_ended);
    }
}

extern "C" fn on_role_changed(
    _ctx: *mut raw::RedisModuleCtx,
    _event: raw::RedisModuleEvent,
    subevent: u64,
    _data: *mut c_void,
) {
    if subevent == raw::REDISMODULE_EVENT_REPLROLECHANGED_NOW_MASTER {
        guard((), hooks().became_primary);
    } else if subevent == raw::REDISMODULE_EVENT_REPLROLECHANGED_NOW_REPLICA {
        guard((), hooks().became_replica);
    }
}

extern "C" fn on_client_change(
    _ctx: *mut raw::RedisModuleCtx,
    _event: raw::RedisModuleEvent,
    subevent: u64,
    data: *mut c_void,
) {
    if subevent != raw::REDISMODULE_SUBEVENT_CLIENT_CHANGE_DISCONNECTED || data.is_null() {
        return;
    }
    // SAFETY: for this event Redis passes a RedisModuleClientInfo (version 1 or later, whose
    // layout starts with version, flags, id).
    let info = unsafe { &*data.cast::<raw::RedisModuleClientInfo>() };
    guard((), || (hooks().connection_closed)(info.id));
}

extern "C" fn on_flush(
    _ctx: *mut raw::RedisModuleCtx,
    _event: raw::RedisModuleEvent,
    subevent: u64,
    data: *mut c_void,
) {
    if subevent != raw::REDISMODULE_SUBEVENT_FLUSHDB_END || data.is_null() {
        return;
    }
    // SAFETY: for this event Redis passes a RedisModuleFlushInfo.
    let info = unsafe { &*data.cast::<raw::RedisModuleFlushInfo>() };
    guard((), || {
        (hooks().flushed)((info.dbnum >= 0).then_some(info.dbnum))
    });
}

extern "C" fn on_swap(
    _ctx: *mut raw::RedisModuleCtx,
    _event: raw::RedisModuleEvent,
    _subevent: u64,
    data: *mut c_void,
) {
    if data.is_null() {
        return;
    }
    // SAFETY: for this event Redis passes a RedisModuleSwapDbInfo.
    let info = unsafe { &*data.cast::<raw::RedisModuleSwapDbInfo>() };
    guard((), || {
        (hooks().swapped)(info.dbnum_first, info.dbnum_second)
    });
}

extern "C" fn on_config_change(
    ctx: *mut raw::RedisModuleCtx,
    _event: raw::RedisModuleEvent,
    subevent: u64,
    data: *mut c_void,
) {
    if subevent != raw::REDISMODULE_SUBEVENT_CONFIG_CHANGE || data.is_null() {
        return;
    }
    // SAFETY: for this event Redis passes a RedisModuleConfigChange whose names are C
    // strings, valid for the callback.
    let names: Vec<&[u8]> = unsafe {
        let change = &*data.cast::<raw::RedisModuleConfigChangeV1>();
        (0..change.num_changes as usize)
            .map(|i| *change.config_names.add(i))
            .filter(|name| !name.is_null())
            .map(|name| std::ffi::CStr::from_ptr(name).to_bytes())
            .collect()
    };
    guard((), || {
        if super::memory::concerns_memory(&names) {
            super::memory::refresh(ctx);
        }
    });
}

thread_local! {
    /// Set while the module fires the events of its own writes, which are not news to it.
    static OWN_WRITE: Cell<bool> = const { Cell::new(false) };
}

/// Runs `notify`, which fires keyspace events of a change the module made itself.
pub fn own_write<T>(notify: impl FnOnce() -> T) -> T {
    OWN_WRITE.with(|own| own.set(true));
    let result = notify();
    OWN_WRITE.with(|own| own.set(false));
    result
}

extern "C" fn on_key_event(
    ctx: *mut raw::RedisModuleCtx,
    _type: c_int,
    _event: *const c_char,
    key: *mut raw::RedisModuleString,
) -> c_int {
    if !key.is_null() && !OWN_WRITE.with(Cell::get) && (hooks().follows_keys)() {
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
        guard((), || (hooks().key_changed)(db, name));
    }
    raw::REDISMODULE_OK as c_int
}
