//! The semaphore rules, over any [`Store`] of one semaphore's keys and with the time passed in,
//! so they are unit-tested here with an injected clock and no server.
//!
//! A holder is live while `now_ms < deadline`. Every writing rule first removes the expired
//! holders it finds (that is the recipe's ZREMRANGEBYSCORE), so the cost of a call is
//! O((1 + expired) log holders), never a walk over all holders. Each rule surveys the keys
//! (reads only) and returns any error before its first change, so an error changes nothing.
//!
//! Other clients may write the keys too. Our own commands keep every `<name>:owner` entry beside
//! a holder in `<name>`; so when the owner set has as many entries as there are live holders,
//! the keys are taken to be in step, and the semaphore is fair when it has any. Otherwise someone
//! else wrote one of them: the owner set is walked, its entries without a holder (leftovers) are
//! removed by the next write, and the semaphore is fair exactly when a live holder has an owner
//! entry. (A foreign write that leaves the counts equal goes unnoticed: the rules stay safe, the
//! limit holds and every ticket reply is a valid ticket, but the kind follows the owner set.)

use std::collections::HashSet;
use std::slice;

use crate::error::SemError;
use crate::types::{ticket_from_score, Kind, MAX_TICKET};

/// A holder identifier's bytes, however the store keeps them.
pub trait IdBytes {
    fn id_bytes(&self) -> &[u8];
}

/// One semaphore's keys, as the rules see them. Mutations apply at once; a store over Redis keys
/// also replicates each effect with its absolute values.
pub trait Store {
    /// A holder identifier as the store keeps it.
    type Id: IdBytes;

    /// Members of `<name>`, live or expired but not yet removed.
    fn holder_count(&self) -> u64;
    /// Members of `<name>:owner`.
    fn owner_count(&self) -> u64;
    /// `id`'s deadline, if it is a member of `<name>`.
    fn deadline(&self, id: &Self::Id) -> Option<i64>;
    /// `id`'s score in `<name>:owner`, whatever another client may have written there.
    fn owner_score(&self, id: &Self::Id) -> Option<f64>;
    /// Members of `<name>` whose deadline is at or before `now_ms`, soonest first.
    fn expired(&self, now_ms: i64) -> Vec<Self::Id>;
    /// The last ticket handed out; `None` when `<name>:counter` does not exist.
    fn counter(&self) -> Result<Option<u64>, SemError>;
    /// Live members of `<name>`, soonest deadline first.
    fn live_by_deadline(&self, now_ms: i64) -> Vec<(Self::Id, i64)>;
    /// Members of `<name>:owner`, lowest score first.
    fn owners_by_score(&self) -> Vec<(Self::Id, f64)>;

