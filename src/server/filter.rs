//! The command filter, registered in Redis Cluster only. It names every key of a SEM.* call to
//! the server (see `keys.rs`): it inserts the derived key names the command uses right after
//! the name (after the client's arguments for a set), so that while a slot moves key by key
//! (`MIGRATE`, as `redis-cli --cluster reshard` does it) the server answers `ASK`/`TRYAGAIN`
//! for a semaphore that is partly gone instead of letting the call act on what is left. No
//! module API tells a module that its slot is migrating. It also hears, while somebody waits,
//! of `CLUSTER SETSLOT`.
//!
//! A standalone server gets no filter: every other command would pay for it (about 1 % of a
//! `GET` for a filter that returns at once, 2 % for one that reads the command name, measured
//! with minimal C modules), and there the command inserts the keys itself and checks the
//! caller's ACL on them (`commands.rs`, `server/acl.rs`). In Cluster, where a filter cannot be
//! afforded or cannot insert safely, short calls are refused (`SemError::NeedsKeys`):
//! - Redis 8.4 and later look every command up and extract its keys twice once any filter is
//!   registered (redis#14440): no filter there.
//! - Valkey 9 copies the arguments of a command run by a script or a module (`VM_Call`) on the
//!   first insertion with room for exactly one more, and writes past that copy on the next: on
//!   Valkey 9 the filter inserts only for commands of a real connection.

use std::os::raw::{c_char, c_int};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};

use redis_module::raw;

use crate::keys::{key_plan, with_derived, Command, KeyPlan};
use crate::server::hooks::hooks;

/// Whether insertions are limited to commands of real connections (Valkey 9 and later).
static CONNECTIONS_ONLY: AtomicBool = AtomicBool::new(false);

/// Which Cluster servers get a filter, and how it inserts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Every SEM.* call's keys are inserted.
    Insert,
    /// Only calls of real connections get their keys inserted (Valkey 9 and later).
    InsertForConnections,
    /// No filter (Redis 8.4 and later).
    None,
}

/// The mode for a server, from its name and version (`major`, `minor`).
pub fn mode_for(valkey: bool, major: u32, minor: u32) -> Mode {
    match (valkey, major, minor) {
        (true, 9.., _) => Mode::InsertForConnections,
        (true, ..) => Mode::Insert,
        (false, 9.., _) | (false, 8, 4..) => Mode::None,
        (false, ..) => Mode::Insert,
    }
}

/// Registers the filter the mode asks for.
pub fn register(ctx: *mut raw::RedisModuleCtx, mode: Mode) -> Result<(), String> {
    CONNECTIONS_ONLY.store(mode == Mode::InsertForConnections, Ordering::Relaxed);
    if mode == Mode::None {
        return Ok(());
    }
    // SAFETY: called once from OnLoad with its context; the callback is a plain function.
    // NOSELF: the module's own calls (the counter's GET) need nothing from it.
    let filter = unsafe {
        raw::RedisModule_RegisterCommandFilter.unwrap()(
            ctx,
            Some(filter),
            raw::REDISMODULE_CMDFILTER_NOSELF as c_int,
        )
    };
    if filter.is_null() {
        Err("the server refused the command filter".into())
    } else {
        Ok(())
    }
}

/// The filter. Nothing before the first return can panic; the rest runs under a guard.
extern "C" fn filter(fctx: *mut raw::RedisModuleCommandFilterCtx) {
    // SAFETY: Redis passes a valid filter context for the command being filtered.
    let Some(name) = (unsafe { arg(fctx, 0) }) else {
        return;
    };
    let first = match name.first() {
        Some(byte) => byte | 0x20,
        None => return,
    };
    // SEM.* names are 7 to 15 bytes long; CLUSTER is 7.
    let ours = first == b's' && matches!(name.len(), 7 | 9 | 11 | 13 | 14 | 15);
    let rare = first == b'c' && name.len() == 7;
    if !ours && !rare {
        return;
    }
    // A panic must not unwind into redis-server; the filter has nothing to undo.
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: as above.
        unsafe {
            match Command::from_name(name) {
                Some(command) => insert_keys(fctx, command),
                None => note_other_command(fctx, name),
            }
        }
    }));
}

