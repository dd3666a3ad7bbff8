//! Server events the module follows. When this node's data may be behind what clients were told
//! (loading ended, or it became a primary), it takes a fencing floor from the clock: fair tickets
//! go on from there at least (`fencing.rs`); this node becoming a replica answers the waiters; a
//! `CONFIG SET` of the memory settings refreshes what the admission of waiters reads. Those three
//! the module follows while it is loaded.
//!
//! The server walks its list of listeners twice per event-loop turn, whichever event fires: each
//! one costs every other command a little (docs/performance.md). So what only the waiting side
//! needs is followed only while it does: flushes and swapped databases while anybody waits or
//! holds a BOUND permit, connections closing while a BOUND permit is held or waited for.
//!
//! While a client waits, it also hears of another client deleting, renaming, moving, expiring or
//! evicting a waited semaphore's keys ([`KeyWatch`]): such a change serves its line right after
//! the command that made it, or as the server's expiry cycle removes the key, whatever the
//! number of waiters. How depends on the server, each the cheapest for other commands that
//! reaches every waiter (figures in docs/performance.md):
//! - Redis 8.2 and later: keyspace events of the generic, expired and evicted classes, while
//!   anybody waits (the server can end the subscription).
//! - Redis 7.2 to 8.1 and Valkey: the key server event (deleted, expired, evicted, overwritten)
//!   while anybody waits. They cannot end a keyspace subscription, which costs every write of
//!   every client a walk of the subscribers for the rest of the load (about one percent on
//!   Valkey 9.1); Valkey 8.1 to 9.0 would also leave the connection of a `MOVE key 5` in
//!   database 5 (their keyspace events run on the calling connection: valkey-io/valkey#4024).
//!   The key event costs a module context for every key deleted, expired or overwritten
//!   anywhere while somebody waits; the names filter (`names.rs`) keeps the module's part of it
//!   to a hash and a load. An overwrite of a waited key with another type answers its waiters
//!   `WRONGTYPE` at once there too.
//! - Redis 7.0 (no key event, no end to a keyspace subscription): the keyspace events of the
//!   generic, expired and evicted classes from the first wait on, for the rest of the load.
//!
//! The classes of writes (string, hash, sorted set) are not followed: each event of a followed
//! class costs the server a module context (about 600 instructions) on every such write
//! anywhere. A `ZREM`, or (but for the key server event) an overwrite of a waited key by another
//! client, is seen when the line is next served: at its next lease end or a waiter's timeout.
//! `key-events keyspace|server` (a module argument) chooses otherwise where the server offers
//! both (keyspace events never on Valkey 8.1 to 9.0).
//!
//! Subscriptions end ([`settle`]) at the end of the command or timer run that ended the last
//! wait or binding, never inside the server's walk of a list of listeners, which must not
//! change under it (the waiting side decides where: `state::scope`).

use std::cell::Cell;
use std::os::raw::{c_char, c_int, c_void};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicU8};

use redis_module::{raw, Context};

use crate::config::KeyEvents;
use crate::error::SemError;
use crate::server::guard;
use crate::server::hooks::hooks;

fn server_event(
    ctx: *mut raw::RedisModuleCtx,
    id: u64,
    callback: raw::RedisModuleEventCallback,
) -> bool {
    let event = raw::RedisModuleEvent { id, dataver: 1 };
    // SAFETY: a context of the module (the module is what Redis takes from it); the callback
    // is a plain function, or none to unsubscribe.
    let status = unsafe { raw::RedisModule_SubscribeToServerEvent.unwrap()(ctx, event, callback) };
    status == raw::REDISMODULE_OK as i32
}

