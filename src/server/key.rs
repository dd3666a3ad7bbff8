//! An open Redis key, through the low-level key API (no command parsing or fake client per
//! step). Every change a method makes is replicated as it happens, as a plain Redis command with
//! absolute values, and fires the keyspace event Redis's own command would; a key that changed
//! is signalled as modified (WATCH, client-side caching) when it closes, and only then.

use std::cell::Cell;
use std::ffi::CStr;
use std::marker::PhantomData;
use std::os::raw::{c_int, c_longlong};
use std::ptr;

use redis_module::{raw, Context, RedisString};

use crate::error::SemError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Read,
    Write,
}

/// The Redis type a semaphore key must have when it exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyType {
    SortedSet,
    String,
    Hash,
}

impl KeyType {
    fn raw(self) -> isize {
        match self {
            KeyType::SortedSet => raw::REDISMODULE_KEYTYPE_ZSET,
            KeyType::String => raw::REDISMODULE_KEYTYPE_STRING,
            KeyType::Hash => raw::REDISMODULE_KEYTYPE_HASH,
        }
    }
}

/// `ZADD XX` or `ZADD NX`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Only {
    Existing,
    New,
}

/// What `Key::zadd` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ZaddOutcome {
    Added,
    Updated,
    /// `Only::Existing` and the member was not there, or `Only::New` and it was: nothing
    /// changed.
    Skipped,
}

/// An open key of the current call, closed on drop. It borrows the call's context and name.
pub struct Key<'a> {
    ctx: *mut raw::RedisModuleCtx,
    name: &'a RedisString,
    handle: *mut raw::RedisModuleKey,
    changed: Cell<bool>,
    _call: PhantomData<&'a Context>,
}

