//! Command registration through the raw API. Handlers see the call's arguments as borrowed
//! strings: no copy and no reference counting per argument, which matters on a path as short
//! as a release.

use std::cell::RefCell;
use std::ffi::CString;
use std::mem::{ManuallyDrop, MaybeUninit};
use std::ops::Deref;
use std::os::raw::c_int;
use std::ptr;

use redis_module::{raw, Context, RedisResult, RedisString};

use crate::keys::{is_derived, with_derived};

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
/// filter left in its short form). The module holds a reference to each added string, dropped
/// with this. One semaphore's keys and arguments stay on the stack.
pub struct Expanded {
    args: Args,
    added: [*mut raw::RedisModuleString; ADDED_ON_STACK],
    added_len: usize,
    added_heap: Vec<*mut raw::RedisModuleString>,
}

/// Keys added on the stack: one semaphore's derived keys.
const ADDED_ON_STACK: usize = 4;

impl Expanded {
    /// `args` with `<name><suffix>` for each name (at the positions `names`) and each suffix,
    /// name after name, inserted at `at`.
    pub fn new(args: &[Arg], at: usize, names: &[usize], suffixes: &[&[u8]]) -> Expanded {
        let count = names.len() * suffixes.len();
        let mut expanded = Expanded {
            args: Args::new(std::iter::empty()),
            added: [ptr::null_mut(); ADDED_ON_STACK],
            added_len: 0,
            added_heap: Vec::new(),
        };
        if count > ADDED_ON_STACK {
            expanded.added_heap.reserve_exact(count);
        }
        for &pos in names {
            derived_keys(args[pos].as_slice(), suffixes, |key| {
                if count > ADDED_ON_STACK {
                    expanded.added_heap.push(key);
                } else {
                    expanded.added[expanded.added_len] = key;
                    expanded.added_len += 1;
                }
            });
        }
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

impl Drop for Expanded {
    fn drop(&mut self) {
        for &key in self.added() {
            // SAFETY: each added string carries a reference of its own, dropped once here.
            unsafe { raw::RedisModule_FreeString.unwrap()(ptr::null_mut(), key) };
        }
    }
}

/// Semaphores whose derived key strings are kept (see [`derived_keys`]).
const KEPT: usize = 8;
/// The derived keys kept of each: one per suffix, for the usual four.
const KEPT_KEYS: usize = 4;

/// Calls `add` with a module string (no context) of `<name><suffix>` for each suffix, each with
/// a reference of its own for the caller to free. The strings of the last few semaphores are
/// kept and handed out again when the same name comes back (a client calls the same semaphore
/// over and over): a look-up instead of creating and freeing four strings per call.
fn derived_keys(name: &[u8], suffixes: &[&[u8]], mut add: impl FnMut(*mut raw::RedisModuleString)) {
    // Commands run on the server's main thread only, one at a time.
    thread_local! {
        static KEPT_STRINGS: RefCell<[[*mut raw::RedisModuleString; KEPT_KEYS]; KEPT]> =
            const { RefCell::new([[ptr::null_mut(); KEPT_KEYS]; KEPT]) };
    }
    if suffixes.len() != KEPT_KEYS {
        for suffix in suffixes {
            add(new_key(name, suffix));
        }
        return;
    }
    let slot = kept_slot(name);
    KEPT_STRINGS.with_borrow_mut(|kept| {
        let entry = &mut kept[slot];
        // SAFETY: strings no context owns; the table holds one reference to each it keeps, and
        // each string handed out carries one more, which the caller frees.
        unsafe {
            let known = entry
                .iter()
                .zip(suffixes)
                .all(|(&key, suffix)| !key.is_null() && is_key(key, name, suffix));
            if !known {
                for key in entry.iter_mut() {
                    if !key.is_null() {
                        raw::RedisModule_FreeString.unwrap()(ptr::null_mut(), *key);
                    }
                }
                for (key, suffix) in entry.iter_mut().zip(suffixes) {
                    *key = new_key(name, suffix);
                }
            }
            for &key in entry.iter() {
                raw::RedisModule_RetainString.unwrap()(ptr::null_mut(), key);
                add(key);
            }
        }
    });
}

/// Whether module string `key` is `<name><suffix>`.
unsafe fn is_key(key: *mut raw::RedisModuleString, name: &[u8], suffix: &[u8]) -> bool {
    let mut len = 0;
    let data = raw::RedisModule_StringPtrLen.unwrap()(key, &mut len);
    is_derived(
        std::slice::from_raw_parts(data.cast::<u8>(), len),
        name,
        suffix,
    )
}

/// A new module string of `<name><suffix>`.
fn new_key(name: &[u8], suffix: &[u8]) -> *mut raw::RedisModuleString {
    with_derived(name, suffix, |key| {
        // SAFETY: a string no context owns; its owner frees it.
        unsafe {
            raw::RedisModule_CreateString.unwrap()(ptr::null_mut(), key.as_ptr().cast(), key.len())
        }
    })
}

/// Where [`derived_keys`] keeps a name's strings: by a hash of the name.
fn kept_slot(name: &[u8]) -> usize {
    let hash = name.iter().fold(name.len() as u64, |hash, &byte| {
        (hash.rotate_left(5) ^ u64::from(byte)).wrapping_mul(0x9E37_79B9_7F4A_7C15)
    });
    (hash >> (64 - KEPT.trailing_zeros())) as usize
}

/// An iterator with a known length (a chain of slices is one, but `Chain` does not say so).
struct Counted<I>(I, usize);

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
