//! `SEM.GET`.

use redis_module::{Context, RedisString, RedisValue};
use serde_json::{json, Value};

use super::call::Call;
use crate::error::SemError;
use crate::semaphore::Store;
use crate::semaphore::{self, Snapshot};
use crate::server::key::Access;
use crate::server::now_ms;
use crate::store::RedisStore;
use crate::waiting;

/// `SEM.GET name [JSON]`
pub fn get(ctx: &Context, call: &Call) -> Result<RedisValue, SemError> {
    let json = match call.options() {
        [] => false,
        [option] if option.as_slice().eq_ignore_ascii_case(b"JSON") => true,
        _ => return Err(SemError::Syntax),
    };
    let keys = call.keys();
    let store = RedisStore::open(ctx, &keys, Access::Read)?;
    let now = now_ms();
    if json {
        let snapshot = semaphore::snapshot(&store, now)?;
        let stored_limit = store.stored_limit()?;
        let line = waiting::line(&call.sem(ctx), now);
        Ok(RedisValue::BulkString(
            snapshot_json(keys.name.as_slice(), &snapshot, stored_limit, line).to_string(),
        ))
    } else {
        Ok(RedisValue::Integer(semaphore::in_use(&store, now)? as i64))
    }
}

/// SEM.GET JSON's document. Identifiers that are not UTF-8 are shown with U+FFFD.
fn snapshot_json(
    name: &[u8],
    snapshot: &Snapshot<RedisString>,
    stored_limit: Option<u64>,
    line: waiting::Line,
) -> Value {
    let holders: Vec<Value> = snapshot
        .holders
        .iter()
        .map(|holder| {
            json!({
                "id": String::from_utf8_lossy(holder.id.as_slice()),
                "ms_left": holder.ms_left,
                "ticket": holder.ticket,
                "permits": holder.permits,
            })
        })
        .collect();
    json!({
        "name": String::from_utf8_lossy(name),
        "fair": snapshot.fair,
        "counter": snapshot.counter,
        "in_use": snapshot.in_use,
        "holders": holders,
        "stored_limit": stored_limit,
        "limit_in_force": stored_limit.is_some(),
        "waiters": line.waiters,
        "longest_wait_ms": line.longest_wait_ms,
        "waiter_ages_ms": line.ages_ms,
        "waiting_for_empty": line.waiting_for_empty,
    })
}
