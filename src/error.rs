//! Every error reply redsem sends, built in one place. Each message starts with an error code
//! (`ERR`, `WRONGTYPE`, `NOPERM`, or for a wait the server ends, `READONLY` and `TRYAGAIN` as Redis itself
//! would answer) so clients and `INFO errorstats` classify it correctly.

use std::fmt;

use redis_module::RedisError;

use crate::keys::MAX_SET;
use crate::types::{Kind, MAX_LEASE_MS, MAX_LIMIT};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SemError {
    /// An unknown option, a repeated option, or an option missing its value.
    Syntax,
    /// The wrong number of arguments for `command` (lower case, as Redis names it).
    Arity(&'static str),
    InvalidLimit,
    /// The limit of `SEM.LIMIT` (0 allowed), or `<name>:limit` read back, is not one.
    InvalidStoredLimit,
    /// `<name>:limit` holds something other than a limit (another client wrote it).
    StoredLimitCorrupt,
    /// The lease is malformed, or longer than `max_ms` (`sem.max-lease`).
    InvalidLease {
        max_ms: i64,
    },
    InvalidWait,
    /// The timeout of `SEM.WAITEMPTY` is malformed or too long.
    InvalidTimeout,
    /// `COUNT` of an acquire outside 1..=limit.
    InvalidCount,
    /// `COUNT` of a release outside 1..=4294967295.
    InvalidReleaseCount,
    /// `COUNT` of an acquire by a live holder that holds another number of permits.
    CountMismatch {
        held: u64,
    },
    /// `COUNT` of a release larger than what the holder holds.
    CountTooLarge {
        held: u64,
    },
    /// `<name>:permits` holds something other than counts (another client wrote it).
    PermitsCorrupt,
    EmptyName,
    EmptyIdentifier,
    /// `numsems` of a call on a set is not a number from 1 to 64.
    InvalidNumsems,
    /// A call on a set names a semaphore twice, or one whose keys are another's.
    NamedTwice,
    /// One of the semaphore's keys holds another type.
    WrongType,
    /// The server refused to block this caller (Valkey 9 answers NULL for a client that is not
    /// a normal connection or is blocked already): it cannot wait.
    CannotWait,
    /// The caller's ACL user may not use one of the derived keys the module checked itself.
    NoPermission,
    /// A call in its short form in Redis Cluster where no command filter named its derived
    /// keys to the server: it must name them (the long form).
    NeedsKeys,
    /// `<name>:counter` exists but is not an integer from 0 to 2^53.
    CounterNotInteger,
    /// The next ticket would not fit a sorted-set score exactly.
    CounterExhausted,
    /// A live fair holder's entry in `<name>:owner` is missing or not a ticket (another client
    /// wrote it), so there is no valid ticket to reply with.
    InvalidTicket,
    /// The semaphore has live holders of `held`; the caller asked for the other kind.
    KindMismatch {
        held: Kind,
    },
    /// In Redis Cluster, a name without a hash tag would spread its keys over several slots.
    NeedsHashTag,
    /// Waiting would pass `sem.max-waiters-per-semaphore` (`per_semaphore`) or `sem.max-waiters`.
    TooManyWaiters {
        per_semaphore: bool,
        max: i64,
    },
    /// Waiting clients would take more memory than `sem.waiters-maxmemory-percent` of
    /// `maxmemory` (`maxmemory`) or `sem.max-waiters-memory` allow: `limit` bytes.
    WaitersMemory {
        limit: u64,
        maxmemory: bool,
    },
    /// One more waiting client would take the server past `maxmemory`.
    NoMemoryToWait,
    /// BOUND from a script: the script's connection is not the caller's, and never closes.
    BoundInScript,
    /// `SEM.WAITEMPTY` on a replica, whose semaphores only change by its primary's hand.
    ReplicaCannotWait,
    /// The server became a replica while the command waited: it grants nothing any more.
    BecameReplica,
    /// In Redis Cluster, the semaphore's slot left this node (or is leaving) while the command
    /// waited; the client retries where the slot is now.
    SlotMoved,
    /// A bug caught before it could reach redis-server.
    Internal,
}

impl fmt::Display for SemError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SemError::Syntax => f.write_str("ERR syntax error"),
            SemError::Arity(command) => {
                write!(f, "ERR wrong number of arguments for '{command}' command")
            }
            SemError::InvalidLimit => {
                write!(f, "ERR limit must be an integer from 1 to {MAX_LIMIT}")
            }
            SemError::InvalidStoredLimit => write!(
                f,
                "ERR limit must be an integer from 0 (pause) to {MAX_LIMIT}, or CLEAR"
            ),
            SemError::StoredLimitCorrupt => write!(
                f,
                "ERR the semaphore's limit key does not hold an integer from 0 to {MAX_LIMIT}"
            ),
            SemError::InvalidLease { max_ms } => {
                let max = *max_ms as f64 / 1000.0;
                write!(
                    f,
                    "ERR lease must be a number of seconds greater than 0 and at most {max}, \
                     with at most 3 decimals"
                )
            }
            SemError::InvalidWait => write!(
                f,
                "ERR WAIT must be a number of seconds from 0 (no limit) to {}, \
                 with at most 3 decimals",
                MAX_LEASE_MS / 1000
            ),
            SemError::InvalidTimeout => write!(
                f,
                "ERR timeout must be a number of seconds from 0 (no limit) to {}, \
                 with at most 3 decimals",
                MAX_LEASE_MS / 1000
            ),
            SemError::InvalidCount => {
                f.write_str("ERR COUNT must be an integer from 1 to the limit (at most 4294967295)")
            }
            SemError::InvalidReleaseCount => {
                write!(f, "ERR COUNT must be an integer from 1 to {MAX_LIMIT}")
            }
            SemError::CountMismatch { held } => write!(
                f,
                "ERR the holder holds {held} permits: renew with that COUNT, or none"
            ),
            SemError::CountTooLarge { held } => write!(
                f,
                "ERR COUNT is more than the {held} permits the holder holds"
            ),
            SemError::PermitsCorrupt => f.write_str(
                "ERR the semaphore's permits key holds a value that is not a count of permits",
            ),
            SemError::EmptyName => f.write_str("ERR semaphore name must not be empty"),
            SemError::EmptyIdentifier => f.write_str("ERR identifier must not be empty"),
            SemError::InvalidNumsems => write!(
                f,
                "ERR numsems must be an integer from 1 to {MAX_SET}, followed by that many \
                 semaphores"
            ),
            SemError::NamedTwice => f.write_str(
                "ERR a semaphore is named twice, or one name is another's key \
                 (<name>:owner, <name>:counter, <name>:permits, <name>:limit)",
            ),
            SemError::CannotWait => {
                f.write_str("ERR the server cannot block this client: call without WAIT")
            }
            SemError::NoPermission => f.write_str(
                "NOPERM this user has no permissions to access one of the keys used as arguments",
            ),
            SemError::NeedsKeys => f.write_str(
                "ERR in Redis Cluster this server takes the long form, which names every key: \
                 <name> <name>:owner <name>:counter <name>:permits <name>:limit, then the \
                 arguments (SEM.ACQUIREALL, SEM.RELEASEALL, SEM.REFRESHALL: each name's four \
                 keys after the arguments)",
            ),
            SemError::WrongType => {
                f.write_str("WRONGTYPE Operation against a key holding the wrong kind of value")
            }
            SemError::CounterNotInteger => f.write_str(
                "ERR the semaphore's counter key does not hold an integer from 0 to \
                 9007199254740992 (2^53)",
            ),
            SemError::CounterExhausted => f.write_str(
                "ERR the semaphore's counter reached 2^53: no ticket is left that a sorted-set \
                 score holds exactly",
            ),
            SemError::InvalidTicket => f.write_str(
                "ERR the holder has no valid ticket in the semaphore's owner set \
                 (a whole number from 1 to 2^53)",
            ),
            SemError::KindMismatch { held: Kind::Fair } => f.write_str(
                "ERR the semaphore has live fair holders: use SEM.ACQUIREFAIR until they are gone",
            ),
            SemError::KindMismatch { held: Kind::Plain } => f.write_str(
                "ERR the semaphore has live plain holders: use SEM.ACQUIRE until they are gone",
            ),
            SemError::NeedsHashTag => f.write_str(
                "ERR in Redis Cluster the semaphore name needs a hash tag, e.g. {name}, \
                 so that name, name:owner and name:counter share one slot",
            ),
            SemError::TooManyWaiters {
                per_semaphore: true,
                max,
            } => write!(
                f,
                "ERR {max} clients already wait for this semaphore (sem.max-waiters-per-semaphore)"
            ),
            SemError::TooManyWaiters {
                per_semaphore: false,
                max,
            } => write!(
                f,
                "ERR {max} clients already wait for permits on this server (sem.max-waiters)"
            ),
            SemError::WaitersMemory {
                limit,
                maxmemory: true,
            } => write!(
                f,
                "ERR waiting clients would take more than {limit} bytes \
                 (sem.waiters-maxmemory-percent of maxmemory): retry, or acquire without WAIT"
            ),
            SemError::WaitersMemory {
                limit,
                maxmemory: false,
            } => write!(
                f,
                "ERR waiting clients would take more than {limit} bytes \
                 (sem.max-waiters-memory): retry, or acquire without WAIT"
            ),
            SemError::NoMemoryToWait => f.write_str(
                "ERR no memory left below maxmemory for another waiting client: retry, or \
                 acquire without WAIT",
            ),
            SemError::BoundInScript => f.write_str(
                "ERR BOUND cannot be used from a script or function: its connection is not the \
                 client's",
            ),
            SemError::ReplicaCannotWait => f.write_str(
                "READONLY SEM.WAITEMPTY waits on the primary only: this server is a replica",
            ),
            SemError::BecameReplica => f.write_str(
                "READONLY the server became a replica while the command waited for a permit",
            ),
            SemError::SlotMoved => f.write_str(
                "TRYAGAIN the semaphore's slot is moving or moved to another node while the \
                 command waited for a permit",
            ),
            SemError::Internal => {
                f.write_str("ERR internal error in redsem (a bug: please report it)")
            }
        }
    }
}

