//! The semaphore [`Store`] over real Redis keys, through the low-level key API (no `ctx.call`,
//! so no command parsing or fake client per step). Every change is replicated as it
//! happens, as a plain Redis command with absolute values (deadlines, tickets, identifiers), so
//! replicas and the AOF reproduce the primary exactly without the module re-running anything.

use std::ffi::CStr;
use std::io::Write;
use std::os::raw::{c_int, c_longlong};
use std::ptr;

use redis_module::{raw, Context, RedisString};

use crate::error::SemError;
use crate::keys::{with_derived, COUNTER_SUFFIX, OWNER_SUFFIX};
use crate::semaphore::{IdBytes, Put, PutOutcome, Store};

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

    /// Visits the members with `min <= score <= max` (`min < score` when `min_exclusive`),
    /// lowest score first.
    fn scan(
        &self,
        min: f64,
        max: f64,
        min_exclusive: bool,
        mut visit: impl FnMut(RedisString, f64),
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
                visit(
                    RedisString::from_redis_module_string(ptr::null_mut(), element),
                    score,
                );
                if zset_next(self.handle) == 0 {
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

    /// `ZADD` (with `XX` for `Put::IfHeld`), replicated and notified when something changed.
    fn zadd(&self, score: i64, member: &RedisString, put: Put) -> PutOutcome {
        let mut flags = match put {
            Put::Upsert => 0,
            Put::IfHeld => raw::REDISMODULE_ZADD_XX as c_int,
        };
        // SAFETY: a key opened for writing whose type was checked; scores below 2^53 are exact.
        unsafe {
            raw::RedisModule_ZsetAdd.unwrap()(self.handle, score as f64, member.inner, &mut flags);
        }
        let flag = |bit: u32| flags & bit as c_int != 0;
        if flag(raw::REDISMODULE_ZADD_NOP) {
            return PutOutcome::NotHeld;
        }
        // Neither bit: the member already had this score, so there is nothing to propagate.
        if flag(raw::REDISMODULE_ZADD_ADDED) || flag(raw::REDISMODULE_ZADD_UPDATED) {
            // SAFETY: each format letter matches its argument's C type (s: string, l: long long).
            unsafe {
                raw::RedisModule_Replicate.unwrap()(
                    self.ctx,
                    c"ZADD".as_ptr(),
                    c"sls".as_ptr(),
                    self.name,
                    score as c_longlong,
                    member.inner,
                );
            }
            self.notify(raw::REDISMODULE_NOTIFY_ZSET, c"zadd");
        }
        if flag(raw::REDISMODULE_ZADD_ADDED) {
            PutOutcome::Added
        } else {
            PutOutcome::Updated
        }
    }

    /// Removes `members`, propagated as one `ZREM` with those that were there; returns how
    /// many were.
    fn zrem(&self, members: &[RedisString]) -> usize {
        if self.is_empty() {
            return 0;
        }
        let delete = |member: &RedisString| {
            let mut deleted: c_int = 0;
            // SAFETY: as in `zadd`. Redis deletes the key when its last member goes.
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
            // SAFETY: `v` takes an array of strings and its length; the strings outlive the call.
            unsafe {
                raw::RedisModule_Replicate.unwrap()(
                    self.ctx,
                    c"ZREM".as_ptr(),
                    c"sv".as_ptr(),
                    self.name,
                    removed.as_ptr(),
                    removed.len(),
                );
            }
            self.notify(raw::REDISMODULE_NOTIFY_ZSET, c"zrem");
            if self.is_empty() {
                self.notify(raw::REDISMODULE_NOTIFY_GENERIC, c"del");
            }
        }
        removed.len()
    }

    /// The key's absolute expiry in Unix ms, or `REDISMODULE_NO_EXPIRE`.
    fn expire_time(&self) -> i64 {
        if self.is_empty() {
            return raw::REDISMODULE_NO_EXPIRE as i64;
        }
        // SAFETY: an open, non-empty key.
        unsafe { raw::RedisModule_GetAbsExpire.unwrap()(self.handle) }
    }

    /// Sets the key's absolute expiry (Unix ms) when it differs from `current`.
    fn expire_at(&self, at: i64, current: i64) {
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
                self.name,
                at as c_longlong,
            );
        }
        self.notify(raw::REDISMODULE_NOTIFY_GENERIC, c"expire");
    }

    /// Overwrites a string key's value in place: no new object, and the key keeps its TTL.
    fn write_string(&self, value: &[u8]) {
        let mut len = 0;
        // SAFETY: a key opened for writing, missing or a string. Truncate creates or resizes it
        // to exactly `value.len()` bytes, which DMA then exposes for the copy.
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
        }
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
}

