//! The ways of running a semaphore that the benchmark compares, each with its
//! own acquire/release "pair", pre-fill and memory accounting, and the floor
//! of one trivial command per operation, run against the server with the
//! module and against a second one without it.

use std::fmt;
use std::str::FromStr;
use std::time::{SystemTime, UNIX_EPOCH};

use redis::aio::MultiplexedConnection;
use uuid::Uuid;

use crate::BoxError;

/// Lease given to every holder, the benchmark's own and the pre-filled ones.
/// It outlives any measurement, so no holder expires while it is counted.
pub const LEASE_MS: u64 = 600_000;
/// The same lease in the seconds that redsem's commands take.
const LEASE_SECS: &str = "600";

/// Commands sent per pipeline while pre-filling, so a large N neither takes
/// one round trip per holder nor builds one huge reply.
const PREFILL_BATCH: u64 = 1_000;

const FAIR_ACQUIRE_LUA: &str = include_str!("../lua/fair_acquire.lua");
const FAIR_RELEASE_LUA: &str = include_str!("../lua/fair_release.lua");
const NONFAIR_ACQUIRE_LUA: &str = include_str!("../lua/nonfair_acquire.lua");

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Contender {
    /// `SEM.ACQUIREFAIR` + `SEM.RELEASE`.
    RedsemFair,
    /// `SEM.ACQUIRE` + `SEM.RELEASE`.
    Redsem,
    /// `SEM.ACQUIRE ... COUNT 4` (one holder, four permits) + `SEM.RELEASE`
    /// (which gives back all four).
    RedsemCount4,
    /// `SEM.ACQUIREALL 2` (a permit of two semaphores at once) +
    /// `SEM.RELEASEALL 2`.
    RedsemSet2,
    /// The classic fair recipe as MULTI/EXEC pipelines.
    RecipeMulti,
    /// The same fair recipe as one script per operation.
    RecipeLua,
    /// The common non-fair script (ZREMRANGEBYSCORE, ZCARD, ZADD, PEXPIRE).
    NonFairLua,
    /// One trivial command per operation: INCR, then DECR.
    Floor,
    /// The floor against the second redis-server, the one without the
    /// module: what the module's command filter costs other commands.
    FloorPlain,
}

impl Contender {
    pub const ALL: [Contender; 9] = [
        Contender::RedsemFair,
        Contender::Redsem,
        Contender::RedsemCount4,
        Contender::RedsemSet2,
        Contender::RecipeMulti,
        Contender::RecipeLua,
        Contender::NonFairLua,
        Contender::Floor,
        Contender::FloorPlain,
    ];