/// Subscribes to the events followed while the module is loaded (at load), and makes sure the
/// server takes the others, so that following them later cannot fail. `server`: whether Valkey,
/// its major and minor version; `prefer`: the `key-events` module argument.
pub fn subscribe(
    ctx: *mut raw::RedisModuleCtx,
    following: &Following,
    server: (bool, u32, u32),
    prefer: KeyEvents,
) -> Result<(), String> {
    let watch = choose(server, prefer, can_unfollow_keys(), key_event_supported())?;
    following.groups.store(0, Relaxed);
    following.keys.store(false, Relaxed);
    following.watch.store(watch as u8, Relaxed);
    let for_good = [
        (raw::REDISMODULE_EVENT_LOADING, Some(on_loading as Callback)),
        (
            raw::REDISMODULE_EVENT_REPLICATION_ROLE_CHANGED,
            Some(on_role_changed as Callback),
        ),
        (
            raw::REDISMODULE_EVENT_CONFIG,
            Some(on_config_change as Callback),
        ),
    ];
    let subscribed = for_good
        .into_iter()
        .all(|(id, callback)| server_event(ctx, id, callback))
        && [DATABASES, CONNECTIONS].into_iter().all(|group| {
            events_of(group)
                .iter()
                .all(|&(id, callback)| server_event(ctx, id, Some(callback)))
                && events_of(group)
                    .iter()
                    .all(|&(id, _)| server_event(ctx, id, None))
        });
    let keys_taken = watch != KeyWatch::KeyEvent
        || (server_event(ctx, raw::REDISMODULE_EVENT_KEY, Some(on_key_server_event))
            && server_event(ctx, raw::REDISMODULE_EVENT_KEY, None));
    match subscribed && keys_taken {
        true => Ok(()),
        false => Err("the server refused the event subscriptions".into()),
    }
}

/// How the module hears of another client's change to a waited semaphore's keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyWatch {
    /// Keyspace events, followed while anybody waits (the server can end them).
    KeyspaceWhileWaiting = 0,
    /// Keyspace events, from the first wait on for the rest of the load.
    KeyspaceForGood = 1,
    /// The key server event, followed while anybody waits.
    KeyEvent = 2,
}

/// What the module follows of the server's events beyond those followed for good, as this
/// layer told the server: the waiting side's owner (`state.rs`) keeps it, and only the
/// functions here change it.
pub struct Following {
    /// How changes to keys are followed on this server (chosen at load: a [`KeyWatch`]).
    watch: AtomicU8,
    /// The groups of server events followed now (`DATABASES`, `CONNECTIONS`).
    groups: AtomicU8,
    /// Whether changes to keys are followed now.
    keys: AtomicBool,
}

impl Following {
    pub const fn new() -> Following {
        Following {
            watch: AtomicU8::new(KeyWatch::KeyspaceWhileWaiting as u8),
            groups: AtomicU8::new(0),
            keys: AtomicBool::new(false),
        }
    }

    fn watch(&self) -> KeyWatch {
        match self.watch.load(Relaxed) {
            1 => KeyWatch::KeyspaceForGood,
            2 => KeyWatch::KeyEvent,
            _ => KeyWatch::KeyspaceWhileWaiting,
        }
    }
}

/// How to follow changes to waited keys on a server (`server`: whether Valkey, major, minor)
/// that can end a keyspace subscription or not, and has the key server event or not: see the
/// module comment.
pub fn choose(
    server: (bool, u32, u32),
    prefer: KeyEvents,
    can_unfollow_keys: bool,
    key_event: bool,
) -> Result<KeyWatch, String> {
    let (valkey, major, minor) = server;
    // valkey-io/valkey#4024: from 8.1 until 9.1, a keyspace event's callback runs on the calling
    // connection and leaves it in the event's database.
    let keyspace_moves_caller = valkey && ((8, 1)..(9, 1)).contains(&(major, minor));
    let keyspace = match can_unfollow_keys {
        true => KeyWatch::KeyspaceWhileWaiting,
        false => KeyWatch::KeyspaceForGood,
    };
    match prefer {
        KeyEvents::Server if key_event => Ok(KeyWatch::KeyEvent),
        KeyEvents::Server => Err("key-events server needs Redis 7.2 or later, or Valkey".into()),
        KeyEvents::Keyspace if keyspace_moves_caller => Err(
            "key-events keyspace: this server's keyspace events switch the calling connection's \
             database (valkey-io/valkey#4024); use auto or server"
                .into(),
        ),
        KeyEvents::Keyspace => Ok(keyspace),
        KeyEvents::Auto if can_unfollow_keys => Ok(KeyWatch::KeyspaceWhileWaiting),
        KeyEvents::Auto if key_event => Ok(KeyWatch::KeyEvent),
        KeyEvents::Auto => Ok(KeyWatch::KeyspaceForGood),
    }
}

