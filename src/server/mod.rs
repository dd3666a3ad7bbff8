//! Every raw module-API call of redsem lives under this module, each with its SAFETY comment:
//! open keys and their changes (`key`), the command filter (`filter`), command info
//! (`command_info`), server events (`events`), and the few plain calls below.

pub mod command;
pub mod command_info;
pub mod events;
pub mod filter;
pub mod key;

use std::os::raw::c_int;

use redis_module::{raw, Context};

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
    );
    required
        .iter()
        .filter(|(_, present)| !present)
        .map(|(name, _)| *name)
        .collect()
}

/// Keys are signalled as modified by the key layer only when they changed (see `key.rs`), not
/// by Redis for every key opened for writing: a refused call must not fire WATCH.
pub fn signal_only_changed_keys(ctx: &Context) {
    // SAFETY: the OnLoad context; a documented option bit.
    unsafe {
        raw::RedisModule_SetModuleOptions.unwrap()(
            ctx.ctx,
            raw::REDISMODULE_OPTION_NO_IMPLICIT_SIGNAL_MODIFIED as c_int,
        )
    }
}

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