    /// Sets `id`'s deadline, adding `id` unless `Put::IfHeld`. One lookup answers both "is it
    /// a holder?" and "write it".
    fn put_holder(&mut self, id: &Self::Id, deadline_ms: i64, put: Put) -> PutOutcome;
    fn put_owner(&mut self, id: &Self::Id, ticket: u64);
    fn set_counter(&mut self, ticket: u64);
    /// Removes `ids` from `<name>` and from `<name>:owner`, wherever they are present, as one
    /// step per key. Returns how many were in `<name>`.
    fn remove(&mut self, ids: &[Self::Id]) -> usize;
    /// Removes `ids` from `<name>:owner` only.
    fn remove_owners(&mut self, ids: &[Self::Id]);
    /// Deletes `<name>:owner`.
    fn clear_owners(&mut self);
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Put {
    /// Add `id`, or move its deadline if it is already a holder.
    Upsert,
    /// Only move the deadline of an existing holder.
    IfHeld,
    /// Only add `id` if it is not a holder.
    IfNew,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutOutcome {
    Added,
    Updated,
    /// Nothing changed: `Put::IfHeld` and `id` was not a holder, or `Put::IfNew` and it was.
    NotHeld,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AcquireRequest {
    pub kind: Kind,
    pub limit: u64,
    pub lease_ms: i64,
    /// How far the counter jumps before this grant's ticket, so that no ticket repeats one a
    /// failed primary handed out but never replicated (see `fencing.rs`); usually 0.
    pub ticket_margin: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acquired {
    /// `renewed`: the identifier already held a live permit; only its deadline moved.
    Granted {
        ticket: Option<u64>,
        renewed: bool,
    },
    Full,
}

/// What a survey found in `<name>:owner` that belongs to no holder of `<name>`.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Leftovers<Id> {
    None,
    /// No live holder has an owner entry: the whole set goes.
    All,
    Some(Vec<Id>),
}

/// The state of a semaphore at `now`, read without changing anything.
struct Survey<Id> {
    expired: Vec<Id>,
    live: u64,
    /// The kind of the live holders; `None` when there are none.
    kind: Option<Kind>,
    leftovers: Leftovers<Id>,
}

fn survey<S: Store>(store: &S, now_ms: i64) -> Survey<S::Id> {
    let expired = store.expired(now_ms);
    let live = store.holder_count().saturating_sub(expired.len() as u64);
    let owners = store.owner_count();
    let (kind, leftovers) = if owners == 0 {
        ((live > 0).then_some(Kind::Plain), Leftovers::None)
    } else if live == 0 {
        (None, Leftovers::All)
    } else {
        let expired_owners = expired
            .iter()
            .filter(|id| store.owner_score(id).is_some())
            .count() as u64;
        if owners - expired_owners == live {
            (Some(Kind::Fair), Leftovers::None)
        } else {
            // Another client wrote one of the keys: find the owner entries with no holder.
            let mut owned_live = 0u64;
            let mut orphans = Vec::new();
            for (id, _) in store.owners_by_score() {
                match store.deadline(&id) {
                    None => orphans.push(id),
                    Some(deadline) if deadline > now_ms => owned_live += 1,
                    Some(_) => {} // expired: removed with the holder
                }
            }
            if owned_live == 0 {
                (Some(Kind::Plain), Leftovers::All)
            } else if orphans.is_empty() {
                (Some(Kind::Fair), Leftovers::None)
            } else {
                (Some(Kind::Fair), Leftovers::Some(orphans))
            }
        }
    };
    Survey {
        expired,
        live,
        kind,
        leftovers,
    }
}

/// The first change of every writing rule: expired holders and leftovers go.
fn prune<S: Store>(store: &mut S, survey: &Survey<S::Id>) {
    store.remove(&survey.expired);
    match &survey.leftovers {
        Leftovers::None => {}
        Leftovers::All => store.clear_owners(),
        Leftovers::Some(ids) => store.remove_owners(ids),
    }
}

/// SEM.ACQUIRE / SEM.ACQUIREFAIR: grants `id` a permit when fewer than `limit` holders are live.
pub fn acquire<S: Store>(
    store: &mut S,
    now_ms: i64,
    id: &S::Id,
    request: &AcquireRequest,
) -> Result<Acquired, SemError> {
    let survey = survey(store, now_ms);
    if let Some(held) = survey.kind.filter(|&held| held != request.kind) {
        return Err(SemError::KindMismatch { held });
    }
    let room = survey.live < request.limit;
    let deadline = now_ms + request.lease_ms;
    match request.kind {
        Kind::Plain => {
            prune(store, &survey);
            // A full semaphore still renews a holder that retries with its identifier.
            let put = if room { Put::Upsert } else { Put::IfHeld };
            Ok(match store.put_holder(id, deadline, put) {
                PutOutcome::NotHeld => Acquired::Full,
                outcome => Acquired::Granted {
                    ticket: None,
                    renewed: outcome == PutOutcome::Updated,
                },
            })
        }
        Kind::Fair => {
            // A ticket reply is always a valid ticket and a counter error changes nothing, so
            // renewal or new grant is settled before any other change. With room, the counter is
            // checked first and one ZADD NX both tells them apart and makes the grant.
            if room {
                let ticket = next_ticket(store.counter()?.unwrap_or(0), request.ticket_margin)?;
                let expired = survey.expired.iter().any(|e| e.id_bytes() == id.id_bytes());
                if expired || store.put_holder(id, deadline, Put::IfNew) == PutOutcome::Added {
                    prune(store, &survey);
                    if expired {
                        store.put_holder(id, deadline, Put::Upsert);
                    }
                    store.set_counter(ticket);
                    store.put_owner(id, ticket);
                    return Ok(Acquired::Granted {
                        ticket: Some(ticket),
                        renewed: false,
                    });
                }
            } else if store.deadline(id).is_none_or(|d| d <= now_ms) {
                prune(store, &survey);
                return Ok(Acquired::Full);
            }
            // `id` holds a live permit.
            let ticket = store
                .owner_score(id)
                .and_then(ticket_from_score)
                .ok_or(SemError::InvalidTicket)?;
            prune(store, &survey);
            store.put_holder(id, deadline, Put::IfHeld);
            Ok(Acquired::Granted {
                ticket: Some(ticket),
                renewed: true,
            })
        }
    }
}

/// SEM.ACQUIRE / SEM.ACQUIREFAIR while others wait for the semaphore (see `queue.rs`): only a
/// renewal happens now. `Ok(None)` when `id` holds no live permit, and then nothing changed.
pub fn renew<S: Store>(
    store: &mut S,
    now_ms: i64,
    id: &S::Id,
    request: &AcquireRequest,
) -> Result<Option<Acquired>, SemError> {
    let survey = survey(store, now_ms);
    if let Some(held) = survey.kind.filter(|&held| held != request.kind) {
        return Err(SemError::KindMismatch { held });
    }
    if store.deadline(id).is_none_or(|d| d <= now_ms) {
        return Ok(None);
    }
    let ticket = match request.kind {
        Kind::Plain => None,
        Kind::Fair => Some(
            store
                .owner_score(id)
                .and_then(ticket_from_score)
                .ok_or(SemError::InvalidTicket)?,
        ),
    };
    prune(store, &survey);
    store.put_holder(id, now_ms + request.lease_ms, Put::IfHeld);
    Ok(Some(Acquired::Granted {
        ticket,
        renewed: true,
    }))
}

/// SEM.REFRESH: moves a live holder's deadline to `now + lease`. A holder that had expired has
/// lost its permit (another may have been granted it) and gets `false`.
pub fn refresh<S: Store>(store: &mut S, now_ms: i64, id: &S::Id, lease_ms: i64) -> bool {
    let survey = survey(store, now_ms);
    prune(store, &survey);
    match store.put_holder(id, now_ms + lease_ms, Put::IfHeld) {
        PutOutcome::Updated => true,
        PutOutcome::Added | PutOutcome::NotHeld => {
            store.remove(slice::from_ref(id));
            false
        }
    }
}

/// SEM.RELEASE: gives a live permit back. An expired holder gets `false`: its critical section
/// may have overlapped another holder's, which its caller should know.
pub fn release<S: Store>(store: &mut S, now_ms: i64, id: &S::Id) -> bool {
    let survey = survey(store, now_ms);
    // An expired `id` goes with the others, so what is left of it here was live.
    prune(store, &survey);
    store.remove(slice::from_ref(id)) == 1
}

/// SEM.GET: live holders, without removing anything (it runs on read-only replicas too).
pub fn live_count<S: Store>(store: &S, now_ms: i64) -> u64 {
    store
        .holder_count()
        .saturating_sub(store.expired(now_ms).len() as u64)
}

/// One live holder as SEM.GET JSON shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HolderView<Id> {
    pub id: Id,
    pub ms_left: i64,
    pub ticket: Option<u64>,
}

/// SEM.GET JSON: the semaphore's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot<Id> {
    pub fair: bool,
    pub counter: Option<u64>,
    /// Live holders in grant order: fair ones by ticket; plain ones, which keep no grant
    /// record, by deadline (after the fair ones, should another client have mixed them).
    pub holders: Vec<HolderView<Id>>,
}

/// SEM.GET JSON, without changing anything.
pub fn snapshot<S: Store>(store: &S, now_ms: i64) -> Result<Snapshot<S::Id>, SemError> {
    let fair = survey(store, now_ms).kind == Some(Kind::Fair);
    let counter = store.counter()?;
    let mut holders = Vec::new();
    let mut listed = HashSet::new();
    if fair {
        for (id, score) in store.owners_by_score() {
            let Some(deadline) = store.deadline(&id).filter(|&d| d > now_ms) else {
                continue; // a leftover, or expired
            };
            let ticket = ticket_from_score(score).ok_or(SemError::InvalidTicket)?;
            listed.insert(id.id_bytes().to_vec());
            holders.push(HolderView {
                id,
                ms_left: deadline - now_ms,
                ticket: Some(ticket),
            });
        }
    }
    for (id, deadline) in store.live_by_deadline(now_ms) {
        if !listed.contains(id.id_bytes()) {
            holders.push(HolderView {
                id,
                ms_left: deadline.saturating_sub(now_ms),
                ticket: None,
            });
        }
    }
    Ok(Snapshot {
        fair,
        counter,
        holders,
    })
}

/// The ticket after `counter`, `margin` further on.
fn next_ticket(counter: u64, margin: u64) -> Result<u64, SemError> {
    counter
        .checked_add(margin)
        .and_then(|c| c.checked_add(1))
        .filter(|&ticket| ticket <= MAX_TICKET)
        .ok_or(SemError::CounterExhausted)
}

#[cfg(test)]
mod tests;
