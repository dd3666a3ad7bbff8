//! One thin handler per SEM.* command: parse, open the keys, apply the rule, reply. The store
//! replicates each change as it makes it.

use std::panic::{catch_unwind, AssertUnwindSafe};

use redis_module::{raw, Context, ContextFlags, RedisResult, RedisString, RedisValue, Status};

use crate::args::{non_empty, parse_lease_ms, parse_limit};
use crate::error::SemError;
use crate::keys::has_hash_tag;
use crate::semaphore::{self, AcquireRequest, Acquired, Kind};
use crate::store::{Access, RedisStore};

/// Refuses to load into a server that lacks a module API function the commands call, instead of
/// failing later inside a command.
pub fn check_server_api(ctx: &Context, _args: &[RedisString]) -> Status {
    macro_rules! presence {
        ($($function:ident),* $(,)?) => {
            // SAFETY: copies (not references) of the pointers the module API filled in at load.
            [$((stringify!($function), unsafe { raw::$function }.is_some())),*]
        };
    }
    let required = presence!(
        RedisModule_OpenKey,
        RedisModule_CloseKey,
        RedisModule_KeyType,
        RedisModule_ValueLength,
        RedisModule_ZsetAdd,
        RedisModule_ZsetRem,
        RedisModule_ZsetScore,
        RedisModule_ZsetFirstInScoreRange,
        RedisModule_ZsetLastInScoreRange,
        RedisModule_ZsetRangeCurrentElement,
        RedisModule_ZsetRangeNext,
        RedisModule_ZsetRangeStop,
        RedisModule_GetAbsExpire,
        RedisModule_SetAbsExpire,
        RedisModule_StringDMA,
        RedisModule_StringTruncate,
        RedisModule_FreeString,
        RedisModule_Replicate,
        RedisModule_NotifyKeyspaceEvent,
        RedisModule_Milliseconds,
    );
    let missing: Vec<&str> = required
        .iter()
        .filter(|(_, present)| !present)
        .map(|(name, _)| *name)
        .collect();
    if missing.is_empty() {
        return Status::Ok;
    }
    ctx.log_warning(&format!(
        "redsem needs Redis 7.0 or later; this server lacks {}",
        missing.join(", ")
    ));
    Status::Err
}

/// `SEM.ACQUIRE name limit lease [ID identifier]`
pub fn acquire(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    guarded(|| acquire_kind(ctx, args, Kind::Plain))
}

/// `SEM.ACQUIREFAIR name limit lease [ID identifier] [WITHTICKET]`
pub fn acquire_fair(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    guarded(|| acquire_kind(ctx, args, Kind::Fair))
}

/// `SEM.REFRESH name identifier lease`
pub fn refresh(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    guarded(|| {
        let [_, name, id, lease] = exact_args(args, "sem.refresh")?;
        let name = semaphore_name(ctx, name)?;
        let id = identifier(id)?;
        let lease_ms = parse_lease_ms(lease.as_slice())?;
        let mut store = RedisStore::open(ctx, &name, Access::Write, false)?;
        let refreshed = semaphore::refresh(&mut store, now_ms(), &id, lease_ms);
        store.settle_expiry();
        Ok(RedisValue::Integer(refreshed.into()))
    })
}

/// `SEM.RELEASE name identifier`
pub fn release(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    guarded(|| {
        let [_, name, id] = exact_args(args, "sem.release")?;
        let name = semaphore_name(ctx, name)?;
        let id = identifier(id)?;
        let mut store = RedisStore::open(ctx, &name, Access::Write, false)?;
        let released = semaphore::release(&mut store, now_ms(), &id);
        store.settle_expiry();
        Ok(RedisValue::Integer(released.into()))
    })
}

/// `SEM.GET name [JSON]`
pub fn get(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    guarded(|| {
        if !(2..=3).contains(&args.len()) {
            return Err(SemError::Arity("sem.get"));
        }
        let mut args = args.into_iter().skip(1);
        let name = semaphore_name(ctx, args.next().ok_or(SemError::Syntax)?)?;
        let json = match args.next() {
            None => false,
            Some(option) if option.as_slice().eq_ignore_ascii_case(b"JSON") => true,
            Some(_) => return Err(SemError::Syntax),
        };
        let store = RedisStore::open(ctx, &name, Access::Read, json)?;
        let now = now_ms();
        if json {
            let doc = semaphore::snapshot(&store, name.as_slice(), now)?;
            Ok(RedisValue::BulkString(doc.to_string()))
        } else {
            Ok(RedisValue::Integer(
                semaphore::live_count(&store, now) as i64
            ))
        }
    })
}

