//! Command registration through the raw API. Handlers see the call's arguments as borrowed
//! strings: no copy and no reference counting per argument, which matters on a path as short
//! as a release.

use std::ffi::CString;
use std::mem::ManuallyDrop;
use std::ops::Deref;
use std::os::raw::c_int;
use std::ptr;

use redis_module::{raw, Context, RedisResult, RedisString};

/// One argument of the current call, borrowed from Redis for the length of the call.
pub struct Arg(ManuallyDrop<RedisString>);

impl Deref for Arg {
    type Target = RedisString;

    fn deref(&self) -> &RedisString {
        &self.0
    }
}

pub type Handler = fn(&Context, &[Arg]) -> RedisResult;

/// The body of every command's entry point: runs `handler` on the call's arguments and sends
/// its reply.
pub fn run(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
    handler: Handler,
) -> c_int {
    let context = Context::new(ctx);
    let args: Vec<Arg> = if argv.is_null() {
        Vec::new()
    } else {
        // SAFETY: Redis passes `argc` valid strings that live until the command returns. They
        // are wrapped without taking a reference, so they must never be freed here: `Arg`
        // never drops its string.
        unsafe { std::slice::from_raw_parts(argv, argc as usize) }
            .iter()
            .map(|&inner| {
                Arg(ManuallyDrop::new(RedisString::from_redis_module_string(
                    ptr::null_mut(),
                    inner,
                )))
            })
            .collect()
    };
    context.reply(handler(&context, &args)) as c_int
}

pub type EntryPoint =
    extern "C" fn(*mut raw::RedisModuleCtx, *mut *mut raw::RedisModuleString, c_int) -> c_int;

/// Creates a command with key range 1 1 1 (the name); command info refines it.
pub fn create(
    ctx: *mut raw::RedisModuleCtx,
    name: &str,
    entry: EntryPoint,
    flags: &str,
) -> Result<(), String> {
    let c_name = CString::new(name).map_err(|_| format!("bad command name {name}"))?;
    let c_flags = CString::new(flags).map_err(|_| format!("bad flags for {name}"))?;
    // SAFETY: called from OnLoad with its context; Redis copies the name and flags.
    let status = unsafe {
        raw::RedisModule_CreateCommand.unwrap()(
            ctx,
            c_name.as_ptr(),
            Some(entry),
            c_flags.as_ptr(),
            1,
            1,
            1,
        )
    };
    if status == raw::REDISMODULE_OK as c_int {
        Ok(())
    } else {
        Err(format!("the server refused to create {name}"))
    }
}
