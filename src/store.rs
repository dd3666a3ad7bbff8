//! The semaphore [`Store`] over one semaphore's Redis keys, through the key layer
//! (`server::key`), which replicates and signals every change as it makes it. Dropping the store
//! ends the call's write: both sorted sets then expire at the latest deadline, so no caller can
//! forget it.

use std::cell::OnceCell;
use std::ffi::CStr;
use std::io::Write;

use redis_module::{raw, Context, RedisString};

use crate::args::{parse_counter, parse_extra, parse_stored_limit, parse_weight};
use crate::error::SemError;
use crate::semaphore::{Holder, IdBytes, Put, PutOutcome, Store};
use crate::server::key::{Access, Key, KeyType, Only, ZaddOutcome};
use crate::server::{key_exists, selected_db};
use crate::stats::{self, COUNTERS};
use crate::types::deadline_ms;

/// The names of a semaphore's keys for one call.
pub struct SemKeys<'a> {
    pub name: &'a RedisString,
    pub owner: &'a RedisString,
    pub counter: &'a RedisString,
    pub permits: &'a RedisString,
    pub limit: &'a RedisString,
}

/// Removed holders whose grant time a store keeps (see `RedisStore::ended`).
const ENDED: usize = 4;

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

/// A key of the semaphore that most have not (the owner set, the weights): opened with the
/// others only when it exists (a missing key has no type to check), else when first written.
/// A look-up costs less than opening and closing a key per call.
struct LazyKey<'a> {
    ctx: &'a Context,
    name: &'a RedisString,
    access: Access,
    expected: KeyType,
    key: OnceCell<Key<'a>>,
}

impl<'a> LazyKey<'a> {
    fn open(
        ctx: &'a Context,
        name: &'a RedisString,
        access: Access,
        expected: KeyType,
    ) -> Result<Self, SemError> {
        let lazy = LazyKey {
            ctx,
            name,
            access,
            expected,
            key: OnceCell::new(),
        };
        if let Some(key) = Key::open_existing(ctx, name, access, expected)? {
            let _ = lazy.key.set(key);
        }
        Ok(lazy)
    }

    /// The key, when it existed as the store opened (or was written since).
    fn get(&self) -> Option<&Key<'a>> {
        self.key.get()
    }

    /// The key, to write it.
    fn write(&self) -> &Key<'a> {
        self.key.get_or_init(|| {
            // Missing when the store opened it, and only this store writes during the call:
            // no type to refuse.
            Key::open(self.ctx, self.name, self.access, self.expected).expect("a missing key opens")
        })
    }
}

/// Why a holder's permits were asked to end, or to last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// `SEM.RELEASE`, `SEM.RELEASEALL`.
    Release,
    /// `SEM.REFRESH`, `SEM.REFRESHALL`: a live holder keeps its permits.
    Refresh,
    /// The module gives them back: their BOUND connection closed.
    ConnectionClosed,
    /// The module gives them back: the grant never reached its waiter.
    Undelivered,
}

/// One semaphore's keys, opened for a call. The counter is opened when first used: only a fair
/// grant, or SEM.GET JSON, needs it.
pub struct RedisStore<'a> {
    ctx: &'a Context,
    access: Access,
    holders: Key<'a>,
    owners: LazyKey<'a>,
    counter_name: &'a RedisString,
    counter: OnceCell<Key<'a>>,
    limit_name: &'a RedisString,
    limit: OnceCell<Key<'a>>,
    permits: LazyKey<'a>,
    /// How this call moved the deadlines in `<name>`, so the keys' expiry can be settled.
    deadlines: DeadlineChange,
    /// Identifiers this call removed from `<name>`, when asked to keep them.
    removed: Option<Vec<RedisString>>,
    /// Whether `<name>` was missing when opened: every holder it had is gone (its key expired,
    /// or another client deleted it).
    opened_empty: bool,
    /// Whether `<name>` was missing when opened or went with its last holder in this call: then
    /// it holds only the deadlines added since, and the expiry needs no look-up.
    created: bool,
    /// When the last holders this call removed were granted (if known), by grant key, for the
    /// hold-time distribution: a release records its own; the others (expired, lost) are
    /// dropped. A release removes its holder alone, so a few places are enough.
    ended: [(u64, u64); ENDED],
    ended_len: usize,
}

