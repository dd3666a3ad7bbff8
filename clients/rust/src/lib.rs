//! Permits of a redsem semaphore (the Redis module `sem`) for the `redis` crate: a sync API
//! (this module) and an async one on tokio ([`aio`], the `tokio` feature, on by default), on
//! one server or in Redis Cluster ([`Cluster`]).
//!
//! ```no_run
//! use std::time::Duration;
//! use redsem_client::Semaphore;
//!
//! # fn main() -> Result<(), redsem_client::Error> {
//! let client = redis::Client::open("redis://127.0.0.1:6379/")?;
//! let permit = Semaphore::new(client, "jobs")
//!     .limit(3)
//!     .lease(Duration::from_secs(30))
//!     .wait(Some(Duration::from_secs(10)))
//!     .acquire()?;
//! // at most 3 holders here; check permit.is_lost() in long work to stop early
//! assert!(permit.release()?, "the lease ran out during the work");
//! # Ok(())
//! # }
//! ```
//!
//! Connections: the semaphores of one client (every [`Semaphore`] made of a clone of the same
//! `redis::Client`; in Redis Cluster of one [`Cluster`], per node) share a small pool of
//! connections that their acquires, refreshes and releases take for a call and give back, and
//! one thread that refreshes every permit of the client at lease/3: a held permit costs no
//! connection and no thread. A waiting acquire holds a connection while it waits (the price of
//! waiting in the server, as with `BLPOP`), taken from a pool of its own apart from the calls'.
//! A bound or durable [`Permit`] holds a connection of its own from the acquire to the release
//! (`BOUND` ties the permit to it, and `WAIT numreplicas` covers its writes). A permit is given
//! back when dropped. The identifier is made here (a UUID v4) unless [`Semaphore::id`] gives
//! one, so an acquire retried after a lost reply renews the same holder.
//!
//! A [`PermitSet`] ([`SemaphoreSet::acquire`]) holds permits of several semaphores taken all
//! or none in one step, refreshed, lost and given back together; [`wait_empty`] waits until a
//! semaphore has no holder; [`stored_limit`], [`set_limit`] and [`clear_limit`] read, store and
//! remove an operator's limit (`SEM.LIMIT`), used by every acquire instead of its own, and
//! [`in_use`] tells how many permits are held.
//!
//! # Redis Cluster
//!
//! Give a [`Cluster`] (made of the redis crate's `ClusterClient`) where a `Client` goes. Each
//! call then goes to the primary serving the name's slot, in the long form (every key named),
//! which every server takes. A name needs a hash tag (`"{jobs}"`, `"app:{jobs}"`) and a set's
//! names one slot, else [`Error::BadName`] before anything is sent. While the slot moves or its
//! primary fails over, a call is sent again, with the same identifier, until it has an answer
//! or the retry budget (30 s) has passed ([`Error::Unavailable`]).
//!
//! # Without the module
//!
//! Where the server has no module (a managed service), the crate runs the same operations as a
//! Lua script (`clients/scripts/redsem.lua` of the repository, shipped in the crate) over the
//! very same keys, so the module can be loaded later without changing code or keys. A
//! [`Semaphore`] (and its clones) asks the server on its first acquire whether it has the
//! module (`COMMAND INFO SEM.ACQUIRE`), keeps the answer, and while it is "no" asks again once
//! it is 10 s old (in Redis Cluster, the [`Cluster`] keeps it per node); the functions that take
//! a target ask at each call. Without the module, waiters wait in the script's
//! line, kept in the server and served in arrival order as the module's: a waiter blocks by
//! `BLPOP` on its own list `<name>:wake:<id>`, where the script tells it of its grant, tries
//! again at least every 2.5 s (which holds its place), sends `TICK` from a timer when a lease
//! ends before its `BLPOP` would, and leaves the line (`LEAVE`) when its time is up. What a
//! script cannot do fails with [`Error::ModuleRequired`] before anything is sent:
//! [`Semaphore::bound`],
//! [`SemaphoreSet`], [`wait_empty`].

mod cluster;
mod core;
mod sync;

#[cfg(feature = "tokio")]
pub mod aio;

pub use crate::cluster::Cluster;
pub use crate::core::{Error, Result};
pub use crate::sync::{
    clear_limit, in_use, set_limit, stored_limit, wait_empty, Permit, PermitSet, Semaphore,
    SemaphoreSet, Target,
};
