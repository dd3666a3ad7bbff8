//! `SEM.ACQUIRE` and `SEM.ACQUIREFAIR`.

use redis_module::{Context, RedisValue};

use super::call::{new_identifier, Call};
use crate::args::{parse_lease_ms, parse_limit};
use crate::config;
use crate::error::SemError;
use crate::grant::{self, Try};
use crate::queue::{arrival, Wants};
use crate::request::{parse_options, Ask, Form};
use crate::server::block::caller;
use crate::server::now_ms;
use crate::state;
use crate::stats::COUNTERS;
use crate::types::Kind;
use crate::waiting;
use crate::waiting::block::wait_or_refuse;
use crate::write::{Step, Write};

/// `SEM.ACQUIRE name limit lease [ID identifier] [COUNT n] [WAIT seconds] [BOUND]` and
/// `SEM.ACQUIREFAIR name limit lease [ID identifier] [COUNT n] [WITHTICKET] [WAIT seconds]
/// [BOUND]`
pub fn acquire<'a>(
    ctx: &Context,
    step: &Step<'a>,
    call: &Call<'a>,
    kind: Kind,
) -> Result<RedisValue, SemError> {
    let [limit, lease, options @ ..] = call.options() else {
        return Err(SemError::Arity(call.command.name()));
    };
    let limit = parse_limit(limit.as_slice())?;
    let lease_ms = parse_lease_ms(lease.as_slice(), config::max_lease_ms())?;
    let options = parse_options(Form::Single(kind), limit, options, |a| a.as_slice())?;
    let caller = caller(ctx, options.bound || options.wait_ms.is_some());
    if options.bound && caller.in_script {
        return Err(SemError::BoundInScript);
    }
    let mut write = Write::open(step, &call.keys())?;
    let made;
    let id = match options.id {
        Some(id) => &**id,
        None => {
            made = write.store().id(new_identifier(&mut [0; 36]));
            &made
        }
    };
    let mut ask = Ask::new(&options, limit, lease_ms, options.count, Vec::new());
    let now = now_ms();
    // Inside MULTI, a script, or for a client that denies blocking, WAIT is no wait.
    let wait_ms = options.wait_ms.filter(|_| caller.may_block);
    let queued = if state::queued_anywhere() {
        state::queued(&write.key())
    } else {
        0
    };
    let how = if arrival(kind, wait_ms.is_some(), queued).may_acquire() {
        Try::Acquire
    } else {
        Try::RenewOnly
    };
    let bind_to = ask.bind_to(caller.client);
    let sem = write.sem();
    let Some(granted) = grant::try_grant(write.store_mut(), sem, &ask, id, now, how, bind_to)?
    else {
        let reply = wait_or_refuse(ctx, caller.client, wait_ms, now, &COUNTERS.refused, || {
            ask.holder = id.as_slice().to_vec();
            let line = vec![(write.key(), write.store().next_deadline(now))];
            (Wants::Permits(ask), line)
        })?;
        write.commit();
        return Ok(reply);
    };
    if ask.bound {
        waiting::follow_bound(ctx);
    }
    write.commit();
    let id = RedisValue::BulkRedisString(id.safe_clone(ctx));
    Ok(grant::reply(id, [granted.ticket], false, ask.with_ticket))
}
