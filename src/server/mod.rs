//! Every raw module-API call of redsem lives under this module, each with its SAFETY comment:
//! open keys and their changes (`key`), registration (`command`, `command_info`), the command
//! filter (`filter`), blocked clients (`block`), the timer (`timer`), server events (`events`),
//! and the few plain calls below.

pub mod acl;
pub mod block;
pub mod command;
pub mod command_info;
pub mod config;
pub mod events;
pub mod filter;
pub mod hooks;
pub mod info;
pub mod key;
pub mod memory;
pub mod timer;

use std::os::raw::c_int;

use redis_module::{raw, Context, RedisString};

/// Writes `message` to the server's log at the warning level.
pub fn log_warning(ctx: *mut raw::RedisModuleCtx, message: &str) {
    let Ok(message) = std::ffi::CString::new(message.replace('\0', " ")) else {
        return;
    };
    // SAFETY: a context of the module (or NULL); "%s" with one C string.
    unsafe {
        raw::RedisModule_Log.unwrap()(ctx, c"warning".as_ptr(), c"%s".as_ptr(), message.as_ptr())
    }
}

/// Runs `work` for a callback Redis makes into the module; a panic (a bug) returns `fallback`
/// instead of unwinding into redis-server, which would abort it.
pub fn guard<T>(fallback: T, work: impl FnOnce() -> T) -> T {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)).unwrap_or(fallback)
}

/// The module API functions redsem calls; a server without one of them is refused at load.
pub fn missing_api() -> Vec<&'static str> {
    macro_rules! presence {
        ($($function:ident),* $(,)?) => {
            // SAFETY: copies (not references) of the pointers the module API filled in at load.
            [$((stringify!($function), unsafe { raw::$function }.is_some())),*]
        };
    }
    let required = presence!(
        RedisModule_OpenKey,
        RedisModule_KeyExists,
        RedisModule_CloseKey,
        RedisModule_KeyType,
        RedisModule_ValueLength,
        RedisModule_DeleteKey,
        RedisModule_ZsetAdd,
        RedisModule_ZsetRem,
        RedisModule_ZsetScore,
        RedisModule_ZsetFirstInScoreRange,
        RedisModule_ZsetLastInScoreRange,
        RedisModule_ZsetRangeCurrentElement,
        RedisModule_ZsetRangeNext,
        RedisModule_ZsetRangeStop,
        RedisModule_GetAbsExpire,
        RedisModule_SetAbsExpire,
        RedisModule_StringDMA,
        RedisModule_StringTruncate,
        RedisModule_StringPtrLen,
        RedisModule_CreateString,
        RedisModule_FreeString,
        RedisModule_Call,
        RedisModule_CallReplyType,
        RedisModule_CallReplyStringPtr,
        RedisModule_FreeCallReply,
        RedisModule_Replicate,
        RedisModule_NotifyKeyspaceEvent,
        RedisModule_SignalModifiedKey,
        RedisModule_SetModuleOptions,
        RedisModule_CreateCommand,
        RedisModule_Milliseconds,
        RedisModule_RegisterCommandFilter,
        RedisModule_CommandFilterArgsCount,
        RedisModule_CommandFilterArgGet,
        RedisModule_CommandFilterArgInsert,
        RedisModule_GetCommand,
        RedisModule_SetCommandInfo,
        RedisModule_IsKeysPositionRequest,
        RedisModule_KeyAtPosWithFlags,
        RedisModule_SubscribeToServerEvent,
        RedisModule_BlockClient,
        RedisModule_UnblockClient,
        RedisModule_SetDisconnectCallback,
        RedisModule_GetBlockedClientHandle,
        RedisModule_GetBlockedClientPrivateData,
        RedisModule_BlockedClientDisconnected,
        RedisModule_GetClientId,
        RedisModule_GetContextFlags,
        RedisModule_CreateTimer,
        RedisModule_StopTimer,
        RedisModule_GetDetachedThreadSafeContext,
        RedisModule_SelectDb,
        RedisModule_RegisterInfoFunc,
        RedisModule_RegisterNumericConfig,
        RedisModule_LoadConfigs,
        RedisModule_InfoAddSection,
        RedisModule_InfoAddFieldULongLong,
        RedisModule_InfoAddFieldCString,
        RedisModule_GetSelectedDb,
        RedisModule_SubscribeToKeyspaceEvents,
        RedisModule_AvoidReplicaTraffic,
        RedisModule_GetUsedMemoryRatio,
        RedisModule_GetServerInfo,
        RedisModule_ServerInfoGetFieldUnsigned,
        RedisModule_ServerInfoGetFieldC,
        RedisModule_FreeServerInfo,
        RedisModule_Log,
    );
    required
        .iter()
        .filter(|(_, present)| !present)
        .map(|(name, _)| *name)
        .collect()
}

