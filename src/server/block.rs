//! Blocking a client inside the server (`RedisModule_BlockClient`), and the callbacks through
//! which Redis reports what became of it. Redis's own timeout is never used: the waiting side
//! keeps every wait's end itself (one module timer), so a grant can never race a timeout inside
//! Redis. The timeout callback exists for `CLIENT UNBLOCK`, which needs one.

use std::os::raw::{c_int, c_void};
use std::ptr::NonNull;
use std::time::{Duration, Instant};

use redis_module::{raw, Context, RedisValue};

use crate::error::SemError;
use crate::server::guard;
use crate::server::hooks::{hooks, Left};

/// A blocked client, as the module holds it until it calls [`finish`] on it.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct Blocked(NonNull<raw::RedisModuleBlockedClient>, Instant);

impl Blocked {
    /// A number identifying the handle (its address), for the disconnect callback's lookup.
    pub fn key(&self) -> usize {
        self.0.as_ptr() as usize
    }

    /// How long since the client was blocked.
    pub fn waited(&self) -> Duration {
        self.1.elapsed()
    }
}

/// What a command needs to know of its caller, read once.
#[derive(Debug, Clone, Copy)]
pub struct Caller {
    /// Whether it may block: not inside MULTI, a script or function, nor denied blocking.
    pub may_block: bool,
    /// Whether it is a script or function (whose connection is not the client's).
    pub in_script: bool,
    /// Its connection's id (`CLIENT ID`).
    pub client: u64,
}

/// The caller of the command of `ctx`; `needed`: false for a call that neither waits nor binds,
/// which reads nothing (and is told it may not block, from no connection).
pub fn caller(ctx: &Context, needed: bool) -> Caller {
    if !needed {
        return Caller {
            may_block: false,
            in_script: false,
            client: 0,
        };
    }
    let deny = raw::REDISMODULE_CTX_FLAGS_MULTI
        | raw::REDISMODULE_CTX_FLAGS_LUA
        | raw::REDISMODULE_CTX_FLAGS_DENY_BLOCKING;
    // SAFETY: the command's own context.
    let (flags, client) = unsafe {
        (
            raw::RedisModule_GetContextFlags.unwrap()(ctx.ctx) as u32,
            raw::RedisModule_GetClientId.unwrap()(ctx.ctx),
        )
    };
    Caller {
        may_block: flags & deny == 0,
        in_script: flags & raw::REDISMODULE_CTX_FLAGS_LUA != 0,
        client,
    }
}

/// Whether the caller is a connection, not a script or a module's call, which run on temporary
/// clients the server does not list.
pub fn from_connection(ctx: &Context) -> bool {
    // SAFETY: the command's own context; no client information is filled in.
    unsafe {
        let id = raw::RedisModule_GetClientId.unwrap()(ctx.ctx);
        raw::RedisModule_GetClientInfoById.unwrap()(std::ptr::null_mut(), id)
            == raw::REDISMODULE_OK as c_int
    }
}

/// Blocks the caller until the module calls [`unblock`] or [`finish`]. `None` when the server
/// refuses (Valkey 9: a client that is not a normal connection, or one blocked already).
pub fn block(ctx: &Context) -> Option<Blocked> {
    // SAFETY: the command's context; the callbacks are plain functions; timeout 0: the
    // module ends waits itself.
    let bc = unsafe {
        raw::RedisModule_BlockClient.unwrap()(
            ctx.ctx,
            Some(on_reply),
            Some(on_unblock_request),
            Some(on_free),
            0,
        )
    };
    let bc = NonNull::new(bc)?;
    // SAFETY: a handle BlockClient just returned.
    unsafe { raw::RedisModule_SetDisconnectCallback.unwrap()(bc.as_ptr(), Some(on_disconnect)) };
    Some(Blocked(bc, Instant::now()))
}

/// Ends the wait with `data` (a pointer the caller made, such as a `Box` turned raw), handed
/// to the reply hook for the reply, and to the free hook in any case, which frees it.
pub fn unblock(blocked: Blocked, data: *mut c_void) {
    // SAFETY: a handle of a client still blocked by this module; Redis keeps `data` until it
    // passes it to `on_free`.
    unsafe { raw::RedisModule_UnblockClient.unwrap()(blocked.0.as_ptr(), data) };
}

/// Lets Redis free a handle whose client already got its answer or is gone (after
/// `CLIENT UNBLOCK` or a disconnect).
fn finish(bc: *mut raw::RedisModuleBlockedClient) {
    // SAFETY: a handle of this module that was not yet unblocked; no private data.
    unsafe { raw::RedisModule_UnblockClient.unwrap()(bc, std::ptr::null_mut()) };
}

unsafe extern "C" fn on_reply(
    ctx: *mut raw::RedisModuleCtx,
    _argv: *mut *mut raw::RedisModuleString,
    _argc: c_int,
) -> c_int {
    let context = Context::new(ctx);
    // SAFETY: the private data `unblock` handed over, alive until `on_free`.
    let data = unsafe { raw::RedisModule_GetBlockedClientPrivateData.unwrap()(ctx) };
    let reply = guard(Err(SemError::Internal.into()), || {
        if data.is_null() {
            Ok(RedisValue::Null)
        } else {
            (hooks().reply)(data)
        }
    });
    context.reply(reply) as c_int
}

/// `CLIENT UNBLOCK <id>` (without ERROR) ends a wait through the timeout callback: nil, or 0
/// for a wait for empty.
unsafe extern "C" fn on_unblock_request(
    ctx: *mut raw::RedisModuleCtx,
    _argv: *mut *mut raw::RedisModuleString,
    _argc: c_int,
) -> c_int {
    // SAFETY: the context of the blocked client's timeout.
    let bc = unsafe { raw::RedisModule_GetBlockedClientHandle.unwrap()(ctx) };
    // (Redis skips this callback for a client the module already answered.)
    let left = guard(Left::NotWaiting, || (hooks().left)(bc as usize));
    if left != Left::NotWaiting {
        finish(bc);
    }
    // A wait for empty that ends early ends as its timeout would: 0.
    let reply = match left {
        Left::ForEmpty => RedisValue::Integer(0),
        Left::ForPermits | Left::NotWaiting => RedisValue::Null,
    };
    Context::new(ctx).reply(Ok(reply)) as c_int
}

/// The client went away while waiting (or `CLIENT UNBLOCK <id> ERROR` answered it). Redis
/// calls this also for a client the module answered in this same event-loop iteration (its
/// answer is not processed yet): that handle is unblocked already, and unblocking it twice
/// would free it twice; its outcome reaches the free callback, which gives an undelivered
/// permit back.
unsafe extern "C" fn on_disconnect(
    _ctx: *mut raw::RedisModuleCtx,
    bc: *mut raw::RedisModuleBlockedClient,
) {
    if guard(Left::NotWaiting, || (hooks().left)(bc as usize)) != Left::NotWaiting {
        finish(bc);
    }
}

unsafe extern "C" fn on_free(ctx: *mut raw::RedisModuleCtx, privdata: *mut c_void) {
    // SAFETY: the context Redis passes to free callbacks.
    let disconnected = unsafe { raw::RedisModule_BlockedClientDisconnected.unwrap()(ctx) } != 0;
    // Redis calls this once, last, with what `unblock` handed over.
    if !privdata.is_null() {
        guard((), || (hooks().free)(privdata, disconnected));
    }
}