impl Drop for Key {
    fn drop(&mut self) {
        // SAFETY: the handle came from OpenKey in this command call.
        unsafe { raw::RedisModule_CloseKey.unwrap()(self.handle) }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DeadlineChange {
    None,
    /// Holders were only added; this is the latest deadline added.
    Raised(i64),
    /// A deadline was moved or removed: the latest one must be looked up.
    Unknown,
}

impl DeadlineChange {
    fn added(self, deadline: i64) -> Self {
        match self {
            DeadlineChange::None => DeadlineChange::Raised(deadline),
            DeadlineChange::Raised(latest) => DeadlineChange::Raised(latest.max(deadline)),
            DeadlineChange::Unknown => DeadlineChange::Unknown,
        }
    }
}

/// `<name><suffix>` as a Redis string.
fn derived_key(name: &RedisString, suffix: &[u8]) -> RedisString {
    with_derived(name.as_slice(), suffix, |key| {
        RedisString::create_from_slice(ptr::null_mut(), key)
    })
}

/// One semaphore's three keys, opened for a command call.
pub struct RedisStore<'a> {
    ctx: &'a Context,
    holders: Key,
    owners: Key,
    counter: Option<Key>,
    /// How this call moved the deadlines in `<name>`, so the keys' expiry can be settled.
    deadlines: DeadlineChange,
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
        let owner_name = derived_key(name, OWNER_SUFFIX);
        let counter_name = with_counter.then(|| derived_key(name, COUNTER_SUFFIX));
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
            deadlines: DeadlineChange::None,
            _owner_name: owner_name,
            _counter_name: counter_name,
        })
    }

    /// A holder identifier for this store.
    pub fn id(&self, bytes: &[u8]) -> RedisString {
        RedisString::create_from_slice(self.ctx.ctx, bytes)
    }

    /// Ends a write: both sorted sets expire at the latest deadline, so an abandoned semaphore
    /// disappears by itself. The owner set's scores are tickets, so the deadline comes from
    /// `<name>`, whose expiry already is the latest deadline from before this call.
    pub fn settle_expiry(&self) {
        if self.deadlines == DeadlineChange::None {
            return;
        }
        let current = self.holders.expire_time();
        let latest = match self.deadlines {
            DeadlineChange::Raised(added) if current != raw::REDISMODULE_NO_EXPIRE as i64 => {
                current.max(added)
            }
            _ => match self.holders.highest_score() {
                Some(score) => score as i64,
                None => return,
            },
        };
        self.holders.expire_at(latest, current);
        self.owners.expire_at(latest, self.owners.expire_time());
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
                expired.push(member)
            });
        expired
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
                live.push((member, score as i64))
            });
        live
    }

    fn owners_by_ticket(&self) -> Vec<(RedisString, u64)> {
        let mut owners = Vec::new();
        self.owners
            .scan(f64::NEG_INFINITY, f64::INFINITY, false, |member, score| {
                owners.push((member, score as u64))
            });
        owners
    }

    fn put_holder(&mut self, id: &RedisString, deadline_ms: i64, put: Put) -> PutOutcome {
        let outcome = self.holders.zadd(deadline_ms, id, put);
        self.deadlines = match outcome {
            PutOutcome::Added => self.deadlines.added(deadline_ms),
            PutOutcome::Updated => DeadlineChange::Unknown,
            PutOutcome::NotHeld => self.deadlines,
        };
        outcome
    }

    fn put_owner(&mut self, id: &RedisString, ticket: u64) {
        self.owners.zadd(ticket as i64, id, Put::Upsert);
    }

    fn set_counter(&mut self, ticket: u64) {
        let Some(key) = &self.counter else {
            return;
        };
        let mut digits = [0u8; 20];
        let len = {
            let mut cursor = &mut digits[..];
            // Cannot fail: a u64 has at most 20 digits.
            let _ = write!(cursor, "{ticket}");
            20 - cursor.len()
        };
        key.write_string(&digits[..len]);
        // KEEPTTL: the in-place write keeps a TTL someone set on the counter; so must SET.
        // SAFETY: the format letters match the arguments (string, long long, C string).
        unsafe {
            raw::RedisModule_Replicate.unwrap()(
                self.ctx.ctx,
                c"SET".as_ptr(),
                c"slc".as_ptr(),
                key.name,
                ticket as c_longlong,
                c"KEEPTTL".as_ptr(),
            );
        }
        key.notify(raw::REDISMODULE_NOTIFY_STRING, c"set");
    }

    fn remove(&mut self, ids: &[RedisString]) -> usize {
        let removed = self.holders.zrem(ids);
        self.owners.zrem(ids);
        if removed > 0 {
            self.deadlines = DeadlineChange::Unknown;
        }
        removed
    }
}
