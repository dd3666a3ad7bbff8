//! What the server's callbacks hand on to the module above server/: one table of plain
//! functions, filled in by lib.rs at load. So server/ only wraps the module API and calls
//! nothing above it; the waiting side, the statistics and the fencing floor stand over it.

use std::os::raw::c_void;
use std::sync::OnceLock;

use redis_module::{Context, RedisResult};

/// What a blocked client that left on its own was doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Left {
    /// Already answered by the module (or not one of its waiters).
    NotWaiting,
    ForPermits,
    ForEmpty,
}

/// The fields of `INFO sem`: numbers, then texts.
pub type InfoFields = (Vec<(&'static str, u64)>, Vec<(&'static str, String)>);

pub struct Hooks {
    /// The module's timer fired.
    pub timer_fired: fn(&Context),
    /// A post-notification job the timer asked for (`timer::hurry`) runs.
    pub timer_job: fn(&Context),
    /// The end of a callback for another client's change: work deferred to the timer may run
    /// right after it (`timer::hurry`).
    pub hurry: fn(&Context),
    /// The reply of a client unblocked with `data` (what `block::unblock` was given).
    pub reply: fn(data: *mut c_void) -> RedisResult,
    /// `data` of an unblocked client is done with (replied, or its client is gone): it is the
    /// hook's to free.
    pub free: fn(data: *mut c_void, disconnected: bool),
    /// A blocked client (by its handle's address) left before the module answered it.
    pub left: fn(handle: usize) -> Left,
    /// The data set finished loading.
    pub loading_ended: fn(),
    /// This node became a primary.
    pub became_primary: fn(),
    /// This node became a replica.
    pub became_replica: fn(),
    /// A connection (by `CLIENT ID`) closed.
    pub connection_closed: fn(client: u64),
    /// `FLUSHDB` (one database) or `FLUSHALL` (`None`) ended.
    pub flushed: fn(db: Option<i32>),
    /// `SWAPDB a b`.
    pub swapped: fn(a: i32, b: i32),
    /// Whether anybody waits: asked before [`Hooks::key_changed`] and [`Hooks::slot_changed`].
    pub follows_keys: fn() -> bool,
    /// Whether `key` of database `db` may be a waited semaphore's or one of its derived keys
    /// (a filter of the waited names, asked first: nearly every key is no waited one's).
    pub may_concern: fn(db: i32, key: &[u8]) -> bool,
    /// Another client deleted, renamed, moved, expired or evicted `key` of database `db`.
    pub key_changed: fn(db: i32, key: &[u8]),
    /// `CLUSTER SETSLOT` while somebody waits: a slot change may take waited-on semaphores
    /// away (Redis Cluster, where the command filter hears of it).
    pub slot_changed: fn(),
    /// The server evicted `key` of database `db`: whether it was a semaphore's.
    pub key_evicted: fn(db: i32, key: &[u8]) -> bool,
    /// INFO is about to show the module's section, and the server has processed this many
    /// commands (`total_commands_processed`, which only `CONFIG RESETSTAT` lowers).
    pub commands_processed: fn(u64),
    /// The fields of `INFO sem`.
    pub info: fn() -> InfoFields,
}

static HOOKS: OnceLock<Hooks> = OnceLock::new();

/// Called once at load. The library may stay mapped across `MODULE UNLOAD` and `MODULE LOAD`:
/// then the table of the first load stays, which names the same functions.
pub fn install(hooks: Hooks) {
    let _ = HOOKS.set(hooks);
}

/// The table; callbacks run only after the load installed it.
pub fn hooks() -> &'static Hooks {
    HOOKS.get().expect("hooks installed at load")
}