impl From<SemError> for RedisError {
    fn from(err: SemError) -> Self {
        RedisError::String(err.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_message_starts_with_an_error_code() {
        let all = [
            SemError::Syntax,
            SemError::NoPermission,
            SemError::NeedsKeys,
            SemError::CannotWait,
            SemError::Arity("sem.get"),
            SemError::InvalidLimit,
            SemError::InvalidStoredLimit,
            SemError::StoredLimitCorrupt,
            SemError::InvalidLease { max_ms: 1000 },
            SemError::InvalidWait,
            SemError::InvalidTimeout,
            SemError::InvalidCount,
            SemError::InvalidReleaseCount,
            SemError::CountMismatch { held: 4 },
            SemError::CountTooLarge { held: 4 },
            SemError::PermitsCorrupt,
            SemError::EmptyName,
            SemError::EmptyIdentifier,
            SemError::InvalidNumsems,
            SemError::NamedTwice,
            SemError::WrongType,
            SemError::CounterNotInteger,
            SemError::CounterExhausted,
            SemError::InvalidTicket,
            SemError::KindMismatch { held: Kind::Fair },
            SemError::KindMismatch { held: Kind::Plain },
            SemError::NeedsHashTag,
            SemError::TooManyWaiters {
                per_semaphore: true,
                max: 1,
            },
            SemError::TooManyWaiters {
                per_semaphore: false,
                max: 1,
            },
            SemError::WaitersMemory {
                limit: 1,
                maxmemory: true,
            },
            SemError::WaitersMemory {
                limit: 1,
                maxmemory: false,
            },
            SemError::NoMemoryToWait,
            SemError::BoundInScript,
            SemError::ReplicaCannotWait,
            SemError::BecameReplica,
            SemError::SlotMoved,
            SemError::Internal,
        ];
        for err in all {
            let text = err.to_string();
            let code = text.split(' ').next().unwrap();
            assert!(
                ["ERR", "WRONGTYPE", "READONLY", "TRYAGAIN", "NOPERM"].contains(&code),
                "{text}"
            );
            assert!(!text.contains('\n') && !text.contains('\r'), "{text}");
        }
    }
}