/// The module's options. Keys are signalled as modified by the key layer only when they changed
/// (see `key.rs`), not by Redis for every key opened for writing: a refused call must not fire
/// WATCH. Reads the server's kind, so it runs after [`server_version`].
pub fn set_module_options(ctx: &Context) {
    let mut options = raw::REDISMODULE_OPTION_NO_IMPLICIT_SIGNAL_MODIFIED as c_int;
    if is_valkey() && VALKEY_MAJOR.load(std::sync::atomic::Ordering::Relaxed) >= 9 {
        // Valkey 9 refuses `CLUSTER MIGRATESLOTS` while a loaded module does not declare this.
        // The semaphores are plain keys the server moves itself; a waiter whose slot left is
        // answered when its line is next served, as after `CLUSTER SETSLOT`.
        options |= VALKEY_HANDLE_ATOMIC_SLOT_MIGRATION;
    }
    // SAFETY: the OnLoad context; documented option bits.
    unsafe { raw::RedisModule_SetModuleOptions.unwrap()(ctx.ctx, options) }
}

/// `VALKEYMODULE_OPTIONS_HANDLE_ATOMIC_SLOT_MIGRATION` (valkeymodule.h, Valkey 9).
const VALKEY_HANDLE_ATOMIC_SLOT_MIGRATION: c_int = 1 << 5;

static VALKEY_MAJOR: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// The server's clock in Unix milliseconds: the one clock every deadline is measured by. Where
/// Redis offers it (7.2+), the time it cached for the current command, as its own commands use.
pub fn now_ms() -> i64 {
    // SAFETY: plain reads of the server clock, resolved when the module loaded.
    unsafe {
        if let Some(cached_us) = raw::RedisModule_CachedMicroseconds {
            return cached_us() / 1000;
        }
        raw::RedisModule_Milliseconds.unwrap()()
    }
}

/// The server's clock in Unix milliseconds, read now (not the time cached for the current
/// command or event-loop turn): a grant made late in a long run of work starts when it is made.
pub fn clock_ms() -> i64 {
    // SAFETY: a plain read of the server clock, resolved when the module loaded.
    unsafe { raw::RedisModule_Milliseconds.unwrap()() }
}

/// Whether `name` exists in the context's database (a look-up that opens nothing).
pub fn key_exists(ctx: &Context, name: &RedisString) -> bool {
    // SAFETY: a valid context and key name.
    unsafe { raw::RedisModule_KeyExists.unwrap()(ctx.ctx, name.inner) != 0 }
}

/// Whether the server called the command only to learn its keys (`getkeys-api`).
pub fn is_keys_position_request(ctx: &Context) -> bool {
    // SAFETY: the command's own context.
    unsafe { raw::RedisModule_IsKeysPositionRequest.unwrap()(ctx.ctx) != 0 }
}

/// Reports the argument at `pos` as a key, with `REDISMODULE_CMD_KEY_*` flags.
pub fn key_at(ctx: &Context, pos: usize, flags: u32) {
    // SAFETY: the command's own context, in a keys-position request.
    unsafe { raw::RedisModule_KeyAtPosWithFlags.unwrap()(ctx.ctx, pos as c_int, flags as c_int) }
}

/// The database the context works on.
pub fn selected_db(ctx: &Context) -> i32 {
    // SAFETY: a valid context.
    unsafe { raw::RedisModule_GetSelectedDb.unwrap()(ctx.ctx) }
}

/// Makes the context work on database `db` (timer and event contexts start on 0).
pub fn select_db(ctx: &Context, db: i32) {
    // SAFETY: a valid context with a client (timer contexts have one); `db` came from
    // `selected_db`, so it exists.
    unsafe { raw::RedisModule_SelectDb.unwrap()(ctx.ctx, db) };
}

fn context_flags(ctx: &Context) -> u32 {
    // SAFETY: a valid context.
    unsafe { raw::RedisModule_GetContextFlags.unwrap()(ctx.ctx) as u32 }
}

/// Whether writes are paused: `CLIENT PAUSE` (WRITE or ALL), `FAILOVER`, a Cluster manual
/// failover, a shutdown waiting for its replicas. Nothing may be written then, not even from a
/// timer: Redis asserts that nothing reaches the replication stream, and keeps keys whose expiry
/// passed in place (one written as if missing aborts it).
pub fn writes_paused() -> bool {
    // SAFETY: a plain query of the server's state, on the main thread.
    unsafe { raw::RedisModule_AvoidReplicaTraffic.unwrap()() != 0 }
}

