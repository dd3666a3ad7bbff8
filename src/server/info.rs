//! `INFO sem`: the module's section of INFO, with the fields the info hook composes.

use std::ffi::CString;
use std::os::raw::c_int;

use redis_module::raw;

use crate::server::guard;
use crate::server::hooks::hooks;

/// Registers the INFO callback (replacing the crate's empty one).
pub fn register(ctx: *mut raw::RedisModuleCtx) -> Result<(), String> {
    // SAFETY: the OnLoad context; the callback is a plain function.
    let status = unsafe { raw::RedisModule_RegisterInfoFunc.unwrap()(ctx, Some(fill)) };
    if status == raw::REDISMODULE_OK as c_int {
        Ok(())
    } else {
        Err("the server refused the INFO callback".into())
    }
}

extern "C" fn fill(ctx: *mut raw::RedisModuleInfoCtx, for_crash_report: c_int) {
    if for_crash_report == 0 {
        guard((), || {
            if let Some(processed) = commands_processed() {
                (hooks().commands_processed)(processed);
            }
        });
    }
    // SAFETY: the INFO context Redis passes; the section name and field names are C strings
    // that live through each call. The section is the module's own ("sem").
    let (fields, distributions) = guard((Vec::new(), Vec::new()), hooks().info);
    unsafe {
        raw::RedisModule_InfoAddSection.unwrap()(ctx, std::ptr::null_mut());
        for (name, value) in fields {
            let name = CString::new(name).expect("no NUL in field names");
            raw::RedisModule_InfoAddFieldULongLong.unwrap()(ctx, name.as_ptr().cast_mut(), value);
        }
        for (name, value) in distributions {
            let name = CString::new(name).expect("no NUL in field names");
            let value = CString::new(value).expect("no NUL in a summary");
            raw::RedisModule_InfoAddFieldCString.unwrap()(
                ctx,
                name.as_ptr().cast_mut(),
                value.as_ptr().cast_mut(),
            );
        }
    }
}

/// The server's `total_commands_processed`, which only `CONFIG RESETSTAT` lowers: how the
/// module hears of that command without a command filter (`Hooks::commands_processed`).
fn commands_processed() -> Option<u64> {
    // SAFETY: no context (the data is then freed by hand, below); the section "stats" holds no
    // module's fields, so no INFO callback runs inside this one.
    unsafe {
        let info = raw::RedisModule_GetServerInfo?(std::ptr::null_mut(), c"stats".as_ptr());
        if info.is_null() {
            return None;
        }
        let mut err: c_int = 0;
        let value = raw::RedisModule_ServerInfoGetFieldUnsigned?(
            info,
            c"total_commands_processed".as_ptr(),
            &mut err,
        );
        raw::RedisModule_FreeServerInfo.unwrap()(std::ptr::null_mut(), info);
        (err == 0).then_some(value)
    }
}