    /// Short name used on the command line, in key names and in the TSV.
    pub fn slug(self) -> &'static str {
        match self {
            Contender::RedsemFair => "redsem-fair",
            Contender::Redsem => "redsem",
            Contender::RedsemCount4 => "redsem-count4",
            Contender::RedsemSet2 => "redsem-set2",
            Contender::RecipeMulti => "recipe-multi",
            Contender::RecipeLua => "recipe-lua",
            Contender::NonFairLua => "nonfair-lua",
            Contender::Floor => "floor",
            Contender::FloorPlain => "floor-plain",
        }
    }

    /// Human name for the table and the chart legend.
    pub fn label(self) -> &'static str {
        match self {
            Contender::RedsemFair => "SEM.ACQUIREFAIR",
            Contender::Redsem => "SEM.ACQUIRE",
            Contender::RedsemCount4 => "SEM.ACQUIRE COUNT 4",
            Contender::RedsemSet2 => "SEM.ACQUIREALL of 2",
            Contender::RecipeMulti => "fair recipe, MULTI/EXEC",
            Contender::RecipeLua => "fair recipe, Lua",
            Contender::NonFairLua => "non-fair Lua",
            Contender::Floor => "floor (INCR + DECR)",
            Contender::FloorPlain => "floor, no module",
        }
    }

    /// Whether the contender needs the redsem module loaded in the server.
    pub fn needs_module(self) -> bool {
        matches!(
            self,
            Contender::RedsemFair
                | Contender::Redsem
                | Contender::RedsemCount4
                | Contender::RedsemSet2
        )
    }

    /// Whether the contender runs against the second redis-server, the one
    /// without the module, rather than the one with it.
    pub fn on_plain_server(self) -> bool {
        self == Contender::FloorPlain
    }

    /// redsem's acquire command; only meaningful for the redsem contenders.
    fn redsem_acquire(self) -> &'static str {
        if self == Contender::RedsemFair {
            "SEM.ACQUIREFAIR"
        } else {
            "SEM.ACQUIRE"
        }
    }

    /// Whether the contender keeps holders at all (the floors keep none, so
    /// they have neither a pre-fill nor a memory figure).
    pub fn has_holders(self) -> bool {
        !matches!(self, Contender::Floor | Contender::FloorPlain)
    }

    /// One acquire attempt and, if it succeeded, the matching release.
    /// Returns whether the attempt acquired a place.
    pub async fn pair(
        self,
        conn: &mut MultiplexedConnection,
        keys: &Keys,
        scripts: &Scripts,
        limit: u64,
    ) -> Result<bool, BoxError> {
        match self {
            Contender::RedsemFair | Contender::Redsem | Contender::RedsemCount4 => {
                redsem_pair(self, conn, keys, limit).await
            }
            Contender::RedsemSet2 => {
                let second = keys.second();
                let id: Option<String> = redis::cmd("SEM.ACQUIREALL")
                    .arg(2)
                    .arg(&keys.holders)
                    .arg(limit)
                    .arg(1)
                    .arg(&second)
                    .arg(limit)
                    .arg(1)
                    .arg(LEASE_SECS)
                    .query_async(conn)
                    .await?;
                let Some(id) = id else { return Ok(false) };
                let released: i64 = redis::cmd("SEM.RELEASEALL")
                    .arg(2)
                    .arg(&keys.holders)
                    .arg(&second)
                    .arg(&id)
                    .query_async(conn)
                    .await?;
                expect_released(self, released / 2)?;
                Ok(true)
            }
            Contender::RecipeMulti => recipe_multi_pair(conn, keys, limit).await,
            Contender::RecipeLua => {
                let id = new_id();
                let acquired: i64 = redis::cmd("EVALSHA")
                    .arg(&scripts.fair_acquire)
                    .arg(3)
                    .arg(&keys.holders)
                    .arg(&keys.owner)
                    .arg(&keys.counter)
                    .arg(limit)
                    .arg(LEASE_MS)
                    .arg(now_ms())
                    .arg(&id)
                    .query_async(conn)
                    .await?;
                if acquired == 0 {
                    return Ok(false);
                }
                let removed: i64 = redis::cmd("EVALSHA")
                    .arg(&scripts.fair_release)
                    .arg(2)
                    .arg(&keys.holders)
                    .arg(&keys.owner)
                    .arg(&id)
                    .query_async(conn)
                    .await?;
                expect_released(self, removed)?;
                Ok(true)
            }
            Contender::NonFairLua => {
                let id = new_id();
                let acquired: i64 = redis::cmd("EVALSHA")
                    .arg(&scripts.nonfair_acquire)
                    .arg(1)
                    .arg(&keys.holders)
                    .arg(limit)
                    .arg(&id)
                    .arg(LEASE_MS)
                    .arg(now_ms())
                    .query_async(conn)
                    .await?;
                if acquired == 0 {
                    return Ok(false);
                }
                let removed: i64 = redis::cmd("ZREM")
                    .arg(&keys.holders)
                    .arg(&id)
                    .query_async(conn)
                    .await?;
                expect_released(self, removed)?;
                Ok(true)
            }
            Contender::Floor | Contender::FloorPlain => {
                let _: i64 = redis::cmd("INCR")
                    .arg(&keys.counter)
                    .query_async(conn)
                    .await?;
                let _: i64 = redis::cmd("DECR")
                    .arg(&keys.counter)
                    .query_async(conn)
                    .await?;
                Ok(true)
            }
        }
    }

    /// Puts `n` live holders in place, each in the contender's own layout,
    /// then checks that exactly `n` are there.
    pub async fn prefill(
        self,
        conn: &mut MultiplexedConnection,
        keys: &Keys,
        n: u64,
        limit: u64,
    ) -> Result<(), BoxError> {
        if !self.has_holders() || n == 0 {
            return Ok(());
        }
        let now = now_ms();
        let mut done = 0;
        while done < n {
            let batch = PREFILL_BATCH.min(n - done);
            match self {
                // Through the module's own commands, so whatever layout it
                // keeps is the one measured. The weighted contender's
                // pre-filled holders are ordinary ones (one permit each).
                Contender::RedsemFair
                | Contender::Redsem
                | Contender::RedsemCount4
                | Contender::RedsemSet2 => {
                    let command = self.redsem_acquire();
                    let mut pipe = redis::pipe();
                    for _ in 0..batch {
                        pipe.cmd(command)
                            .arg(&keys.holders)
                            .arg(limit)
                            .arg(LEASE_SECS);
                        // The set's second semaphore holds as many.
                        if self == Contender::RedsemSet2 {
                            pipe.cmd(command)
                                .arg(keys.second())
                                .arg(limit)
                                .arg(LEASE_SECS);
                        }
                    }
                    let ids: Vec<Option<String>> = pipe.query_async(conn).await?;
                    if ids.iter().any(Option::is_none) {
                        return Err(format!("{command} refused a holder while pre-filling").into());
                    }
                }
                // Holders stamped with the current time, and for the fair
                // recipe tickets 1..=n in the owner set with the counter at n.
                Contender::RecipeMulti | Contender::RecipeLua | Contender::NonFairLua => {
                    let ids: Vec<String> = (0..batch).map(|_| new_id()).collect();
                    let mut pipe = redis::pipe();
                    let zadd = pipe.cmd("ZADD").arg(&keys.holders);
                    for id in &ids {
                        zadd.arg(now).arg(id);
                    }
                    zadd.ignore();
                    if self == Contender::NonFairLua {
                        pipe.cmd("PEXPIRE")
                            .arg(&keys.holders)
                            .arg(LEASE_MS)
                            .ignore();
                    } else {
                        let zadd = pipe.cmd("ZADD").arg(&keys.owner);
                        for (i, id) in (done + 1..).zip(&ids) {
                            zadd.arg(i).arg(id);
                        }
                        zadd.ignore();
                        pipe.cmd("SET")
                            .arg(&keys.counter)
                            .arg(done + batch)
                            .ignore();
                    }
                    pipe.query_async::<()>(conn).await?;
                }
                Contender::Floor | Contender::FloorPlain => {
                    unreachable!("the floors keep no holders")
                }
            }
            done += batch;
        }
        let live: u64 = redis::cmd("ZCARD")
            .arg(&keys.holders)
            .query_async(conn)
            .await?;
        if live != n {
            return Err(format!(
                "{}: pre-filled {n} holders but {live} are live",
                self.slug()
            )
            .into());
        }
        Ok(())
    }

    /// Bytes per holder of the keys the contender keeps (the holders set,
    /// the owner set of the fair layouts, and redsem's permits hash where
    /// weighted holders left one); `None` for the floors.
    pub async fn bytes_per_holder(
        self,
        conn: &mut MultiplexedConnection,
        keys: &Keys,
        n: u64,
    ) -> Result<Option<f64>, BoxError> {
        if !self.has_holders() || n == 0 {
            return Ok(None);
        }
        let mut total = 0;
        for key in [&keys.holders, &keys.owner, &keys.permits] {
            // SAMPLES 0 walks every element: exact rather than estimated.
            let bytes: Option<u64> = redis::cmd("MEMORY")
                .arg("USAGE")
                .arg(key)
                .arg("SAMPLES")
                .arg(0)
                .query_async(conn)
                .await?;
            total += bytes.unwrap_or(0);
        }
        Ok(Some(total as f64 / n as f64))
    }
}