/// The argument at `pos` as bytes; valid until the arguments change.
unsafe fn arg<'a>(fctx: *mut raw::RedisModuleCommandFilterCtx, pos: c_int) -> Option<&'a [u8]> {
    let string = raw::RedisModule_CommandFilterArgGet?(fctx, pos);
    if string.is_null() {
        return None;
    }
    let mut len = 0;
    let ptr = raw::RedisModule_StringPtrLen?(string, &mut len);
    Some(std::slice::from_raw_parts(ptr.cast::<u8>(), len))
}

/// Inserts a SEM.* call's derived keys where [`key_plan`] says.
unsafe fn insert_keys(fctx: *mut raw::RedisModuleCommandFilterCtx, command: Command) {
    if CONNECTIONS_ONLY.load(Ordering::Relaxed) && !from_connection(fctx) {
        return;
    }
    let argc = raw::RedisModule_CommandFilterArgsCount.unwrap()(fctx);
    let Some(plan) = key_plan(command, argc as usize, |i| arg(fctx, i as c_int)) else {
        return;
    };
    // Every key is built before the first insertion moves the argument vector (the names'
    // bytes stay where they are, but the borrows end here). One semaphore's four fit on the
    // stack; a set's go to the heap.
    let suffixes = command.derived_suffixes();
    let names = plan.names();
    let mut single = [std::ptr::null_mut(); 4];
    let mut set = Vec::new();
    let keys: &mut [*mut raw::RedisModuleString] = match plan {
        KeyPlan::Single if suffixes.len() == single.len() => &mut single,
        _ => {
            set.resize(names.len() * suffixes.len(), std::ptr::null_mut());
            &mut set
        }
    };
    for (i, &pos) in names.iter().enumerate() {
        let Some(name) = arg(fctx, pos as c_int) else {
            return;
        };
        for (j, suffix) in suffixes.iter().enumerate() {
            keys[i * suffixes.len() + j] = with_derived(name, suffix, |bytes| {
                raw::RedisModule_CreateString.unwrap()(
                    std::ptr::null_mut(),
                    bytes.as_ptr().cast::<c_char>(),
                    bytes.len(),
                )
            });
        }
    }
    let insert = raw::RedisModule_CommandFilterArgInsert.unwrap();
    for (i, &key) in keys.iter().enumerate() {
        // Redis owns the string from here and frees it with the command's arguments.
        insert(fctx, (plan.at() + i) as c_int, key);
    }
}

/// Whether the command comes from a real connection, not from a script or a module's call,
/// which run on temporary clients the server does not list.
unsafe fn from_connection(fctx: *mut raw::RedisModuleCommandFilterCtx) -> bool {
    let (Some(client_id), Some(info)) = (
        raw::RedisModule_CommandFilterGetClientId,
        raw::RedisModule_GetClientInfoById,
    ) else {
        return false;
    };
    info(std::ptr::null_mut(), client_id(fctx)) == raw::REDISMODULE_OK as c_int
}

/// `CLUSTER SETSLOT` while somebody waits: a slot change may take waited-on semaphores away.
unsafe fn note_other_command(fctx: *mut raw::RedisModuleCommandFilterCtx, name: &[u8]) {
    if name.eq_ignore_ascii_case(b"CLUSTER")
        && (hooks().follows_keys)()
        && arg(fctx, 1).is_some_and(|a| a.eq_ignore_ascii_case(b"SETSLOT"))
    {
        (hooks().slot_changed)();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn servers_get_the_filter_they_can_afford() {
        let table = [
            (false, 7, 0, Mode::Insert),
            (false, 7, 4, Mode::Insert),
            (false, 8, 2, Mode::Insert),
            (false, 8, 4, Mode::None),
            (false, 8, 6, Mode::None),
            (false, 9, 0, Mode::None),
            (true, 7, 2, Mode::Insert),
            (true, 8, 1, Mode::Insert),
            (true, 9, 0, Mode::InsertForConnections),
            (true, 9, 1, Mode::InsertForConnections),
        ];
        for (valkey, major, minor, want) in table {
            assert_eq!(
                mode_for(valkey, major, minor),
                want,
                "{valkey} {major}.{minor}"
            );
        }
    }
}
