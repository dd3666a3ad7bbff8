//! Server events the module follows. When this node's data may be behind what clients were told
//! (loading ended, or it became a primary), fair tickets jump (`fencing.rs`). The waiting side
//! hears of connections closing (BOUND permits), flushes and swapped databases, and this node
//! becoming a replica, and of keys that expire or are evicted (a waited-on semaphore's keys may
//! go before its last lease ends: another client shortened their expiry, or memory ran out).

use std::os::raw::{c_char, c_int, c_void};

use redis_module::raw;

use crate::server::guard;
use crate::{fencing, waiting};

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
        && subscribe(raw::REDISMODULE_EVENT_SWAPDB, Some(on_swap));
    // SAFETY: called from OnLoad with its context; the callback is a plain function.
    let keyspace = unsafe {
        raw::RedisModule_SubscribeToKeyspaceEvents.unwrap()(
            ctx,
            raw::REDISMODULE_NOTIFY_EXPIRED | raw::REDISMODULE_NOTIFY_EVICTED,
            Some(on_key_gone),
        )
    } == raw::REDISMODULE_OK as c_int;
    if subscribed && keyspace {
        Ok(())
    } else {
        Err("the server refused the event subscriptions".into())
    }
}

extern "C" fn on_loading(
    _ctx: *mut raw::RedisModuleCtx,
    _event: raw::RedisModuleEvent,
    subevent: u64,
    _data: *mut c_void,
) {
    if subevent == raw::REDISMODULE_SUBEVENT_LOADING_ENDED {
        guard((), || {
            fencing::arm();
            waiting::recheck_all();
        });
    }
}

extern "C" fn on_role_changed(
    _ctx: *mut raw::RedisModuleCtx,
    _event: raw::RedisModuleEvent,
    subevent: u64,
    _data: *mut c_void,
) {
    guard((), || {
        if subevent == raw::REDISMODULE_EVENT_REPLROLECHANGED_NOW_MASTER {
            fencing::arm();
        } else if subevent == raw::REDISMODULE_EVENT_REPLROLECHANGED_NOW_REPLICA {
            waiting::became_replica();
        }
    });
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
    guard((), || waiting::connection_closed(info.id));
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
        waiting::flushed((info.dbnum >= 0).then_some(info.dbnum))
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
    guard((), || waiting::swapped(info.dbnum_first, info.dbnum_second));
}

extern "C" fn on_key_gone(
    _ctx: *mut raw::RedisModuleCtx,
    _type: c_int,
    _event: *const c_char,
    key: *mut raw::RedisModuleString,
) -> c_int {
    if waiting::queued_anywhere() && !key.is_null() {
        let mut len = 0;
        // SAFETY: Redis passes the key's name, valid for the callback.
        let name = unsafe {
            let ptr = raw::RedisModule_StringPtrLen.unwrap()(key, &mut len);
            std::slice::from_raw_parts(ptr.cast::<u8>(), len)
        };
        guard((), || waiting::touched(name));
    }
    raw::REDISMODULE_OK as c_int
}