fn acquire_kind(ctx: &Context, args: Vec<RedisString>, kind: Kind) -> Result<RedisValue, SemError> {
    let command = match kind {
        Kind::Plain => "sem.acquire",
        Kind::Fair => "sem.acquirefair",
    };
    if args.len() < 4 {
        return Err(SemError::Arity(command));
    }
    let mut args = args.into_iter().skip(1);
    let mut next = || args.next().ok_or(SemError::Syntax);
    let name = semaphore_name(ctx, next()?)?;
    let limit = parse_limit(next()?.as_slice())?;
    let lease_ms = parse_lease_ms(next()?.as_slice())?;
    let mut given_id = None;
    let mut with_ticket = false;
    while let Ok(option) = next() {
        let option = option.as_slice();
        if option.eq_ignore_ascii_case(b"ID") && given_id.is_none() {
            given_id = Some(identifier(next()?)?);
        } else if option.eq_ignore_ascii_case(b"WITHTICKET") && kind == Kind::Fair && !with_ticket {
            with_ticket = true;
        } else {
            return Err(SemError::Syntax);
        }
    }

    let mut store = RedisStore::open(ctx, &name, Access::Write, kind == Kind::Fair)?;
    let id = given_id.unwrap_or_else(|| store.id(new_identifier(&mut [0; 36])));
    let request = AcquireRequest {
        kind,
        limit,
        lease_ms,
    };
    let outcome = semaphore::acquire(&mut store, now_ms(), &id, &request)?;
    store.settle_expiry();
    Ok(match outcome {
        Acquired::Full => RedisValue::Null,
        Acquired::Granted { ticket, .. } if with_ticket => RedisValue::Array(vec![
            RedisValue::BulkRedisString(id),
            ticket.map_or(RedisValue::Null, |t| RedisValue::Integer(t as i64)),
        ]),
        Acquired::Granted { .. } => RedisValue::BulkRedisString(id),
    })
}

/// The arguments of a command with a fixed arity, command name included.
fn exact_args<const N: usize>(
    args: Vec<RedisString>,
    command: &'static str,
) -> Result<[RedisString; N], SemError> {
    args.try_into().map_err(|_| SemError::Arity(command))
}

fn semaphore_name(ctx: &Context, name: RedisString) -> Result<RedisString, SemError> {
    non_empty(name.as_slice(), SemError::EmptyName)?;
    if ctx.get_flags().contains(ContextFlags::CLUSTER) && !has_hash_tag(name.as_slice()) {
        return Err(SemError::NeedsHashTag);
    }
    Ok(name)
}

fn identifier(id: RedisString) -> Result<RedisString, SemError> {
    non_empty(id.as_slice(), SemError::EmptyIdentifier)?;
    Ok(id)
}

/// A random UUID v4 in its 36-character hyphenated form, written into `buffer`.
fn new_identifier(buffer: &mut [u8; 36]) -> &[u8] {
    uuid::Uuid::new_v4()
        .hyphenated()
        .encode_lower(buffer)
        .as_bytes()
}

/// The server's clock in Unix milliseconds: the one clock every deadline is measured by. Where
/// Redis offers it (7.2+), the time it cached for the current command, as its own commands use.
fn now_ms() -> i64 {
    // SAFETY: plain reads of the server clock, resolved when the module loaded.
    unsafe {
        if let Some(cached_us) = raw::RedisModule_CachedMicroseconds {
            return cached_us() / 1000;
        }
        raw::RedisModule_Milliseconds.unwrap()()
    }
}

/// Runs a handler; a panic (a bug) becomes an error reply instead of killing redis-server.
fn guarded(handler: impl FnOnce() -> Result<RedisValue, SemError>) -> RedisResult {
    match catch_unwind(AssertUnwindSafe(handler)) {
        Ok(result) => result.map_err(Into::into),
        Err(_) => Err(SemError::Internal.into()),
    }
}