impl<'a> RedisStore<'a> {
    /// Opens the keys. A key of the wrong type is an error before anything changes.
    pub fn open(ctx: &'a Context, keys: &SemKeys<'a>, access: Access) -> Result<Self, SemError> {
        let holders = Key::open(ctx, keys.name, access, KeyType::SortedSet)?;
        let owners = LazyKey::open(ctx, keys.owner, access, KeyType::SortedSet)?;
        let permits = LazyKey::open(ctx, keys.permits, access, KeyType::Hash)?;
        let opened_empty = holders.is_empty();
        Ok(RedisStore {
            ctx,
            access,
            holders,
            owners,
            counter_name: keys.counter,
            counter: OnceCell::new(),
            limit_name: keys.limit,
            limit: OnceCell::new(),
            permits,
            deadlines: DeadlineChange::None,
            removed: None,
            opened_empty,
            created: opened_empty,
            ended: [(0, 0); ENDED],
            ended_len: 0,
        })
    }

    /// `holder` gave its permits back in this call: its hold time is recorded.
    pub fn released(&mut self, holder: &[u8]) {
        let key = self.grant_key(holder);
        let ended = &mut self.ended[..self.ended_len];
        if let Some(at) = ended.iter().position(|&(k, _)| k == key) {
            stats::record_hold(ended[at].1);
            ended[at] = ended[self.ended_len - 1];
            self.ended_len -= 1;
        }
    }

    fn grant_key(&self, holder: &[u8]) -> u64 {
        stats::grant_key(
            selected_db(self.ctx),
            self.holders.name().as_slice(),
            holder,
        )
    }

    /// Whether `<name>` was missing when the store opened it, asked once: later calls answer
    /// false (the holders since are the store's own).
    fn take_opened_empty(&mut self) -> bool {
        std::mem::take(&mut self.opened_empty)
    }

    /// Keeps the identifiers the following calls remove from `<name>` (some may not have been
    /// there), for [`RedisStore::take_removed`].
    pub fn keep_removed(&mut self) {
        self.removed.get_or_insert_with(Vec::new);
    }

    /// Whether this call may have freed permits or changed the semaphore's kind: it changed a
    /// key, or found `<name>` missing (every holder it had is gone).
    pub fn may_have_freed(&self) -> bool {
        self.opened_empty || self.changed()
    }

    /// Whether this call changed a key.
    pub fn changed(&self) -> bool {
        self.holders.has_changed()
            || self.owners.get().is_some_and(Key::has_changed)
            || self.permits.get().is_some_and(Key::has_changed)
            || self.counter.get().is_some_and(Key::has_changed)
            || self.limit.get().is_some_and(Key::has_changed)
    }

    fn take_removed(&mut self) -> Vec<RedisString> {
        self.removed.take().unwrap_or_default()
    }

    /// What this write found gone since the last look, and forgets it (it tells of this moment
    /// only): whether `<name>` was missing (every holder it had is gone), and the holders it
    /// removed.
    pub fn take_gone(&mut self) -> (bool, Vec<RedisString>) {
        (self.take_opened_empty(), self.take_removed())
    }

    /// The soonest deadline of a holder still live at `now_ms`.
    pub fn next_deadline(&self, now_ms: i64) -> Option<i64> {
        self.holders
            .lowest_above(now_ms as f64)
            .map(|(_, score)| deadline_ms(score))
    }