impl<'a> Key<'a> {
    /// Opens `name`, which must be missing or of type `expected`.
    pub fn open(
        ctx: &'a Context,
        name: &'a RedisString,
        access: Access,
        expected: KeyType,
    ) -> Result<Key<'a>, SemError> {
        let mode = match access {
            Access::Read => raw::REDISMODULE_READ,
            Access::Write => raw::REDISMODULE_READ | raw::REDISMODULE_WRITE,
        };
        // SAFETY: the context and the name are valid for this call, which the key cannot
        // outlive ('a). A logically expired key is deleted here, as any Redis command would.
        let handle =
            unsafe { raw::RedisModule_OpenKey.unwrap()(ctx.ctx, name.inner, mode as c_int) };
        let key = Key {
            ctx: ctx.ctx,
            name,
            handle,
            changed: Cell::new(false),
            _call: PhantomData,
        };
        let found = key.key_type();
        if found == raw::REDISMODULE_KEYTYPE_EMPTY || found == expected.raw() {
            Ok(key)
        } else {
            Err(SemError::WrongType)
        }
    }

    /// Opens the key only if it exists (a look-up costs less than opening and closing a key).
    pub fn open_existing(
        ctx: &'a Context,
        name: &'a RedisString,
        access: Access,
        expected: KeyType,
    ) -> Result<Option<Key<'a>>, SemError> {
        if !super::key_exists(ctx, name) {
            return Ok(None);
        }
        Key::open(ctx, name, access, expected).map(Some)
    }

    /// The key's name.
    pub fn name(&self) -> &'a RedisString {
        self.name
    }

    // The raw number, not `raw::KeyType`, whose conversion panics on types newer than the crate.
    fn key_type(&self) -> isize {
        // SAFETY: KeyType accepts any handle OpenKey returned, NULL included.
        unsafe { raw::RedisModule_KeyType.unwrap()(self.handle) as isize }
    }

    pub fn is_empty(&self) -> bool {
        self.key_type() == raw::REDISMODULE_KEYTYPE_EMPTY
    }

    /// Members of a sorted set; 0 when the key is missing.
    pub fn len(&self) -> u64 {
        if self.is_empty() {
            return 0;
        }
        // SAFETY: an open key of the checked type.
        unsafe { raw::RedisModule_ValueLength.unwrap()(self.handle) as u64 }
    }

    pub fn score(&self, member: &RedisString) -> Option<f64> {
        if self.is_empty() {
            return None;
        }
        let mut score = 0.0;
        // SAFETY: an open sorted-set key and a valid member string.
        let status =
            unsafe { raw::RedisModule_ZsetScore.unwrap()(self.handle, member.inner, &mut score) };
        (status == raw::REDISMODULE_OK as c_int).then_some(score)
    }

    /// Visits the members with `min <= score <= max` (`min < score` when `min_exclusive`),
    /// lowest score first.
    pub fn scan(
        &self,
        min: f64,
        max: f64,
        min_exclusive: bool,
        visit: impl FnMut(RedisString, f64),
    ) {
        self.walk(min, max, min_exclusive, usize::MAX, visit);
    }

    /// Visits the first member of the range, as `scan` would.
    fn scan_first(
        &self,
        min: f64,
        max: f64,
        min_exclusive: bool,
        visit: impl FnMut(RedisString, f64),
    ) {
        self.walk(min, max, min_exclusive, 1, visit);
    }

    fn walk(
        &self,
        min: f64,
        max: f64,
        min_exclusive: bool,
        mut limit: usize,
        mut visit: impl FnMut(RedisString, f64),
    ) {
        if self.is_empty() {
            return;
        }
        // SAFETY: an open sorted-set key; the range is stopped before returning, and each
        // element string is owned by the RedisString that frees it.
        unsafe {
            let zset_first = raw::RedisModule_ZsetFirstInScoreRange.unwrap();
            let zset_current = raw::RedisModule_ZsetRangeCurrentElement.unwrap();
            let zset_next = raw::RedisModule_ZsetRangeNext.unwrap();
            let zset_stop = raw::RedisModule_ZsetRangeStop.unwrap();
            if zset_first(self.handle, min, max, c_int::from(min_exclusive), 0)
                != raw::REDISMODULE_OK as c_int
            {
                return;
            }
            loop {
                let mut score = 0.0;
                let element = zset_current(self.handle, &mut score);
                if element.is_null() {
                    break;
                }
                visit(
                    RedisString::from_redis_module_string(ptr::null_mut(), element),
                    score,
                );
                limit -= 1;
                if limit == 0 || zset_next(self.handle) == 0 {
                    break;
                }
            }
            zset_stop(self.handle);
        }
    }

    /// The member with the lowest score above `min`, and its score.
    pub fn lowest_above(&self, min: f64) -> Option<(RedisString, f64)> {
        let mut first = None;
        self.scan_first(min, f64::INFINITY, true, |member, score| {
            first = Some((member, score))
        });
        first
    }

    pub fn highest_score(&self) -> Option<f64> {
        self.highest().map(|(_, score)| score)
    }

    /// The member with the highest score, and its score.
    pub fn highest(&self) -> Option<(RedisString, f64)> {
        if self.is_empty() {
            return None;
        }
        // SAFETY: as in `scan`.
        unsafe {
            let zset_last = raw::RedisModule_ZsetLastInScoreRange.unwrap();
            let zset_current = raw::RedisModule_ZsetRangeCurrentElement.unwrap();
            let zset_stop = raw::RedisModule_ZsetRangeStop.unwrap();
            if zset_last(self.handle, f64::NEG_INFINITY, f64::INFINITY, 0, 0)
                != raw::REDISMODULE_OK as c_int
            {
                return None;
            }
            let mut score = 0.0;
            let element = zset_current(self.handle, &mut score);
            zset_stop(self.handle);
            if element.is_null() {
                return None;
            }
            Some((
                RedisString::from_redis_module_string(ptr::null_mut(), element),
                score,
            ))
        }
    }

    /// `ZADD`, `ZADD XX` or `ZADD NX`. Never creates a key it does not fill: Redis's XX on a
    /// missing key would leave an empty sorted set behind.
    pub fn zadd(&self, score: i64, member: &RedisString, only: Option<Only>) -> ZaddOutcome {
        if only == Some(Only::Existing) && self.is_empty() {
            return ZaddOutcome::Skipped;
        }
        let mut flags = match only {
            None => 0,
            Some(Only::Existing) => raw::REDISMODULE_ZADD_XX as c_int,
            Some(Only::New) => raw::REDISMODULE_ZADD_NX as c_int,
        };
        // SAFETY: a key opened for writing whose type was checked; scores below 2^53 are exact.
        unsafe {
            raw::RedisModule_ZsetAdd.unwrap()(self.handle, score as f64, member.inner, &mut flags);
        }
        let flag = |bit: u32| flags & bit as c_int != 0;
        if flag(raw::REDISMODULE_ZADD_NOP) {
            return ZaddOutcome::Skipped;
        }
        // Neither bit: the member already had this score, so there is nothing to propagate.
        if flag(raw::REDISMODULE_ZADD_ADDED) || flag(raw::REDISMODULE_ZADD_UPDATED) {
            // SAFETY: each format letter matches its argument's C type (s: string, l: long long).
            unsafe {
                raw::RedisModule_Replicate.unwrap()(
                    self.ctx,
                    c"ZADD".as_ptr(),
                    c"sls".as_ptr(),
                    self.name.inner,
                    score as c_longlong,
                    member.inner,
                );
            }
            self.changed(raw::REDISMODULE_NOTIFY_ZSET, c"zadd");
        }
        if flag(raw::REDISMODULE_ZADD_ADDED) {
            ZaddOutcome::Added
        } else {
            ZaddOutcome::Updated
        }
    }

    /// Removes `members`, propagated as one `ZREM` with those that were there; returns how
    /// many were. Redis deletes the key with its last member.
    pub fn zrem(&self, members: &[RedisString]) -> usize {
        if self.is_empty() || members.is_empty() {
            return 0;
        }
        let delete = |member: &RedisString| {
            let mut deleted: c_int = 0;
            // SAFETY: as in `zadd`.
            unsafe { raw::RedisModule_ZsetRem.unwrap()(self.handle, member.inner, &mut deleted) };
            deleted != 0
        };
        // The common single removal (a release) needs no heap buffer.
        let mut one = [ptr::null_mut(); 1];
        let many: Vec<*mut raw::RedisModuleString>;
        let removed: &[*mut raw::RedisModuleString] = match members {
            [member] if delete(member) => {
                one[0] = member.inner;
                &one
            }
            [_] => &[],
            _ => {
                many = members
                    .iter()
                    .filter(|member| delete(member))
                    .map(|member| member.inner)
                    .collect();
                &many
            }
        };
        if !removed.is_empty() {
            self.replicate_vector(c"ZREM", removed);
            self.changed(raw::REDISMODULE_NOTIFY_ZSET, c"zrem");
            if self.is_empty() {
                self.notify(raw::REDISMODULE_NOTIFY_GENERIC, c"del");
            }
        }
        removed.len()
    }

    /// Deletes the key, propagated as `DEL`.
    pub fn delete(&self) {
        if self.is_empty() {
            return;
        }
        // SAFETY: a key opened for writing; the format letter matches the argument.
        unsafe {
            raw::RedisModule_DeleteKey.unwrap()(self.handle);
            raw::RedisModule_Replicate.unwrap()(
                self.ctx,
                c"DEL".as_ptr(),
                c"s".as_ptr(),
                self.name.inner,
            );
        }
        self.changed(raw::REDISMODULE_NOTIFY_GENERIC, c"del");
    }

    /// The key's absolute expiry in Unix ms, or `REDISMODULE_NO_EXPIRE`.
    pub fn expire_time(&self) -> i64 {
        if self.is_empty() {
            return raw::REDISMODULE_NO_EXPIRE as i64;
        }
        // SAFETY: an open, non-empty key.
        unsafe { raw::RedisModule_GetAbsExpire.unwrap()(self.handle) }
    }

    /// Sets the key's absolute expiry (Unix ms) when it differs from `current`.
    pub fn expire_at(&self, at: i64, current: i64) {
        if self.is_empty() || at == current {
            return;
        }
        // SAFETY: an open, non-empty key; the format letters match the arguments.
        unsafe {
            raw::RedisModule_SetAbsExpire.unwrap()(self.handle, at);
            raw::RedisModule_Replicate.unwrap()(
                self.ctx,
                c"PEXPIREAT".as_ptr(),
                c"sl".as_ptr(),
                self.name.inner,
                at as c_longlong,
            );
        }
        self.changed(raw::REDISMODULE_NOTIFY_GENERIC, c"expire");
    }

    /// A hash field's value (a copy: reading changes nothing in the key).
    pub fn hget(&self, field: &RedisString) -> Option<RedisString> {
        if self.is_empty() {
            return None;
        }
        let mut value: *mut raw::RedisModuleString = ptr::null_mut();
        // SAFETY: an open hash key; the argument list is a field, a place for its value, and
        // the NULL terminator. The value is a new string this call owns.
        unsafe {
            raw::RedisModule_HashGet.unwrap()(
                self.handle,
                raw::REDISMODULE_HASH_NONE as c_int,
                field.inner,
                &mut value as *mut *mut raw::RedisModuleString,
                ptr::null_mut::<raw::RedisModuleString>(),
            );
        }
        (!value.is_null()).then(|| RedisString::from_redis_module_string(ptr::null_mut(), value))
    }

    /// Sets the `set` fields and deletes the `delete` ones, propagated as one `HSET` and one
    /// `HDEL` (of the fields that were there). Redis deletes the key with its last field.
    pub fn hwrite(&self, set: &[(&RedisString, &RedisString)], delete: &[&RedisString]) {
        // REDISMODULE_HASH_DELETE: the value (the address 1) that makes HashSet delete a field.
        let delete_marker = ptr::without_provenance_mut::<raw::RedisModuleString>(1);
        let hash_set = |field: &RedisString, value: *mut raw::RedisModuleString| {
            // SAFETY: a key opened for writing, missing or a hash; one field and value, then
            // the NULL terminator.
            unsafe {
                raw::RedisModule_HashSet.unwrap()(
                    self.handle,
                    raw::REDISMODULE_HASH_NONE as c_int,
                    field.inner,
                    value,
                    ptr::null_mut::<raw::RedisModuleString>(),
                )
            }
        };
        let mut set_args = Vec::with_capacity(set.len() * 2);
        for (field, value) in set {
            hash_set(field, value.inner);
            set_args.extend([field.inner, value.inner]);
        }
        if !set_args.is_empty() {
            self.replicate_vector(c"HSET", &set_args);
            self.changed(raw::REDISMODULE_NOTIFY_HASH, c"hset");
        }
        let deleted: Vec<*mut raw::RedisModuleString> = if self.is_empty() {
            Vec::new()
        } else {
            delete
                .iter()
                .filter(|field| hash_set(field, delete_marker) > 0)
                .map(|field| field.inner)
                .collect()
        };
        if !deleted.is_empty() {
            self.replicate_vector(c"HDEL", &deleted);
            self.changed(raw::REDISMODULE_NOTIFY_HASH, c"hdel");
            if self.is_empty() {
                self.notify(raw::REDISMODULE_NOTIFY_GENERIC, c"del");
            }
        }
    }

    /// Propagates `<command> <this key> <args...>`.
    fn replicate_vector(&self, command: &CStr, args: &[*mut raw::RedisModuleString]) {
        // SAFETY: `v` takes an array of strings and its length; the strings outlive the call.
        unsafe {
            raw::RedisModule_Replicate.unwrap()(
                self.ctx,
                command.as_ptr(),
                c"sv".as_ptr(),
                self.name.inner,
                args.as_ptr(),
                args.len(),
            );
        }
    }

    /// Calls `read` with a string key's value, or `None` when the key is missing. Through a
    /// GET, not the key's memory: direct access would convert an integer-encoded value (one
    /// that INCR, SET or a restart left) to a raw string, and a read must not change a value.
    pub fn read_string<T>(&self, read: impl FnOnce(&[u8]) -> T) -> Option<T> {
        if self.is_empty() {
            return None;
        }
        // SAFETY: the format letter matches the argument; the reply is freed before returning
        // and its bytes are not used after that.
        unsafe {
            let reply = raw::RedisModule_Call.unwrap()(
                self.ctx,
                c"GET".as_ptr(),
                c"s".as_ptr(),
                self.name.inner,
            );
            if reply.is_null() {
                return None;
            }
            let mut len = 0;
            let data = if raw::RedisModule_CallReplyType.unwrap()(reply)
                == raw::REDISMODULE_REPLY_STRING as c_int
            {
                raw::RedisModule_CallReplyStringPtr.unwrap()(reply, &mut len)
            } else {
                ptr::null()
            };
            let value =
                (!data.is_null()).then(|| read(std::slice::from_raw_parts(data.cast::<u8>(), len)));
            raw::RedisModule_FreeCallReply.unwrap()(reply);
            value
        }
    }

    /// Sets a string key's value in place (no new object; the key keeps its TTL), propagated as
    /// `SET <key> <value> KEEPTTL`.
    pub fn write_string(&self, value: &[u8]) {
        let mut len = 0;
        // SAFETY: a key opened for writing, missing or a string. Truncate creates or resizes it
        // to exactly `value.len()` bytes, which DMA then exposes for the copy. The format
        // letters match the arguments (string, buffer and length, C string).
        unsafe {
            raw::RedisModule_StringTruncate.unwrap()(self.handle, value.len());
            let data = raw::RedisModule_StringDMA.unwrap()(
                self.handle,
                &mut len,
                raw::REDISMODULE_WRITE as c_int,
            );
            if !data.is_null() && len == value.len() {
                ptr::copy_nonoverlapping(value.as_ptr(), data.cast::<u8>(), len);
            }
            raw::RedisModule_Replicate.unwrap()(
                self.ctx,
                c"SET".as_ptr(),
                c"sbc".as_ptr(),
                self.name.inner,
                value.as_ptr(),
                value.len(),
                c"KEEPTTL".as_ptr(),
            );
        }
        self.changed(raw::REDISMODULE_NOTIFY_STRING, c"set");
    }

    /// Fires a keyspace event of the module class (`notify-keyspace-events` with `d`) on this
    /// key.
    pub fn notify_module(&self, event: &CStr) {
        self.notify(raw::REDISMODULE_NOTIFY_MODULE, event);
    }

    /// Whether a method changed this key during the call.
    pub fn has_changed(&self) -> bool {
        self.changed.get()
    }

    /// Records a change: the keyspace event now, the modified-key signal when the key closes.
    fn changed(&self, class: c_int, event: &CStr) {
        self.changed.set(true);
        self.notify(class, event);
    }

    /// Fires the keyspace event Redis's own command would, for clients that subscribe to them.
    fn notify(&self, class: c_int, event: &CStr) {
        // SAFETY: valid context and key name for this call.
        crate::server::events::own_write(|| unsafe {
            raw::RedisModule_NotifyKeyspaceEvent.unwrap()(
                self.ctx,
                class,
                event.as_ptr(),
                self.name.inner,
            );
        });
    }
}

impl Drop for Key<'_> {
    fn drop(&mut self) {
        // SAFETY: the handle came from OpenKey in this call; the name is valid for it. The
        // module runs with NO_IMPLICIT_SIGNAL_MODIFIED, so only a key that changed is signalled.
        unsafe {
            if self.changed.get() {
                raw::RedisModule_SignalModifiedKey.unwrap()(self.ctx, self.name.inner);
            }
            raw::RedisModule_CloseKey.unwrap()(self.handle);
        }
    }
}