/// Whether the server has the key server event (Redis 7.2 and later, Valkey).
fn key_event_supported() -> bool {
    // SAFETY: a copy of the pointer the module API filled in at load; a plain query.
    unsafe {
        raw::RedisModule_IsSubEventSupported.is_some_and(|supported| {
            supported(
                raw::RedisModuleEvent {
                    id: raw::REDISMODULE_EVENT_KEY,
                    dataver: 1,
                },
                raw::REDISMODULE_SUBEVENT_KEY_DELETED,
            ) != 0
        })
    }
}

type Callback =
    unsafe extern "C" fn(*mut raw::RedisModuleCtx, raw::RedisModuleEvent, u64, *mut c_void);

/// What the waiting side needs to hear of beyond the events followed for good.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Needs {
    /// A client waits: flushes and swapped databases (and changes to keys: [`follow_waits`]).
    Waiting,
    /// A permit is BOUND to its connection, or asked for so: connections closing, flushes and
    /// swapped databases.
    Bound,
}

/// `FLUSHDB`/`FLUSHALL` and `SWAPDB` (a group of [`Following`]).
const DATABASES: u8 = 1;
/// Connections closing.
const CONNECTIONS: u8 = 2;

fn events_of(group: u8) -> &'static [(u64, Callback)] {
    match group {
        DATABASES => &[
            (raw::REDISMODULE_EVENT_FLUSHDB, on_flush as Callback),
            (raw::REDISMODULE_EVENT_SWAPDB, on_swap as Callback),
        ],
        _ => &[(
            raw::REDISMODULE_EVENT_CLIENT_CHANGE,
            on_client_change as Callback,
        )],
    }
}

/// Starts following the server events `needs` asks for, if the module does not already (the
/// server took them at load: see [`subscribe`]).
pub fn follow(ctx: *mut raw::RedisModuleCtx, following: &Following, needs: Needs) {
    let wanted = match needs {
        Needs::Waiting => DATABASES,
        Needs::Bound => DATABASES | CONNECTIONS,
    };
    let followed = following.groups.load(Relaxed);
    let mut now = followed;
    for group in [DATABASES, CONNECTIONS] {
        if wanted & group != 0 && followed & group == 0 {
            for &(id, callback) in events_of(group) {
                server_event(ctx, id, Some(callback));
            }
            now |= group;
        }
    }
    following.groups.store(now, Relaxed);
}

/// Starts following what a waiting client needs: changes to keys, flushes and swapped
/// databases. Before the caller waits: an error changes nothing.
pub fn follow_waits(ctx: *mut raw::RedisModuleCtx, following: &Following) -> Result<(), SemError> {
    follow_keys(ctx, following)?;
    follow(ctx, following, Needs::Waiting);
    Ok(())
}

/// Whether the module follows something it could stop following now (`waiting`: anybody
/// waits; `bound`: anybody holds a BOUND permit), with [`settle`].
pub fn can_end(following: &Following, waiting: bool, bound: bool) -> bool {
    !waiting
        && ((following.keys.load(Relaxed) && following.watch() != KeyWatch::KeyspaceForGood)
            || (!bound && following.groups.load(Relaxed) != 0))
}

/// The module's subscriptions to server and keyspace events now (each costs other commands a
/// little: the module comment).
pub fn subscriptions(following: &Following) -> u64 {
    let followed = following.groups.load(Relaxed);
    let mut count = 3;
    if followed & DATABASES != 0 {
        count += 2;
    }
    if followed & CONNECTIONS != 0 {
        count += 1;
    }
    count + u64::from(following.keys.load(Relaxed)) + u64::from(super::memory::follows_evictions())
}

