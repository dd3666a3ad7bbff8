//! Registers the module's settings (`config.rs`) as Redis module configs, so that
//! `CONFIG SET/GET sem.*`, redis.conf lines and `CONFIG REWRITE` handle them.

use std::ffi::CString;
use std::os::raw::{c_char, c_int, c_longlong, c_void};

use redis_module::raw;

use crate::config::{Setting, SETTINGS};
use crate::server::guard;

/// Registers every setting, then loads the values given in redis.conf or on the command line.
pub fn register(ctx: *mut raw::RedisModuleCtx) -> Result<(), String> {
    for setting in SETTINGS {
        let name = CString::new(setting.name).expect("no NUL in setting names");
        // SAFETY: the OnLoad context; the private data is a static that outlives the module;
        // Redis copies the name.
        let status = unsafe {
            raw::RedisModule_RegisterNumericConfig.unwrap()(
                ctx,
                name.as_ptr(),
                // The default, or what a `loadmodule` argument set (then CONFIG REWRITE leaves
                // the line out, and the argument sets it again at the next start).
                setting.get(),
                if setting.bytes {
                    raw::REDISMODULE_CONFIG_MEMORY
                } else {
                    raw::REDISMODULE_CONFIG_DEFAULT
                },
                setting.min,
                setting.max,
                Some(get),
                Some(set),
                None,
                std::ptr::from_ref::<Setting>(setting)
                    .cast_mut()
                    .cast::<c_void>(),
            )
        };
        if status != raw::REDISMODULE_OK as c_int {
            return Err(format!(
                "the server refused the config sem.{}",
                setting.name
            ));
        }
    }
    // SAFETY: the OnLoad context, after every config is registered.
    if unsafe { raw::RedisModule_LoadConfigs.unwrap()(ctx) } != raw::REDISMODULE_OK as c_int {
        return Err("a sem.* config in the configuration is invalid".into());
    }
    Ok(())
}

unsafe extern "C" fn get(_name: *const c_char, privdata: *mut c_void) -> c_longlong {
    // SAFETY: the private data is the `Setting` registered above.
    let setting = unsafe { &*privdata.cast::<Setting>() };
    guard(0, || setting.get())
}

unsafe extern "C" fn set(
    _name: *const c_char,
    value: c_longlong,
    privdata: *mut c_void,
    _err: *mut *mut raw::RedisModuleString,
) -> c_int {
    // SAFETY: the private data is the `Setting` registered above. Redis checked the bounds.
    let setting = unsafe { &*privdata.cast::<Setting>() };
    guard(raw::REDISMODULE_ERR as c_int, || match setting.set(value) {
        Ok(()) => raw::REDISMODULE_OK as c_int,
        Err(_) => raw::REDISMODULE_ERR as c_int,
    })
}
