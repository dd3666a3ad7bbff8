//! Server events the module follows: when this node's data may be behind what clients were told
//! (loading ended, or it became a primary), fair tickets jump (`fencing.rs`).

use std::os::raw::c_void;

use redis_module::raw;

use crate::fencing;

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
        );
    if subscribed {
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
        fencing::arm();
    }
}

extern "C" fn on_role_changed(
    _ctx: *mut raw::RedisModuleCtx,
    _event: raw::RedisModuleEvent,
    subevent: u64,
    _data: *mut c_void,
) {
    if subevent == raw::REDISMODULE_EVENT_REPLROLECHANGED_NOW_MASTER {
        fencing::arm();
    }
}