/// Stops following what nobody needs now (`waiting`: anybody waits; `bound`: anybody holds a
/// BOUND permit). Never inside a walk of the server's listeners (see the module comment).
pub fn settle(ctx: *mut raw::RedisModuleCtx, following: &Following, waiting: bool, bound: bool) {
    if !waiting {
        stop_following_keys(ctx, following);
    }
    let followed = following.groups.load(Relaxed);
    if waiting || bound || followed == 0 {
        return;
    }
    for group in [DATABASES, CONNECTIONS] {
        if followed & group != 0 {
            for &(id, _) in events_of(group) {
                server_event(ctx, id, None);
            }
        }
    }
    following.groups.store(0, Relaxed);
}

/// The classes followed: deletions, renames and moves; expiries; evictions.
const KEY_CLASSES: c_int = (raw::REDISMODULE_NOTIFY_GENERIC
    | raw::REDISMODULE_NOTIFY_EXPIRED
    | raw::REDISMODULE_NOTIFY_EVICTED) as c_int;

/// Starts following deletions, renames, moves, expiries and evictions of keys when a client
/// waits (and the module does not follow them already): until then nothing needs them. What is
/// followed where, and why: see the module comment.
fn follow_keys(ctx: *mut raw::RedisModuleCtx, following: &Following) -> Result<(), SemError> {
    if following.keys.load(Relaxed) {
        return Ok(());
    }
    let followed = match following.watch() {
        // Taken at load ([`subscribe`]).
        KeyWatch::KeyEvent => {
            server_event(ctx, raw::REDISMODULE_EVENT_KEY, Some(on_key_server_event))
        }
        // SAFETY: a command's context (the module pointer is what Redis takes from it); the
        // callback is a plain function.
        KeyWatch::KeyspaceWhileWaiting | KeyWatch::KeyspaceForGood => unsafe {
            raw::RedisModule_SubscribeToKeyspaceEvents.unwrap()(
                ctx,
                KEY_CLASSES,
                Some(on_key_event),
            ) == raw::REDISMODULE_OK as c_int
        },
    };
    if !followed {
        return Err(SemError::Internal);
    }
    following.keys.store(true, Relaxed);
    Ok(())
}

/// Whether the server can end a keyspace subscription (Redis 8.2 and later).
fn can_unfollow_keys() -> bool {
    // SAFETY: a copy of the pointer the module API filled in at load.
    unsafe { raw::RedisModule_UnsubscribeFromKeyspaceEvents }.is_some()
}

/// Stops following changes to keys (nobody waits), where the server can end that: every
/// write's event costs other commands a walk of the subscribers. The next wait follows again.
fn stop_following_keys(ctx: *mut raw::RedisModuleCtx, following: &Following) {
    if !following.keys.load(Relaxed) {
        return;
    }
    let ended = match following.watch() {
        KeyWatch::KeyspaceForGood => false,
        KeyWatch::KeyEvent => server_event(ctx, raw::REDISMODULE_EVENT_KEY, None),
        KeyWatch::KeyspaceWhileWaiting => {
            // SAFETY: a copy of the pointer the module API filled in at load.
            let Some(unsubscribe) = (unsafe { raw::RedisModule_UnsubscribeFromKeyspaceEvents })
            else {
                return;
            };
            // SAFETY: a context of the module (the module is what Redis matches); the same
            // classes and callback as the subscription.
            let status = unsafe { unsubscribe(ctx, KEY_CLASSES, Some(on_key_event)) };
            status == raw::REDISMODULE_OK as c_int
        }
    };
    if ended {
        following.keys.store(false, Relaxed);
    }
}

extern "C" fn on_loading(
    _ctx: *mut raw::RedisModuleCtx,
    _event: raw::RedisModuleEvent,
    subevent: u64,
    _data: *mut c_void,
) {
    if subevent == raw::REDISMODULE_SUBEVENT_LOADING_ENDED {
        guard((), hooks().loading_ended);
    }
}

