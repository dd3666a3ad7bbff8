//! The semaphore [`Store`] over real Redis keys, through the low-level key API (no `ctx.call`):
//! each sorted-set operation is one skiplist/dict step. Every change is replicated as it
//! happens, as a plain Redis command with absolute values (deadlines, tickets, identifiers), so
//! replicas and the AOF reproduce the primary exactly without the module re-running anything.

use std::ffi::CStr;
use std::os::raw::{c_int, c_longlong};
use std::ptr;

use redis_module::{raw, Context, RedisString};

use crate::error::SemError;
use crate::keys::{derived, COUNTER_SUFFIX, OWNER_SUFFIX};
use crate::semaphore::{IdBytes, Store};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Read,
    Write,
}

/// An open Redis key, closed on drop.
struct Key {
    ctx: *mut raw::RedisModuleCtx,
    name: *mut raw::RedisModuleString,
    handle: *mut raw::RedisModuleKey,
}

impl Key {
    /// Opens `name`; it must be missing or of type `allowed` (a `REDISMODULE_KEYTYPE_*`).
    fn open(
        ctx: &Context,
        name: &RedisString,
        access: Access,
        allowed: isize,
    ) -> Result<Key, SemError> {
        let mode = match access {
            Access::Read => raw::REDISMODULE_READ,
            Access::Write => raw::REDISMODULE_READ | raw::REDISMODULE_WRITE,
        };
        // SAFETY: the context and the name are valid for this command call.
        let handle =
            unsafe { raw::RedisModule_OpenKey.unwrap()(ctx.ctx, name.inner, mode as c_int) };
        let key = Key {
            ctx: ctx.ctx,
            name: name.inner,
            handle,
        };
        let found = key.key_type();
        if found == raw::REDISMODULE_KEYTYPE_EMPTY || found == allowed {
            Ok(key)
        } else {
            Err(SemError::WrongType)
        }
    }

    // The raw number, not `raw::KeyType`, whose conversion panics on types newer than the crate.
    fn key_type(&self) -> isize {
        // SAFETY: KeyType accepts any handle OpenKey returned, NULL included.
        unsafe { raw::RedisModule_KeyType.unwrap()(self.handle) as isize }
    }

    fn is_empty(&self) -> bool {
        self.key_type() == raw::REDISMODULE_KEYTYPE_EMPTY
    }

    fn len(&self) -> u64 {
        if self.is_empty() {
            return 0;
        }
        // SAFETY: an open key of the checked type.
        unsafe { raw::RedisModule_ValueLength.unwrap()(self.handle) as u64 }
    }

    fn score(&self, member: &RedisString) -> Option<f64> {
        if self.is_empty() {
            return None;
        }
        let mut score = 0.0;
        // SAFETY: an open sorted-set key and a valid member string.
        let status =
            unsafe { raw::RedisModule_ZsetScore.unwrap()(self.handle, member.inner, &mut score) };
        (status == raw::REDISMODULE_OK as c_int).then_some(score)
    }

