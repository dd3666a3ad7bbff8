//! The command filter. It names every key of a SEM.* call to the server (see `keys.rs`): it
//! inserts the derived key names the command uses right after the name, so Redis's ACL checks
//! and Cluster redirection see them. While somebody waits for a permit, it also tells the
//! waiting side of Cluster slot moves. It runs before every command the server receives, so
//! for the others it returns after a length check and one atomic load.

use std::os::raw::{c_char, c_int};
use std::panic::{catch_unwind, AssertUnwindSafe};

use redis_module::raw;

use crate::keys::{is_derived, set_name_positions, with_derived, Command};
use crate::{stats, waiting};

/// Registers the filter.
pub fn register(ctx: *mut raw::RedisModuleCtx) -> Result<(), String> {
    // SAFETY: called once from OnLoad with its context; the callback is a plain function.
    // NOSELF: the module's own calls (the counter's GET) need nothing from it.
    let filter = unsafe {
        raw::RedisModule_RegisterCommandFilter.unwrap()(
            ctx,
            Some(insert_keys),
            raw::REDISMODULE_CMDFILTER_NOSELF as c_int,
        )
    };
    if filter.is_null() {
        Err("the server refused the command filter".into())
    } else {
        Ok(())
    }
}

extern "C" fn insert_keys(fctx: *mut raw::RedisModuleCommandFilterCtx) {
    // A panic must not unwind into redis-server; the filter has nothing to undo.
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: Redis passes a valid filter context for the command being filtered.
        unsafe { filter_command(fctx) }
    }));
}

/// The argument at `pos` as bytes; valid until the arguments change.
unsafe fn arg<'a>(fctx: *mut raw::RedisModuleCommandFilterCtx, pos: c_int) -> Option<&'a [u8]> {
    let string = raw::RedisModule_CommandFilterArgGet.unwrap()(fctx, pos);
    if string.is_null() {
        return None;
    }
    let mut len = 0;
    let ptr = raw::RedisModule_StringPtrLen.unwrap()(string, &mut len);
    Some(std::slice::from_raw_parts(ptr.cast::<u8>(), len))
}

unsafe fn filter_command(fctx: *mut raw::RedisModuleCommandFilterCtx) {
    let argc = raw::RedisModule_CommandFilterArgsCount.unwrap()(fctx);
    if argc < 2 {
        return; // no name: Redis answers with its arity error
    }
    let Some(command) = arg(fctx, 0).and_then(Command::from_name) else {
        let is = |pos, word: &[u8]| arg(fctx, pos).is_some_and(|a| a.eq_ignore_ascii_case(word));
        // Redis resets its own statistics; the module's distributions go with them.
        if argc == 2 && is(0, b"CONFIG") && is(1, b"RESETSTAT") {
            stats::reset_distributions();
        }
        if waiting::queued_anywhere() {
            note_other_command(fctx);
        }
        return;
    };
    if let Some(step) = command.set_step() {
        append_set_keys(fctx, argc, step, command.derived_suffixes());
        return;
    }
    let Some(name) = arg(fctx, 1) else {
        return;
    };
    let suffixes = command.derived_suffixes();
    // Redis 7.0 filters a command again when it runs it after a pause (`CLIENT PAUSE WRITE`
    // postpones writes): the names are there already. (No call of the short form has them
    // there: each would be an invalid limit, lease, identifier or option.)
    let already = suffixes.iter().enumerate().all(|(i, suffix)| {
        arg(fctx, 2 + i as c_int).is_some_and(|key| is_derived(key, name, suffix))
    });
    if already {
        return;
    }
    // Every derived name is built before the first insertion moves the argument vector (the
    // name's bytes stay where they are, but the borrow ends here).
    let mut keys = [std::ptr::null_mut(); 4];
    for (key, suffix) in keys.iter_mut().zip(suffixes) {
        *key = with_derived(name, suffix, |bytes| {
            raw::RedisModule_CreateString.unwrap()(
                std::ptr::null_mut(),
                bytes.as_ptr().cast::<c_char>(),
                bytes.len(),
            )
        });
    }
    let insert = raw::RedisModule_CommandFilterArgInsert.unwrap();
    for (i, key) in keys[..suffixes.len()].iter().enumerate() {
        // Redis owns the string from here and frees it with the command's arguments.
        insert(fctx, 2 + i as c_int, *key);
    }
}

/// A call on a set of semaphores (`numsems name ...`): each name's derived keys are appended
/// after the client's arguments, in the names' order. A call whose `numsems` or names are
/// malformed is left as sent: the command answers the error.
unsafe fn append_set_keys(
    fctx: *mut raw::RedisModuleCommandFilterCtx,
    argc: c_int,
    step: usize,
    suffixes: &[&[u8]],
) {
    let sent = argc as usize;
    let Some(positions) = arg(fctx, 1).and_then(|n| set_name_positions(step, n, sent)) else {
        return;
    };
    let total = positions.len() * suffixes.len();
    // Redis 7.0 filters a command again when it runs it after a pause: the keys are there.
    let last_name = positions[positions.len() - 1];
    if sent >= last_name + 1 + total {
        let start = sent - total;
        let already = positions.iter().enumerate().all(|(i, &pos)| {
            arg(fctx, pos as c_int).is_some_and(|name| {
                suffixes.iter().enumerate().all(|(j, suffix)| {
                    let at = start + i * suffixes.len() + j;
                    arg(fctx, at as c_int).is_some_and(|key| is_derived(key, name, suffix))
                })
            })
        });
        if already {
            return;
        }
    }
    // Every key is built before the first insertion moves the argument vector.
    let mut keys = Vec::with_capacity(total);
    for &pos in &positions {
        let Some(name) = arg(fctx, pos as c_int) else {
            return;
        };
        for suffix in suffixes {
            keys.push(with_derived(name, suffix, |bytes| {
                raw::RedisModule_CreateString.unwrap()(
                    std::ptr::null_mut(),
                    bytes.as_ptr().cast::<c_char>(),
                    bytes.len(),
                )
            }));
        }
    }
    let insert = raw::RedisModule_CommandFilterArgInsert.unwrap();
    for (i, key) in keys.into_iter().enumerate() {
        // Redis owns the string from here and frees it with the command's arguments.
        insert(fctx, argc + i as c_int, key);
    }
}

/// Another command while somebody waits: a Cluster slot change may take waited-on
/// semaphores away. (Changes to waited keys are heard of as keyspace events, `events.rs`:
/// the filter sees reads too, and must cost them nothing.)
unsafe fn note_other_command(fctx: *mut raw::RedisModuleCommandFilterCtx) {
    let is = |pos, word: &[u8]| arg(fctx, pos).is_some_and(|a| a.eq_ignore_ascii_case(word));
    if is(0, b"CLUSTER") && is(1, b"SETSLOT") {
        waiting::recheck_all();
    }
}