    /// `<name>:counter`, opened on first use.
    fn counter_key(&self) -> Result<&Key<'a>, SemError> {
        if self.counter.get().is_none() {
            let key = Key::open(self.ctx, self.counter_name, self.access, KeyType::String)?;
            let _ = self.counter.set(key);
        }
        Ok(self.counter.get().expect("set above"))
    }

    /// `<name>:limit`, opened on first use.
    fn limit_key(&self) -> Result<&Key<'a>, SemError> {
        if self.limit.get().is_none() {
            let key = Key::open(self.ctx, self.limit_name, self.access, KeyType::String)?;
            let _ = self.limit.set(key);
        }
        Ok(self.limit.get().expect("set above"))
    }

    /// Stores the operator's limit (`SEM.LIMIT`), or with `None` removes it. Returns whether
    /// anything changed: an equal limit is not written again.
    pub fn set_stored_limit(&mut self, limit: Option<u64>) -> Result<bool, SemError> {
        let current = self.stored_limit()?;
        if current == limit {
            return Ok(false);
        }
        let key = self.limit_key()?;
        match limit {
            Some(limit) => key.write_string(limit.to_string().as_bytes()),
            None => key.delete(),
        }
        self.notify(c"sem.limit");
        Ok(true)
    }

    /// A field of `<name>:permits`, parsed; `None` when absent.
    fn permits_field(
        &self,
        field: &RedisString,
        parse: fn(&[u8]) -> Result<u64, SemError>,
    ) -> Result<Option<u64>, SemError> {
        match self.permits.get().and_then(|key| key.hget(field)) {
            None => Ok(None),
            Some(value) => parse(value.as_slice()).map(Some),
        }
    }

    /// Counts a grant to `holder` and tells of it: a renewal is only counted; a new permit is
    /// timed for the hold-time distribution and fires `sem.acquire`.
    pub fn record_grant(&self, holder: &[u8], renewed: bool) {
        if renewed {
            stats::count(&COUNTERS.renewed);
            return;
        }
        stats::count(&COUNTERS.acquired);
        stats::granted(self.grant_key(holder));
        self.notify(c"sem.acquire");
    }

    /// Counts what a release, a refresh or a give-back found of `holder`, and tells of it: the
    /// one end of a release. A live holder's permits that end are timed and fire `sem.release`;
    /// a client's call that finds its holder expired fires `sem.lost`.
    pub fn holder_ended(&mut self, found: Holder, holder: &[u8], why: Ending) {
        match (found, why) {
            (Holder::Live, Ending::Refresh) => stats::count(&COUNTERS.refreshed),
            (Holder::Live, _) => {
                match why {
                    Ending::Release => stats::count(&COUNTERS.released),
                    Ending::ConnectionClosed => stats::count(&COUNTERS.bound_released),
                    Ending::Refresh | Ending::Undelivered => {}
                }
                // A grant that never reached its waiter was never held.
                if why != Ending::Undelivered {
                    self.released(holder);
                }
                self.notify(c"sem.release");
            }
            (Holder::Expired, Ending::Release | Ending::Refresh) => {
                stats::count(&COUNTERS.lost);
                self.notify(c"sem.lost");
            }
            _ => {}
        }
    }

    /// Fires a `sem.*` keyspace event (module class) on `<name>`.
    pub fn notify(&self, event: &CStr) {
        self.holders.notify_module(event);
    }

    /// A holder identifier for this store.
    pub fn id(&self, bytes: &[u8]) -> RedisString {
        RedisString::create_from_slice(self.ctx.ctx, bytes)
    }

    /// Both sorted sets expire at the latest deadline, so an abandoned semaphore disappears by
    /// itself. The owner set's scores are tickets, so the deadline comes from `<name>`, whose
    /// expiry already is the latest deadline from before this call.
    fn settle_expiry(&self) {
        if self.deadlines == DeadlineChange::None {
            return;
        }
        let current = self.holders.expire_time();
        let latest = match self.deadlines {
            DeadlineChange::Raised(added) if current != raw::REDISMODULE_NO_EXPIRE as i64 => {
                current.max(added)
            }
            // A set this call created has no other deadline to look up.
            DeadlineChange::Raised(added) if self.created => added,
            _ => match self.holders.highest_score() {
                Some(score) => deadline_ms(score),
                None => return,
            },
        };
        self.holders.expire_at(latest, current);
        for key in [self.owners.get(), self.permits.get()]
            .into_iter()
            .flatten()
        {
            key.expire_at(latest, key.expire_time());
        }
    }
}