extern "C" fn on_role_changed(
    _ctx: *mut raw::RedisModuleCtx,
    _event: raw::RedisModuleEvent,
    subevent: u64,
    _data: *mut c_void,
) {
    if subevent == raw::REDISMODULE_EVENT_REPLROLECHANGED_NOW_MASTER {
        guard((), hooks().became_primary);
    } else if subevent == raw::REDISMODULE_EVENT_REPLROLECHANGED_NOW_REPLICA {
        guard((), hooks().became_replica);
    }
}

/// The data a server event passes with its `wanted` subevent (any with `None`).
///
/// # Safety
/// `T` must be the type the server passes with this event.
unsafe fn event_data<'a, T>(
    subevent: u64,
    wanted: Option<u64>,
    data: *mut c_void,
) -> Option<&'a T> {
    if data.is_null() || wanted.is_some_and(|wanted| wanted != subevent) {
        return None;
    }
    Some(&*data.cast::<T>())
}

extern "C" fn on_client_change(
    _ctx: *mut raw::RedisModuleCtx,
    _event: raw::RedisModuleEvent,
    subevent: u64,
    data: *mut c_void,
) {
    let closed = Some(raw::REDISMODULE_SUBEVENT_CLIENT_CHANGE_DISCONNECTED);
    // SAFETY: for this event Redis passes a RedisModuleClientInfo (version 1 or later, whose
    // layout starts with version, flags, id).
    if let Some(info) = unsafe { event_data::<raw::RedisModuleClientInfo>(subevent, closed, data) }
    {
        guard((), || (hooks().connection_closed)(info.id));
    }
}

extern "C" fn on_flush(
    ctx: *mut raw::RedisModuleCtx,
    _event: raw::RedisModuleEvent,
    subevent: u64,
    data: *mut c_void,
) {
    let ended = Some(raw::REDISMODULE_SUBEVENT_FLUSHDB_END);
    // SAFETY: for this event Redis passes a RedisModuleFlushInfo.
    if let Some(info) = unsafe { event_data::<raw::RedisModuleFlushInfo>(subevent, ended, data) } {
        let db = (info.dbnum >= 0).then_some(info.dbnum);
        guard((), || (hooks().flushed)(db));
        (hooks().hurry)(&Context::new(ctx));
    }
}

extern "C" fn on_swap(
    ctx: *mut raw::RedisModuleCtx,
    _event: raw::RedisModuleEvent,
    subevent: u64,
    data: *mut c_void,
) {
    // SAFETY: for this event Redis passes a RedisModuleSwapDbInfo.
    if let Some(info) = unsafe { event_data::<raw::RedisModuleSwapDbInfo>(subevent, None, data) } {
        let (first, second) = (info.dbnum_first, info.dbnum_second);
        guard((), || (hooks().swapped)(first, second));
        (hooks().hurry)(&Context::new(ctx));
    }
}

extern "C" fn on_config_change(
    ctx: *mut raw::RedisModuleCtx,
    _event: raw::RedisModuleEvent,
    subevent: u64,
    data: *mut c_void,
) {
    let changed = Some(raw::REDISMODULE_SUBEVENT_CONFIG_CHANGE);
    // SAFETY: for this event Redis passes a RedisModuleConfigChange whose names are C
    // strings, valid for the callback.
    let Some(change) =
        (unsafe { event_data::<raw::RedisModuleConfigChangeV1>(subevent, changed, data) })
    else {
        return;
    };
    // SAFETY: as above: `num_changes` names.
    let names: Vec<&[u8]> = unsafe {
        (0..change.num_changes as usize)
            .map(|i| *change.config_names.add(i))
            .filter(|name| !name.is_null())
            .map(|name| std::ffi::CStr::from_ptr(name).to_bytes())
            .collect()
    };
    guard((), || {
        if super::memory::concerns_memory(&names) {
            super::memory::refresh(ctx);
        }
    });
}

thread_local! {
    /// Set while the module fires the events of its own writes, which are not news to it.
    static OWN_WRITE: Cell<bool> = const { Cell::new(false) };
}

