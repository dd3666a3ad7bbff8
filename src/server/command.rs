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

/// A call's arguments with keys added by the module (the derived keys of a call the command
/// filter left in its short form). The added strings are the module's and freed on drop.
pub struct Expanded {
    args: Vec<Arg>,
    added: Vec<*mut raw::RedisModuleString>,
}

impl Expanded {
    /// `args` with `keys` inserted at `at`.
    pub fn new(args: &[Arg], at: usize, keys: &[Vec<u8>]) -> Expanded {
        let added: Vec<_> = keys
            .iter()
            .map(|key| {
                // SAFETY: a module-owned string (no context), freed on drop.
                unsafe {
                    raw::RedisModule_CreateString.unwrap()(
                        ptr::null_mut(),
                        key.as_ptr().cast(),
                        key.len(),
                    )
                }
            })
            .collect();
        let borrow = |inner: *mut raw::RedisModuleString| {
            Arg(ManuallyDrop::new(RedisString::from_redis_module_string(
                ptr::null_mut(),
                inner,
            )))
        };
        let at = at.min(args.len());
        let args = args[..at]
            .iter()
            .map(|arg| borrow(arg.inner))
            .chain(added.iter().map(|&key| borrow(key)))
            .chain(args[at..].iter().map(|arg| borrow(arg.inner)))
            .collect();
        Expanded { args, added }
    }

    pub fn args(&self) -> &[Arg] {
        &self.args
    }

    /// The strings the module added.
    pub fn added(&self) -> &[*mut raw::RedisModuleString] {
        &self.added
    }
}

impl Drop for Expanded {
    fn drop(&mut self) {
        for &key in &self.added {
            // SAFETY: created in `new`, freed once; `args` borrows them only until here.
            unsafe { raw::RedisModule_FreeString.unwrap()(ptr::null_mut(), key) };
        }
    }
}
