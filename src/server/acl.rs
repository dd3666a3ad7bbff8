//! The caller's ACL on keys the server was not told of: where the command filter cannot insert
//! a call's derived keys (see `filter.rs`), the command checks them itself, as Redis would have.

use std::os::raw::c_int;

use redis_module::{raw, Context};

use crate::error::SemError;

/// What `RedisModule_ACLCheckKeyPermissions` asks of a key with key-spec `flags`: it takes
/// the access bits (ACCESS, UPDATE, INSERT, DELETE), not the RO/RW/OW/RM ones.
fn access_bits(flags: u32) -> c_int {
    let (ro, rw, ow, rm) = (
        raw::REDISMODULE_CMD_KEY_RO,
        raw::REDISMODULE_CMD_KEY_RW,
        raw::REDISMODULE_CMD_KEY_OW,
        raw::REDISMODULE_CMD_KEY_RM,
    );
    let (access, update, insert, delete) = (
        raw::REDISMODULE_CMD_KEY_ACCESS,
        raw::REDISMODULE_CMD_KEY_UPDATE,
        raw::REDISMODULE_CMD_KEY_INSERT,
        raw::REDISMODULE_CMD_KEY_DELETE,
    );
    let mut bits = flags & (access | update | insert | delete);
    if flags & (ro | rw) != 0 {
        bits |= access;
    }
    if flags & (rw | ow | rm) != 0 {
        bits |= update | insert | delete;
    }
    bits as c_int
}

/// Whether the caller's user may use every key of `keys` as `flags` (key-spec flags) say; a
/// refusal is written to `ACL LOG` as Redis writes its own. A caller without a user of its own
/// (the server's internal clients run as the superuser) may.
pub fn may_use(
    ctx: &Context,
    keys: &[*mut raw::RedisModuleString],
    flags: u32,
) -> Result<bool, SemError> {
    let Some(user) = CallerUser::of(ctx)? else {
        return Ok(true);
    };
    let flags = access_bits(flags);
    let refused = keys.iter().find(|&&key| {
        // SAFETY: a user Redis gave us and a valid string.
        let status =
            unsafe { raw::RedisModule_ACLCheckKeyPermissions.unwrap()(user.0, key, flags) };
        status != raw::REDISMODULE_OK as c_int
    });
    let Some(&key) = refused else {
        return Ok(true);
    };
    // SAFETY: as above; the entry names the refused key, as Redis's own entries do.
    unsafe {
        if let Some(log) = raw::RedisModule_ACLAddLogEntry {
            log(
                ctx.ctx,
                user.0,
                key,
                raw::RedisModuleACLLogEntryReason_REDISMODULE_ACL_LOG_KEY,
            );
        }
    }
    Ok(false)
}

/// The caller's ACL user, freed on drop.
struct CallerUser(*mut raw::RedisModuleUser);

impl CallerUser {
    /// The user of the caller's connection; for a script or a module's call, which run on
    /// temporary clients the server does not list, the user the context's client carries (a
    /// script's caller's: the server sets it; a module's call with the `C` flag: the module's
    /// caller's). `None`: a client without a user (the primary's link, a module's call
    /// without `C`), which the server runs as the superuser and checks no key of.
    fn of(ctx: &Context) -> Result<Option<CallerUser>, SemError> {
        // SAFETY: the command's own context; the name is freed below, the user on drop.
        unsafe {
            let id = raw::RedisModule_GetClientId.unwrap()(ctx.ctx);
            let mut name = raw::RedisModule_GetClientUserNameById.unwrap()(ctx.ctx, id);
            if name.is_null() && errno() == ENOENT {
                // RedisModule_GetCurrentUserName dereferences a missing user on Redis 7 and
                // Valkey 8: ask first whether there is one.
                if !super::current_user_name_is_safe() && !context_has_user(ctx) {
                    return Ok(None);
                }
                name = raw::RedisModule_GetCurrentUserName.unwrap()(ctx.ctx);
            }
            if name.is_null() {
                return Ok(None);
            }
            let user = raw::RedisModule_GetModuleUserFromUserName.unwrap()(name);
            raw::RedisModule_FreeString.unwrap()(ctx.ctx, name);
            if user.is_null() {
                // The user was deleted while the call runs (a script's caller's): nothing may
                // be assumed of its keys.
                return Err(SemError::NoPermission);
            }
            Ok(Some(CallerUser(user)))
        }
    }
}

/// Whether the context's client has an ACL user, asked without reading it: `RedisModule_Call`
/// with `C` (run as the context's user) answers `ENOTSUP` before anything else when there is
/// none, and otherwise looks the command up, which a name with a space never finds: nothing
/// runs, nothing is logged. Redis 7.0 to 7.4 and Valkey 7.2 to 8.x check in this order.
fn context_has_user(ctx: &Context) -> bool {
    // SAFETY: the command's own context; the format names no argument; a reply is freed.
    unsafe {
        let reply = raw::RedisModule_Call.unwrap()(ctx.ctx, c"sem probe".as_ptr(), c"C".as_ptr());
        let no_user = reply.is_null() && errno() == ENOTSUP;
        if !reply.is_null() {
            raw::RedisModule_FreeCallReply.unwrap()(reply);
        }
        !no_user
    }
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// ENOENT on Linux and the BSDs: the id names no connection (a script's or a module's client).
const ENOENT: i32 = 2;

/// ENOTSUP on Linux (EOPNOTSUPP): `RedisModule_Call` with `C` found no user to run as.
#[cfg(target_os = "linux")]
const ENOTSUP: i32 = 95;
#[cfg(not(target_os = "linux"))]
const ENOTSUP: i32 = 45;

impl Drop for CallerUser {
    fn drop(&mut self) {
        // SAFETY: a user from GetModuleUserFromUserName, freed once.
        unsafe { raw::RedisModule_FreeModuleUser.unwrap()(self.0) };
    }
}