/// Runs `notify`, which fires keyspace events of a change the module made itself.
pub fn own_write<T>(notify: impl FnOnce() -> T) -> T {
    OWN_WRITE.with(|own| own.set(true));
    let result = notify();
    OWN_WRITE.with(|own| own.set(false));
    result
}

extern "C" fn on_key_event(
    ctx: *mut raw::RedisModuleCtx,
    _type: c_int,
    _event: *const c_char,
    key: *mut raw::RedisModuleString,
) -> c_int {
    if !key.is_null() && !OWN_WRITE.with(Cell::get) && (hooks().follows_keys)() {
        let mut len = 0;
        // SAFETY: Redis passes the key's name, valid for the callback, and a context whose
        // selected database is the key's.
        let (db, name) = unsafe {
            let ptr = raw::RedisModule_StringPtrLen.unwrap()(key, &mut len);
            (
                raw::RedisModule_GetSelectedDb.unwrap()(ctx),
                std::slice::from_raw_parts(ptr.cast::<u8>(), len),
            )
        };
        if (hooks().may_concern)(db, name) {
            guard((), || (hooks().key_changed)(db, name));
            (hooks().hurry)(&Context::new(ctx));
        }
    }
    raw::REDISMODULE_OK as c_int
}

extern "C" fn on_key_server_event(
    ctx: *mut raw::RedisModuleCtx,
    _event: raw::RedisModuleEvent,
    _subevent: u64,
    data: *mut c_void,
) {
    if data.is_null() {
        return;
    }
    // SAFETY: for this event Redis passes a RedisModuleKeyInfo (version 1: the key, open for
    // the callback); its name is valid while the key is.
    let (db, name) = unsafe {
        let key = (*data.cast::<raw::RedisModuleKeyInfoV1>()).key;
        let name = raw::RedisModule_GetKeyNameFromModuleKey.unwrap()(key);
        if name.is_null() {
            return;
        }
        let mut len = 0;
        let ptr = raw::RedisModule_StringPtrLen.unwrap()(name, &mut len);
        (
            raw::RedisModule_GetDbIdFromModuleKey.unwrap()(key),
            std::slice::from_raw_parts(ptr.cast::<u8>(), len),
        )
    };
    // Nearly every key the server reports is no waited semaphore's: the filter answers first.
    if (hooks().may_concern)(db, name) && (hooks().follows_keys)() {
        guard((), || (hooks().key_changed)(db, name));
        (hooks().hurry)(&Context::new(ctx));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_server_follows_keys_the_cheapest_way_that_reaches_every_waiter() {
        use KeyEvents::*;
        use KeyWatch::*;
        // (valkey, major, minor), prefer, can unfollow keyspace, has the key event -> choice
        type Row = ((bool, u32, u32), KeyEvents, bool, bool, Option<KeyWatch>);
        let table: [Row; 12] = [
            ((false, 7, 0), Auto, false, false, Some(KeyspaceForGood)),
            ((false, 7, 0), Server, false, false, None),
            ((false, 7, 2), Auto, false, true, Some(KeyEvent)),
            ((false, 7, 2), Server, false, true, Some(KeyEvent)),
            ((false, 8, 2), Auto, true, true, Some(KeyspaceWhileWaiting)),
            ((false, 8, 2), Server, true, true, Some(KeyEvent)),
            ((true, 8, 0), Auto, false, true, Some(KeyEvent)),
            ((true, 8, 1), Auto, false, true, Some(KeyEvent)),
            ((true, 8, 1), Keyspace, false, true, None),
            ((true, 9, 0), Auto, false, true, Some(KeyEvent)),
            ((true, 9, 1), Auto, false, true, Some(KeyEvent)),
            ((true, 9, 1), Keyspace, false, true, Some(KeyspaceForGood)),
        ];
        for (server, prefer, unfollow, key_event, expected) in table {
            assert_eq!(
                choose(server, prefer, unfollow, key_event).ok(),
                expected,
                "{server:?} {prefer:?}"
            );
        }
    }
}