/// Whether the server runs in Redis Cluster mode. `cluster-enabled` cannot change while the
/// server runs, so it is read once (a context's flags cost every call a walk of the server's
/// state).
pub fn in_cluster(ctx: &Context) -> bool {
    use std::sync::atomic::{AtomicU8, Ordering};
    static CLUSTER: AtomicU8 = AtomicU8::new(0);
    match CLUSTER.load(Ordering::Relaxed) {
        1 => false,
        2 => true,
        _ => {
            let cluster = context_flags(ctx) & raw::REDISMODULE_CTX_FLAGS_CLUSTER != 0;
            CLUSTER.store(if cluster { 2 } else { 1 }, Ordering::Relaxed);
            cluster
        }
    }
}

/// Whether this node is a primary (it may write).
pub fn is_primary(ctx: &Context) -> bool {
    context_flags(ctx) & raw::REDISMODULE_CTX_FLAGS_MASTER != 0
}

/// Outside a command, whether this node may serve a semaphore's four `keys` (all in one slot): in Redis Cluster,
/// only while it owns their slot and, during a migration, holds what exists of them. Asked by
/// running `EXISTS` on them, which Redis checks as it checks any command.
pub fn cluster_can_serve(ctx: &Context, keys: &[&RedisString; 5]) -> bool {
    if !in_cluster(ctx) {
        return true;
    }
    // SAFETY: the format letters match the three strings; a reply is freed at once.
    unsafe {
        let reply = raw::RedisModule_Call.unwrap()(
            ctx.ctx,
            c"EXISTS".as_ptr(),
            c"sssss".as_ptr(),
            keys[0].inner,
            keys[1].inner,
            keys[2].inner,
            keys[3].inner,
            keys[4].inner,
        );
        if reply.is_null() {
            return false;
        }
        let ok = raw::RedisModule_CallReplyType.unwrap()(reply)
            == raw::REDISMODULE_REPLY_INTEGER as c_int;
        raw::RedisModule_FreeCallReply.unwrap()(reply);
        ok
    }
}

static VALKEY: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether the server is Valkey (read at load by [`server_version`]).
pub fn is_valkey() -> bool {
    VALKEY.load(std::sync::atomic::Ordering::Relaxed)
}

/// Whether `RedisModule_GetCurrentUserName` checks for a client without a user: Redis 8.0 and
/// later (redis#13619) and Valkey 9 answer NULL; Redis 7 and Valkey 8 dereference it.
pub fn current_user_name_is_safe() -> bool {
    let major = MAJOR.load(std::sync::atomic::Ordering::Relaxed);
    if is_valkey() {
        major >= 9
    } else {
        major >= 8
    }
}

static MAJOR: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// Whether the server runs in Redis Cluster mode (known from load on: it cannot change).
pub fn is_cluster(ctx: *mut raw::RedisModuleCtx) -> bool {
    // SAFETY: a valid context (OnLoad's included: the flag is the server's setting).
    let flags = unsafe { raw::RedisModule_GetContextFlags.unwrap()(ctx) as u32 };
    flags & raw::REDISMODULE_CTX_FLAGS_CLUSTER != 0
}

/// The server's kind and version: whether it is Valkey, and its major and minor version (from
/// `INFO server`: Valkey reports `valkey_version` beside a fixed `redis_version`).
pub fn server_version(ctx: *mut raw::RedisModuleCtx) -> (bool, u32, u32) {
    let section = std::ffi::CString::new("server").expect("no NUL");
    // SAFETY: a context of the module; the data is freed before returning and the fields are
    // read as C strings owned by it.
    let (valkey, version) = unsafe {
        let info = raw::RedisModule_GetServerInfo.unwrap()(ctx, section.as_ptr());
        if info.is_null() {
            return (false, 0, 0);
        }
        let field = |name: &str| {
            let name = std::ffi::CString::new(name).expect("no NUL");
            let value = raw::RedisModule_ServerInfoGetFieldC.unwrap()(info, name.as_ptr());
            (!value.is_null()).then(|| {
                std::ffi::CStr::from_ptr(value)
                    .to_string_lossy()
                    .into_owned()
            })
        };
        let read = match field("valkey_version") {
            Some(version) => (true, version),
            None => (false, field("redis_version").unwrap_or_default()),
        };
        raw::RedisModule_FreeServerInfo.unwrap()(ctx, info);
        read
    };
    VALKEY.store(valkey, std::sync::atomic::Ordering::Relaxed);
    let mut parts = version.split('.').map(|part| part.parse().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    VALKEY_MAJOR.store(
        if valkey { major } else { 0 },
        std::sync::atomic::Ordering::Relaxed,
    );
    MAJOR.store(major, std::sync::atomic::Ordering::Relaxed);
    (valkey, major, minor)
}