impl fmt::Display for Contender {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.slug())
    }
}

impl FromStr for Contender {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Contender::ALL
            .into_iter()
            .find(|c| c.slug() == s)
            .ok_or_else(|| {
                let names: Vec<_> = Contender::ALL.iter().map(|c| c.slug()).collect();
                format!(
                    "unknown contender {s:?}; expected one of {}",
                    names.join(", ")
                )
            })
    }
}

/// The keys of one run, in redsem's layout, which the recipes share:
/// `<name>` holds the holders, `<name>:owner` the tickets, `<name>:counter`
/// the ticket counter (and the floor's counter), `<name>:permits` redsem's
/// record of weighted holders.
#[derive(Clone, Debug)]
pub struct Keys {
    pub holders: String,
    pub owner: String,
    pub counter: String,
    pub permits: String,
}

impl Keys {
    pub fn new(name: String) -> Self {
        Keys {
            owner: format!("{name}:owner"),
            counter: format!("{name}:counter"),
            permits: format!("{name}:permits"),
            holders: name,
        }
    }

    /// The second semaphore of the set contender.
    pub fn second(&self) -> String {
        format!("{}-2", self.holders)
    }

    pub async fn delete(&self, conn: &mut MultiplexedConnection) -> Result<(), BoxError> {
        let second = Keys::new(self.second());
        redis::cmd("DEL")
            .arg(&self.holders)
            .arg(&self.owner)
            .arg(&self.counter)
            .arg(&self.permits)
            .arg(&second.holders)
            .arg(&second.owner)
            .arg(&second.counter)
            .arg(&second.permits)
            .query_async::<()>(conn)
            .await?;
        Ok(())
    }
}

/// SHA1 digests of the loaded scripts, so each call is one EVALSHA.
#[derive(Debug)]
pub struct Scripts {
    fair_acquire: String,
    fair_release: String,
    nonfair_acquire: String,
}

