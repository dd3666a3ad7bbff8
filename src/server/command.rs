//! Command registration through the raw API. Handlers see the call's arguments as borrowed
//! strings: no copy and no reference counting per argument, which matters on a path as short
//! as a release.

use std::ffi::CString;
use std::mem::{ManuallyDrop, MaybeUninit};
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
    let argv: &[*mut raw::RedisModuleString] = if argv.is_null() {
        &[]
    } else {
        // SAFETY: Redis passes `argc` valid strings that live until the command returns.
        unsafe { std::slice::from_raw_parts(argv, argc as usize) }
    };
    let args = Args::new(argv.iter().copied());
    context.reply(handler(&context, args.as_slice())) as c_int
}

/// Wraps a string of the current call without taking a reference: `Arg` never frees it.
fn borrow(inner: *mut raw::RedisModuleString) -> Arg {
    Arg(ManuallyDrop::new(RedisString::from_redis_module_string(
        ptr::null_mut(),
        inner,
    )))
}

/// Arguments a call's entry keeps on the stack; longer calls (sets) use the heap.
const ON_STACK: usize = 24;

/// A call's arguments, on the stack when they fit, so a call allocates nothing to see them.
struct Args {
    stack: [MaybeUninit<Arg>; ON_STACK],
    len: usize,
    heap: Vec<Arg>,
}

impl Args {
    fn new(strings: impl ExactSizeIterator<Item = *mut raw::RedisModuleString>) -> Args {
        let mut args = Args {
            stack: [const { MaybeUninit::uninit() }; ON_STACK],
            len: 0,
            heap: Vec::new(),
        };
        if strings.len() > ON_STACK {
            args.heap = strings.map(borrow).collect();
        } else {
            for (slot, inner) in args.stack.iter_mut().zip(strings) {
                slot.write(borrow(inner));
                args.len += 1;
            }
        }
        args
    }

    fn as_slice(&self) -> &[Arg] {
        if self.heap.is_empty() {
            // SAFETY: the first `len` slots were written in `new`; `Arg` needs no drop.
            unsafe { std::slice::from_raw_parts(self.stack.as_ptr().cast::<Arg>(), self.len) }
        } else {
            &self.heap
        }
    }
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
/// filter left in its short form). The added strings are the module's and freed on drop. One
/// semaphore's keys and arguments stay on the stack.
pub struct Expanded {
    args: Args,
    added: [*mut raw::RedisModuleString; ADDED_ON_STACK],
    added_len: usize,
    added_heap: Vec<*mut raw::RedisModuleString>,
}

/// Keys added on the stack: one semaphore's derived keys.
const ADDED_ON_STACK: usize = 4;

impl Expanded {
    /// `args` with `keys` (module-owned strings, see [`module_string`]) inserted at `at`.
    pub fn new(
        args: &[Arg],
        at: usize,
        keys: impl ExactSizeIterator<Item = *mut raw::RedisModuleString>,
    ) -> Expanded {
        let mut added = [ptr::null_mut(); ADDED_ON_STACK];
        let mut added_len = 0;
        let mut added_heap = Vec::new();
        if keys.len() > ADDED_ON_STACK {
            added_heap = keys.collect();
        } else {
            for (slot, key) in added.iter_mut().zip(keys) {
                *slot = key;
                added_len += 1;
            }
        }
        let mut expanded = Expanded {
            args: Args::new(std::iter::empty()),
            added,
            added_len,
            added_heap,
        };
        let at = at.min(args.len());
        let strings = args[..at]
            .iter()
            .map(|arg| arg.inner)
            .chain(expanded.added().iter().copied())
            .chain(args[at..].iter().map(|arg| arg.inner));
        expanded.args = Args::new(Counted(strings, args.len() + expanded.added().len()));
        expanded
    }

    pub fn args(&self) -> &[Arg] {
        self.args.as_slice()
    }

    /// The strings the module added.
    pub fn added(&self) -> &[*mut raw::RedisModuleString] {
        if self.added_heap.is_empty() {
            &self.added[..self.added_len]
        } else {
            &self.added_heap
        }
    }
}

/// A module-owned string (no context) of `bytes`, for [`Expanded::new`], which frees it.
pub fn module_string(bytes: &[u8]) -> *mut raw::RedisModuleString {
    // SAFETY: a string no context owns; its owner frees it.
    unsafe {
        raw::RedisModule_CreateString.unwrap()(ptr::null_mut(), bytes.as_ptr().cast(), bytes.len())
    }
}

/// An iterator with a known length (a chain of slices is one, but `Chain` does not say so).
pub struct Counted<I>(pub I, pub usize);

impl<I: Iterator> Iterator for Counted<I> {
    type Item = I::Item;

    fn next(&mut self) -> Option<I::Item> {
        let item = self.0.next()?;
        self.1 -= 1;
        Some(item)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.1, Some(self.1))
    }
}

impl<I: Iterator> ExactSizeIterator for Counted<I> {}

impl Drop for Expanded {
    fn drop(&mut self) {
        for &key in self.added() {
            // SAFETY: created for `new`, freed once; `args` borrows them only until here.
            unsafe { raw::RedisModule_FreeString.unwrap()(ptr::null_mut(), key) };
        }
    }
}
