//! `SEM.LIMIT`.

use redis_module::{Context, RedisValue};

use super::call::Call;
use crate::args::parse_stored_limit;
use crate::error::SemError;
use crate::semaphore::Store;
use crate::server::key::Access;
use crate::stats::{self, COUNTERS};
use crate::store::RedisStore;
use crate::write::{Step, Write};

/// `SEM.LIMIT name [n | CLEAR]`: the operator's limit, which every acquire of `name` uses
/// instead of its own while it is stored (0 pauses the semaphore). A raised limit serves the
/// line at once; nobody loses a permit to a lowered one.
pub fn limit<'a>(ctx: &Context, step: &Step<'a>, call: &Call<'a>) -> Result<RedisValue, SemError> {
    let change = match call.options() {
        [] => None,
        [arg] if arg.as_slice().eq_ignore_ascii_case(b"CLEAR") => Some(None),
        [arg] => Some(Some(parse_stored_limit(arg.as_slice())?)),
        _ => return Err(SemError::Arity(call.command.name())),
    };
    let Some(limit) = change else {
        let store = RedisStore::open(ctx, &call.keys(), Access::Read)?;
        return Ok(match store.stored_limit()? {
            Some(limit) => RedisValue::Integer(limit as i64),
            None => RedisValue::Null,
        });
    };
    let mut write = Write::open(step, &call.keys())?;
    let had = write.store().stored_limit()?.is_some();
    // A limit set to what it was changes nothing, and ends nothing.
    if write.store_mut().set_stored_limit(limit)? {
        stats::count(&COUNTERS.limits_set);
        write.commit();
    }
    Ok(match limit {
        Some(_) => RedisValue::SimpleStringStatic("OK"),
        None => RedisValue::Integer(i64::from(had)),
    })
}