impl Scripts {
    pub async fn load(conn: &mut MultiplexedConnection) -> Result<Self, BoxError> {
        Ok(Scripts {
            fair_acquire: load_script(conn, FAIR_ACQUIRE_LUA).await?,
            fair_release: load_script(conn, FAIR_RELEASE_LUA).await?,
            nonfair_acquire: load_script(conn, NONFAIR_ACQUIRE_LUA).await?,
        })
    }
}

async fn load_script(conn: &mut MultiplexedConnection, source: &str) -> Result<String, BoxError> {
    let sha = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(source)
        .query_async(conn)
        .await?;
    Ok(sha)
}

/// Permits the weighted contender's holders take.
pub const WEIGHT: u64 = 4;

/// redsem's acquire, and its release when the acquire returned an identifier
/// (without `COUNT`: a weighted holder gives back all its permits).
async fn redsem_pair(
    contender: Contender,
    conn: &mut MultiplexedConnection,
    keys: &Keys,
    limit: u64,
) -> Result<bool, BoxError> {
    let mut acquire = redis::cmd(contender.redsem_acquire());
    acquire.arg(&keys.holders).arg(limit).arg(LEASE_SECS);
    if contender == Contender::RedsemCount4 {
        acquire.arg("COUNT").arg(WEIGHT);
    }
    let id: Option<String> = acquire.query_async(conn).await?;
    let Some(id) = id else { return Ok(false) };
    let removed: i64 = redis::cmd("SEM.RELEASE")
        .arg(&keys.holders)
        .arg(&id)
        .query_async(conn)
        .await?;
    expect_released(contender, removed)?;
    Ok(true)
}

/// The fair recipe as a client runs it: one transaction to clean up and draw
/// a ticket, one to enter both sets and read the rank, then one to leave both
/// sets, which is the release after a success and the recipe's own undo after
/// a rank past the limit.
async fn recipe_multi_pair(
    conn: &mut MultiplexedConnection,
    keys: &Keys,
    limit: u64,
) -> Result<bool, BoxError> {
    let id = new_id();
    let now = now_ms();
    let (ticket,): (u64,) = redis::pipe()
        .atomic()
        .cmd("ZREMRANGEBYSCORE")
        .arg(&keys.holders)
        .arg("-inf")
        .arg(now.saturating_sub(LEASE_MS))
        .ignore()
        .cmd("ZINTERSTORE")
        .arg(&keys.owner)
        .arg(2)
        .arg(&keys.owner)
        .arg(&keys.holders)
        .arg("WEIGHTS")
        .arg(1)
        .arg(0)
        .ignore()
        .cmd("INCR")
        .arg(&keys.counter)
        .query_async(conn)
        .await?;
    let (rank,): (Option<u64>,) = redis::pipe()
        .atomic()
        .cmd("ZADD")
        .arg(&keys.holders)
        .arg(now)
        .arg(&id)
        .ignore()
        .cmd("ZADD")
        .arg(&keys.owner)
        .arg(ticket)
        .arg(&id)
        .ignore()
        .cmd("ZRANK")
        .arg(&keys.owner)
        .arg(&id)
        .query_async(conn)
        .await?;
    let acquired = rank.is_some_and(|rank| rank < limit);
    let (removed,): (i64,) = redis::pipe()
        .atomic()
        .cmd("ZREM")
        .arg(&keys.holders)
        .arg(&id)
        .cmd("ZREM")
        .arg(&keys.owner)
        .arg(&id)
        .ignore()
        .query_async(conn)
        .await?;
    if acquired {
        expect_released(Contender::RecipeMulti, removed)?;
    }
    Ok(acquired)
}

/// Every lease outlives the run, so a release that finds no holder means the
/// contender lost a place it had granted: a broken run, not a slow one.
fn expect_released(contender: Contender, removed: i64) -> Result<(), BoxError> {
    if removed == 1 {
        Ok(())
    } else {
        Err(format!(
            "{}: release found no holder for a place it had granted",
            contender.slug()
        )
        .into())
    }
}

/// A random identifier of the same shape redsem hands out, so the memory per
/// holder compares like with like.
fn new_id() -> String {
    Uuid::new_v4().to_string()
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_lease_constants_agree() {
        assert_eq!(LEASE_SECS.parse::<u64>().unwrap() * 1000, LEASE_MS);
    }

    #[test]
    fn slugs_parse_back() {
        for contender in Contender::ALL {
            assert_eq!(contender.slug().parse::<Contender>(), Ok(contender));
        }
        assert!("nope".parse::<Contender>().is_err());
    }
}