impl Drop for RedisStore<'_> {
    fn drop(&mut self) {
        self.settle_expiry();
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

    fn owner_count(&self) -> u64 {
        self.owners.get().map_or(0, Key::len)
    }

    fn deadline(&self, id: &RedisString) -> Option<i64> {
        self.holders.score(id).map(deadline_ms)
    }

    fn owner_score(&self, id: &RedisString) -> Option<f64> {
        self.owners.get()?.score(id)
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
        self.counter_key()?.read_string(parse_counter).transpose()
    }

    fn stored_limit(&self) -> Result<Option<u64>, SemError> {
        // Most semaphores have none: a look-up costs less than opening the key.
        if self.limit.get().is_none() && !key_exists(self.ctx, self.limit_name) {
            return Ok(None);
        }
        self.limit_key()?
            .read_string(|value| {
                parse_stored_limit(value).map_err(|_| SemError::StoredLimitCorrupt)
            })
            .transpose()
    }

    fn has_weights(&self) -> bool {
        self.permits.get().is_some_and(|key| !key.is_empty())
    }

    fn weight(&self, id: &RedisString) -> Result<u64, SemError> {
        if !self.has_weights() {
            return Ok(1);
        }
        Ok(self.permits_field(id, parse_weight)?.unwrap_or(1))
    }

    fn extra(&self) -> Result<u64, SemError> {
        if !self.has_weights() {
            return Ok(0);
        }
        let total = RedisString::create_from_slice(self.ctx.ctx, b"");
        Ok(self.permits_field(&total, parse_extra)?.unwrap_or(0))
    }

    fn live_by_deadline(&self, now_ms: i64) -> Vec<(RedisString, i64)> {
        let mut live = Vec::new();
        self.holders
            .scan(now_ms as f64, f64::INFINITY, true, |member, score| {
                live.push((member, deadline_ms(score)))
            });
        live
    }

    fn owners_by_score(&self) -> Vec<(RedisString, f64)> {
        let mut owners = Vec::new();
        let Some(key) = self.owners.get() else {
            return owners;
        };
        key.scan(f64::NEG_INFINITY, f64::INFINITY, false, |member, score| {
            owners.push((member, score))
        });
        owners
    }

    fn put_holder(&mut self, id: &RedisString, deadline_ms: i64, put: Put) -> PutOutcome {
        let only = match put {
            Put::Upsert => None,
            Put::IfHeld => Some(Only::Existing),
            Put::IfNew => Some(Only::New),
        };
        match self.holders.zadd(deadline_ms, id, only) {
            ZaddOutcome::Added => {
                self.deadlines = self.deadlines.added(deadline_ms);
                PutOutcome::Added
            }
            ZaddOutcome::Updated => {
                self.deadlines = DeadlineChange::Unknown;
                PutOutcome::Updated
            }
            ZaddOutcome::Skipped => PutOutcome::NotHeld,
        }
    }

    fn put_owner(&mut self, id: &RedisString, ticket: u64) {
        self.owners.write().zadd(ticket as i64, id, None);
    }

    fn set_counter(&mut self, ticket: u64) {
        // The rules read the counter (opening it) before they set it.
        let Some(key) = self.counter.get() else {
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
    }

    fn remove(&mut self, ids: &[RedisString]) -> usize {
        if let Some(kept) = &mut self.removed {
            kept.extend(ids.iter().map(|id| id.safe_clone(self.ctx)));
        }
        let removed = self.holders.zrem(ids);
        if let Some(owners) = self.owners.get() {
            owners.zrem(ids);
        }
        if removed > 0 {
            if self.holders.is_empty() {
                // The set went with its last holder, and its expiry with it: what is added from
                // here is all a new set will hold.
                self.created = true;
                self.deadlines = DeadlineChange::None;
            } else {
                self.deadlines = DeadlineChange::Unknown;
            }
        }
        if removed > 0 {
            for id in ids {
                let key = self.grant_key(id.as_slice());
                if let Some(since) = stats::ended(key) {
                    // The latest removals matter: a release removes its holder last.
                    let at = self.ended_len.min(ENDED - 1);
                    self.ended[at] = (key, since);
                    self.ended_len = at + 1;
                }
            }
        }
        removed
    }

    fn remove_owners(&mut self, ids: &[RedisString]) {
        if let Some(owners) = self.owners.get() {
            owners.zrem(ids);
        }
    }

    fn clear_owners(&mut self) {
        if let Some(owners) = self.owners.get() {
            owners.delete();
        }
    }

    fn put_weights(
        &mut self,
        set: Option<(&RedisString, u64)>,
        removed: &[&RedisString],
        extra: u64,
    ) {
        let total = RedisString::create_from_slice(self.ctx.ctx, b"");
        let extra_value =
            RedisString::create_from_slice(self.ctx.ctx, extra.to_string().as_bytes());
        let mut sets: Vec<(&RedisString, &RedisString)> = Vec::with_capacity(2);
        let mut deletes: Vec<&RedisString> = removed.to_vec();
        let set_value;
        if let Some((id, permits)) = set {
            if permits > 1 {
                set_value =
                    RedisString::create_from_slice(self.ctx.ctx, permits.to_string().as_bytes());
                sets.push((id, &set_value));
            } else {
                deletes.push(id);
            }
        }
        if extra > 0 {
            sets.push((&total, &extra_value));
        } else {
            deletes.push(&total);
        }
        // A new key gets its expiry with the holders': weights are only written by calls that
        // also add or remove a holder, or change a live holder's permits.
        self.permits.write().hwrite(&sets, &deletes);
    }

    fn clear_weights(&mut self) {
        if let Some(permits) = self.permits.get() {
            permits.delete();
        }
    }

    fn expired_removed(&mut self, count: usize) {
        stats::add(&COUNTERS.expired, count as u64);
        self.notify(c"sem.expire");
    }
}