    /// Visits members with `min <= score <= max` (or `< max` when `max_exclusive`), lowest
    /// first, until `visit` returns false.
    fn scan(
        &self,
        min: f64,
        max: f64,
        min_exclusive: bool,
        mut visit: impl FnMut(RedisString, f64) -> bool,
    ) {
        if self.is_empty() {
            return;
        }
        let zset_first = unsafe { raw::RedisModule_ZsetFirstInScoreRange.unwrap() };
        let zset_current = unsafe { raw::RedisModule_ZsetRangeCurrentElement.unwrap() };
        let zset_next = unsafe { raw::RedisModule_ZsetRangeNext.unwrap() };
        let zset_stop = unsafe { raw::RedisModule_ZsetRangeStop.unwrap() };
        // SAFETY: an open sorted-set key; the range is stopped before returning, and each
        // element string is owned by the RedisString that frees it.
        unsafe {
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
                let member = RedisString::from_redis_module_string(ptr::null_mut(), element);
                if !visit(member, score) || zset_next(self.handle) == 0 {
                    break;
                }
            }
            zset_stop(self.handle);
        }
    }

    fn highest_score(&self) -> Option<f64> {
        if self.is_empty() {
            return None;
        }
        let zset_last = unsafe { raw::RedisModule_ZsetLastInScoreRange.unwrap() };
        let zset_current = unsafe { raw::RedisModule_ZsetRangeCurrentElement.unwrap() };
        let zset_stop = unsafe { raw::RedisModule_ZsetRangeStop.unwrap() };
        // SAFETY: as in `scan`.
        unsafe {
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
            drop(RedisString::from_redis_module_string(
                ptr::null_mut(),
                element,
            ));
            Some(score)
        }
    }

    fn zadd(&self, score: i64, member: &RedisString) {
        // SAFETY: a key opened for writing whose type was checked; scores below 2^53 are exact.
        unsafe {
            raw::RedisModule_ZsetAdd.unwrap()(
                self.handle,
                score as f64,
                member.inner,
                ptr::null_mut(),
            );
        }
        self.replicate_score_member(c"ZADD", score, member);
        self.notify(raw::REDISMODULE_NOTIFY_ZSET, c"zadd");
    }

    /// Removes `member`; whether it was there.
    fn zrem(&self, member: &RedisString) -> bool {
        if self.is_empty() {
            return false;
        }
        let mut deleted: c_int = 0;
        // SAFETY: as in `zadd`. Redis deletes the key when its last member goes.
        unsafe {
            raw::RedisModule_ZsetRem.unwrap()(self.handle, member.inner, &mut deleted);
        }
        if deleted != 0 {
            self.replicate_member(c"ZREM", member);
            self.notify(raw::REDISMODULE_NOTIFY_ZSET, c"zrem");
            if self.is_empty() {
                self.notify(raw::REDISMODULE_NOTIFY_GENERIC, c"del");
            }
        }
        deleted != 0
    }

    /// Sets the key's absolute expiry (Unix ms), unless it is already that.
    fn expire_at(&self, at: i64) {
        if self.is_empty() {
            return;
        }
        // SAFETY: an open, non-empty key.
        unsafe {
            if raw::RedisModule_GetAbsExpire.unwrap()(self.handle) == at {
                return;
            }
            raw::RedisModule_SetAbsExpire.unwrap()(self.handle, at);
        }
        self.replicate_number(c"PEXPIREAT", at);
        self.notify(raw::REDISMODULE_NOTIFY_GENERIC, c"expire");
    }

    /// Fires the keyspace event Redis's own command would, for clients that subscribe to them.
    fn notify(&self, class: c_int, event: &CStr) {
        // SAFETY: valid context and key name for this command call.
        unsafe {
            raw::RedisModule_NotifyKeyspaceEvent.unwrap()(
                self.ctx,
                class,
                event.as_ptr(),
                self.name,
            );
        }
    }

    /// Propagates `command <key> score member` to replicas and the AOF.
    fn replicate_score_member(&self, command: &CStr, score: i64, member: &RedisString) {
        // SAFETY: each format letter matches the C type of its argument (s: string, l: long long).
        unsafe {
            raw::RedisModule_Replicate.unwrap()(
                self.ctx,
                command.as_ptr(),
                c"sls".as_ptr(),
                self.name,
                score as c_longlong,
                member.inner,
            );
        }
    }

    /// Propagates `command <key> member`.
    fn replicate_member(&self, command: &CStr, member: &RedisString) {
        // SAFETY: as above.
        unsafe {
            raw::RedisModule_Replicate.unwrap()(
                self.ctx,
                command.as_ptr(),
                c"ss".as_ptr(),
                self.name,
                member.inner,
            );
        }
    }

    /// Propagates `command <key> number`.
    fn replicate_number(&self, command: &CStr, number: i64) {
        // SAFETY: as above.
        unsafe {
            raw::RedisModule_Replicate.unwrap()(
                self.ctx,
                command.as_ptr(),
                c"sl".as_ptr(),
                self.name,
                number as c_longlong,
            );
        }
    }
}

impl Drop for Key {
    fn drop(&mut self) {
        // SAFETY: the handle came from OpenKey in this command call.
        unsafe { raw::RedisModule_CloseKey.unwrap()(self.handle) }
    }
}

/// One semaphore's three keys, opened for a command call.
pub struct RedisStore<'a> {
    ctx: &'a Context,
    holders: Key,
    owners: Key,
    counter: Option<Key>,
    /// Whether a deadline was set or a holder removed: only then can the latest deadline move.
    deadlines_changed: bool,
    // Keep the derived key names alive while their keys are open.
    _owner_name: RedisString,
    _counter_name: Option<RedisString>,
}

impl<'a> RedisStore<'a> {
    /// Opens `<name>` and `<name>:owner`, and `<name>:counter` when `with_counter`. A key of
    /// the wrong type is an error before anything changes.
    pub fn open(
        ctx: &'a Context,
        name: &RedisString,
        access: Access,
        with_counter: bool,
    ) -> Result<Self, SemError> {
        let owner_name = RedisString::create_from_slice(
            ptr::null_mut(),
            &derived(name.as_slice(), OWNER_SUFFIX),
        );
        let counter_name = with_counter.then(|| {
            RedisString::create_from_slice(
                ptr::null_mut(),
                &derived(name.as_slice(), COUNTER_SUFFIX),
            )
        });
        let holders = Key::open(ctx, name, access, raw::REDISMODULE_KEYTYPE_ZSET)?;
        let owners = Key::open(ctx, &owner_name, access, raw::REDISMODULE_KEYTYPE_ZSET)?;
        let counter = match &counter_name {
            Some(counter_name) => Some(Key::open(
                ctx,
                counter_name,
                access,
                raw::REDISMODULE_KEYTYPE_STRING,
            )?),
            None => None,
        };
        Ok(RedisStore {
            ctx,
            holders,
            owners,
            counter,
            deadlines_changed: false,
            _owner_name: owner_name,
            _counter_name: counter_name,
        })
    }

    /// A holder identifier for this store.
    pub fn id(&self, bytes: &[u8]) -> RedisString {
        RedisString::create_from_slice(self.ctx.ctx, bytes)
    }

    /// Ends a write: both sorted sets expire at the latest deadline, so an abandoned semaphore
    /// disappears by itself. (The owner set's scores are tickets, so the deadline comes from
    /// `<name>`.)
    pub fn settle_expiry(&self) {
        if !self.deadlines_changed {
            return;
        }
        if let Some(latest) = self.holders.highest_score() {
            let latest = latest as i64;
            self.holders.expire_at(latest);
            self.owners.expire_at(latest);
        }
    }
}

impl IdBytes for RedisString {
    fn id_bytes(&self) -> &[u8] {
        self.as_slice()
    }
}

impl Store for RedisStore<'_> {
    type Id = RedisString;

    fn holder_count(&self) -> u64 {
        self.holders.len()
    }

    fn has_owners(&self) -> bool {
        !self.owners.is_empty()
    }

    fn deadline(&self, id: &RedisString) -> Option<i64> {
        self.holders.score(id).map(|score| score as i64)
    }

    fn ticket(&self, id: &RedisString) -> Option<u64> {
        self.owners.score(id).map(|score| score as u64)
    }

    fn expired(&self, now_ms: i64) -> Vec<RedisString> {
        let mut expired = Vec::new();
        self.holders
            .scan(f64::NEG_INFINITY, now_ms as f64, false, |member, _| {
                expired.push(member);
                true
            });
        expired
    }

    fn count_expired(&self, now_ms: i64) -> u64 {
        let mut count = 0;
        self.holders
            .scan(f64::NEG_INFINITY, now_ms as f64, false, |_, _| {
                count += 1;
                true
            });
        count
    }

    fn counter(&self) -> Result<Option<u64>, SemError> {
        let Some(key) = self.counter.as_ref().filter(|key| !key.is_empty()) else {
            return Ok(None);
        };
        let mut len = 0;
        // SAFETY: an open string key; the bytes are read before the key is touched again.
        let bytes = unsafe {
            let data = raw::RedisModule_StringDMA.unwrap()(
                key.handle,
                &mut len,
                raw::REDISMODULE_READ as c_int,
            );
            if data.is_null() {
                return Err(SemError::WrongType);
            }
            std::slice::from_raw_parts(data.cast::<u8>(), len)
        };
        std::str::from_utf8(bytes)
            .ok()
            .filter(|text| !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|text| text.parse::<u64>().ok())
            .map(Some)
            .ok_or(SemError::CounterNotInteger)
    }

    fn live_by_deadline(&self, now_ms: i64) -> Vec<(RedisString, i64)> {
        let mut live = Vec::new();
        self.holders
            .scan(now_ms as f64, f64::INFINITY, true, |member, score| {
                live.push((member, score as i64));
                true
            });
        live
    }

    fn owners_by_ticket(&self) -> Vec<(RedisString, u64)> {
        let mut owners = Vec::new();
        self.owners
            .scan(f64::NEG_INFINITY, f64::INFINITY, false, |member, score| {
                owners.push((member, score as u64));
                true
            });
        owners
    }

    fn put_holder(&mut self, id: &RedisString, deadline_ms: i64) {
        self.holders.zadd(deadline_ms, id);
        self.deadlines_changed = true;
    }

    fn put_owner(&mut self, id: &RedisString, ticket: u64) {
        self.owners.zadd(ticket as i64, id);
    }

    fn set_counter(&mut self, ticket: u64) {
        let Some(key) = &self.counter else {
            return;
        };
        // SAFETY: an open string key (or an empty one, which StringSet creates).
        unsafe {
            let value = raw::RedisModule_CreateStringFromLongLong.unwrap()(
                self.ctx.ctx,
                ticket as c_longlong,
            );
            raw::RedisModule_StringSet.unwrap()(key.handle, value);
            raw::RedisModule_FreeString.unwrap()(self.ctx.ctx, value);
        }
        key.replicate_number(c"SET", ticket as i64);
        key.notify(raw::REDISMODULE_NOTIFY_STRING, c"set");
    }

    fn remove(&mut self, id: &RedisString) {
        if self.holders.zrem(id) {
            self.deadlines_changed = true;
        }
        self.owners.zrem(id);
    }
}
