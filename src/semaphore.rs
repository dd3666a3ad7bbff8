//! The semaphore rules, over any [`Store`] of one semaphore's keys and with the time passed in,
//! so they are unit-tested here with an injected clock and no server.
//!
//! A holder is live while `now_ms < deadline`. It holds one permit, or `n` with `COUNT n`; the
//! permits in use are the live holders plus the `n - 1` extra of each weighted one, kept as one
//! running total so that no rule sums over the holders. Every writing rule first removes the expired
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
use crate::fencing::next_ticket;
use crate::types::{ticket_from_score, Kind};

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
    /// Whether `<name>:permits` exists: some holder holds more than one permit.
    fn has_weights(&self) -> bool;
    /// The permits `id` holds: its field in `<name>:permits`, 1 without one.
    fn weight(&self, id: &Self::Id) -> Result<u64, SemError>;
    /// The permits held beyond one per holder: the `""` field of `<name>:permits`.
    fn extra(&self) -> Result<u64, SemError>;
    /// The limit an operator stored (`<name>:limit`), which acquires use instead of their own.
    fn stored_limit(&self) -> Result<Option<u64>, SemError>;

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
    /// Writes `<name>:permits` in one step: `set` holders' permits (a holder of 1 has no
    /// field), `removed` holders' fields gone, and the extra total.
    fn put_weights(&mut self, set: Option<(&Self::Id, u64)>, removed: &[&Self::Id], extra: u64);
    /// Deletes `<name>:permits`.
    fn clear_weights(&mut self);
    /// `count` expired holders were just removed (for counters and events).
    fn expired_removed(&mut self, _count: usize) {}
}

/// What the identifier of a refresh or a release was when the call came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holder {
    /// A live holder: it kept (refresh) or gave back (release) its permits.
    Live,
    /// Its lease had run out: it lost its permits.
    Expired,
    /// Not a holder at all.
    Absent,
}

impl Holder {
    /// The command's reply: 1 for a live holder, else 0.
    pub fn reply(self) -> i64 {
        i64::from(self == Holder::Live)
    }
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
    /// `COUNT n`: the permits asked for. `None`: 1 for a new holder, and a renewal keeps
    /// whatever the holder holds.
    pub count: Option<u64>,
    /// The lowest ticket a fair grant may hand out: this node's fencing floor, so that no
    /// ticket repeats one a lost primary handed out but never replicated (see `fencing.rs`).
    pub ticket_floor: u64,
}

impl AcquireRequest {
    fn permits(&self) -> u64 {
        self.count.unwrap_or(1)
    }
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

/// What the next write does to `<name>:permits`.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Weights {
    /// Nothing: no weighted holder expired (or there is none).
    Keep,
    /// No live holder is left: the key goes.
    Clear,
    /// Expired weighted holders (these positions in `expired`) lose their fields.
    Prune(Vec<usize>),
}

/// The state of a semaphore at `now`, read without changing anything.
struct Survey<Id> {
    expired: Vec<Id>,
    live: u64,
    /// Permits held beyond one per live holder.
    extra: u64,
    /// The kind of the live holders; `None` when there are none.
    kind: Option<Kind>,
    leftovers: Leftovers<Id>,
    weights: Weights,
}

impl<Id: IdBytes> Survey<Id> {
    /// Permits in use by live holders.
    fn in_use(&self) -> u64 {
        self.live.saturating_add(self.extra)
    }

    /// What `id` was, given that it is not a live holder.
    fn lost_or_absent(&self, id: &Id) -> Holder {
        if self.expired.iter().any(|e| e.id_bytes() == id.id_bytes()) {
            Holder::Expired
        } else {
            Holder::Absent
        }
    }
}

#[inline(always)]
fn survey<S: Store>(store: &S, now_ms: i64) -> Result<Survey<S::Id>, SemError> {
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
    let (extra, weights) = if !store.has_weights() {
        (0, Weights::Keep)
    } else if live == 0 {
        (0, Weights::Clear)
    } else {
        let mut extra = store.extra()?;
        let mut pruned = Vec::new();
        for (at, id) in expired.iter().enumerate() {
            let permits = store.weight(id)?;
            if permits > 1 {
                extra = extra.saturating_sub(permits - 1);
                pruned.push(at);
            }
        }
        let weights = if pruned.is_empty() {
            Weights::Keep
        } else {
            Weights::Prune(pruned)
        };
        (extra, weights)
    };
    Ok(Survey {
        expired,
        live,
        extra,
        kind,
        leftovers,
        weights,
    })
}

/// The first change of every writing rule: expired holders and leftovers go.
fn prune<S: Store>(store: &mut S, survey: &Survey<S::Id>) {
    store.remove(&survey.expired);
    if !survey.expired.is_empty() {
        store.expired_removed(survey.expired.len());
    }
    match &survey.leftovers {
        Leftovers::None => {}
        Leftovers::All => store.clear_owners(),
        Leftovers::Some(ids) => store.remove_owners(ids),
    }
    match &survey.weights {
        Weights::Keep => {}
        Weights::Clear => store.clear_weights(),
        Weights::Prune(at) => {
            let ids: Vec<&S::Id> = at.iter().map(|&i| &survey.expired[i]).collect();
            store.put_weights(None, &ids, survey.extra);
        }
    }
}

/// What an acquire does, decided from reads alone: [`plan_acquire`] finds every error the
/// acquire can answer before its first change, [`AcquirePlan::apply`] makes the changes, and
/// [`AcquirePlan::grants`] tells without a change whether they grant (the survey of one
/// semaphore of a set acquire, which takes all or none).
pub struct AcquirePlan<Id> {
    survey: Survey<Id>,
    now_ms: i64,
    request: AcquireRequest,
    step: AcquireStep,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AcquireStep {
    /// One plain permit, no COUNT: one write of the holder tells a renewal from a grant (an
    /// upsert while there is room; when full, a live holder's renewal only).
    PlainOne { room: bool },
    /// One fair permit, no COUNT, with room: one add-if-new tells a grant of `ticket` from a
    /// renewal; `expired`: the identifier's lease ran out, and it is granted anew.
    FairOne { ticket: u64, expired: bool },
    /// A live holder's renewal: its deadline moves, its permits and ticket stay.
    Renew { ticket: Option<u64> },
    /// A new grant of `permits`.
    Grant { ticket: Option<u64>, permits: u64 },
    /// No room, and not a live holder.
    Full,
}

/// SEM.ACQUIRE / SEM.ACQUIREFAIR: grants `id` the permits it asks for when they fit under
/// `limit` with those in use (see [`AcquirePlan`]).
pub fn acquire<S: Store>(
    store: &mut S,
    now_ms: i64,
    id: &S::Id,
    request: &AcquireRequest,
) -> Result<Acquired, SemError> {
    plan_acquire(store, now_ms, id, request)?.apply(store, id)
}

/// The plan of [`acquire`], changing nothing.
#[inline(always)]
pub fn plan_acquire<S: Store>(
    store: &S,
    now_ms: i64,
    id: &S::Id,
    request: &AcquireRequest,
) -> Result<AcquirePlan<S::Id>, SemError> {
    let survey = survey_for(store, now_ms, request)?;
    let permits = request.permits();
    let limit = effective_limit(store, request)?;
    let room = survey.in_use().saturating_add(permits) <= limit;
    // The common case takes one lookup: one permit, and no COUNT to compare with a renewal.
    let step = match (request.count, request.kind) {
        (None, Kind::Plain) => AcquireStep::PlainOne { room },
        (None, Kind::Fair) if room => AcquireStep::FairOne {
            // The counter is checked first; the add-if-new then tells a grant from a renewal.
            ticket: next_ticket(store.counter()?, request.ticket_floor, now_ms)?,
            expired: survey.expired.iter().any(|e| e.id_bytes() == id.id_bytes()),
        },
        _ if is_live(store, id, now_ms) => AcquireStep::Renew {
            ticket: renewal(store, id, request)?,
        },
        _ if !room => AcquireStep::Full,
        _ => AcquireStep::Grant {
            ticket: match request.kind {
                Kind::Fair => Some(next_ticket(store.counter()?, request.ticket_floor, now_ms)?),
                Kind::Plain => None,
            },
            permits,
        },
    };
    Ok(AcquirePlan {
        survey,
        now_ms,
        request: *request,
        step,
    })
}

impl<Id: IdBytes> AcquirePlan<Id> {
    /// The ticket a new fair grant of this plan hands out (none when it renews or is full).
    pub fn new_ticket(&self) -> Option<u64> {
        match self.step {
            AcquireStep::FairOne { ticket, .. } => Some(ticket),
            AcquireStep::Grant { ticket, .. } => ticket,
            _ => None,
        }
    }

    /// Whether [`apply`](Self::apply) grants (a new grant that fits, or a renewal), changing
    /// nothing; an error is the one `apply` answers.
    pub fn grants<S: Store<Id = Id>>(&self, store: &S, id: &Id) -> Result<bool, SemError> {
        Ok(match self.step {
            AcquireStep::PlainOne { room } => room || is_live(store, id, self.now_ms),
            AcquireStep::FairOne { expired, .. } => {
                if !expired && is_live(store, id, self.now_ms) {
                    renewal(store, id, &self.request)?;
                }
                true
            }
            AcquireStep::Renew { .. } | AcquireStep::Grant { .. } => true,
            AcquireStep::Full => false,
        })
    }

    /// Makes the plan's changes, expired holders and leftovers removed first. An error (a
    /// renewal's, found by the add-if-new's answer) has changed nothing.
    #[inline(always)]
    pub fn apply<S: Store<Id = Id>>(self, store: &mut S, id: &Id) -> Result<Acquired, SemError> {
        let survey = &self.survey;
        let deadline = self.now_ms + self.request.lease_ms;
        match self.step {
            AcquireStep::PlainOne { room } => {
                prune(store, survey);
                let put = if room { Put::Upsert } else { Put::IfHeld };
                Ok(match store.put_holder(id, deadline, put) {
                    PutOutcome::NotHeld => Acquired::Full,
                    outcome => Acquired::Granted {
                        ticket: None,
                        renewed: outcome == PutOutcome::Updated,
                    },
                })
            }
            AcquireStep::FairOne { ticket, expired } => {
                if expired || store.put_holder(id, deadline, Put::IfNew) == PutOutcome::Added {
                    prune(store, survey);
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
                let ticket = renewal(store, id, &self.request)?;
                Ok(renewed(store, survey, id, deadline, ticket))
            }
            AcquireStep::Renew { ticket } => Ok(renewed(store, survey, id, deadline, ticket)),
            AcquireStep::Full => {
                prune(store, survey);
                Ok(Acquired::Full)
            }
            AcquireStep::Grant { ticket, permits } => {
                prune(store, survey);
                store.put_holder(id, deadline, Put::Upsert);
                if let Some(ticket) = ticket {
                    store.set_counter(ticket);
                    store.put_owner(id, ticket);
                }
                if permits > 1 {
                    store.put_weights(
                        Some((id, permits)),
                        &[],
                        survey.extra.saturating_add(permits - 1),
                    );
                }
                Ok(Acquired::Granted {
                    ticket,
                    renewed: false,
                })
            }
        }
    }
}

/// The survey of an acquire: a semaphore of the other kind is an error.
#[inline(always)]
fn survey_for<S: Store>(
    store: &S,
    now_ms: i64,
    request: &AcquireRequest,
) -> Result<Survey<S::Id>, SemError> {
    let survey = survey(store, now_ms)?;
    match survey.kind.filter(|&held| held != request.kind) {
        Some(held) => Err(SemError::KindMismatch { held }),
        None => Ok(survey),
    }
}

fn is_live<S: Store>(store: &S, id: &S::Id, now_ms: i64) -> bool {
    store.deadline(id).is_some_and(|d| d > now_ms)
}

/// The limit an acquire applies: the one an operator stored for the semaphore while there is
/// one (0 pauses it), else the caller's own. Renewals ignore it: nobody loses a permit.
pub fn effective_limit<S: Store>(store: &S, request: &AcquireRequest) -> Result<u64, SemError> {
    Ok(store.stored_limit()?.unwrap_or(request.limit))
}

/// What live holder `id`'s renewal answers: its ticket (fair). A COUNT other than what it
/// holds, or (fair) an owner entry that is not a ticket, is an error.
fn renewal<S: Store>(
    store: &S,
    id: &S::Id,
    request: &AcquireRequest,
) -> Result<Option<u64>, SemError> {
    if let Some(count) = request.count {
        let held = store.weight(id)?;
        if count != held {
            return Err(SemError::CountMismatch { held });
        }
    }
    match request.kind {
        Kind::Plain => Ok(None),
        Kind::Fair => store
            .owner_score(id)
            .and_then(ticket_from_score)
            .map(Some)
            .ok_or(SemError::InvalidTicket),
    }
}

/// Renews live holder `id`: its deadline moves.
fn renewed<S: Store>(
    store: &mut S,
    survey: &Survey<S::Id>,
    id: &S::Id,
    deadline: i64,
    ticket: Option<u64>,
) -> Acquired {
    prune(store, survey);
    store.put_holder(id, deadline, Put::IfHeld);
    Acquired::Granted {
        ticket,
        renewed: true,
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
    let survey = survey_for(store, now_ms, request)?;
    if !is_live(store, id, now_ms) {
        return Ok(None);
    }
    let plan = AcquirePlan {
        step: AcquireStep::Renew {
            ticket: renewal(store, id, request)?,
        },
        survey,
        now_ms,
        request: *request,
    };
    plan.apply(store, id).map(Some)
}

/// What a refresh or a release does to a holder, decided from reads alone (see
/// [`AcquirePlan`]): [`plan_refresh`] and [`plan_release`] find every error, [`apply`]
/// (HolderPlan::apply) makes the changes and tells what the holder was.
pub struct HolderPlan<Id> {
    survey: Survey<Id>,
    step: HolderStep,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HolderStep {
    /// A refresh: a live holder's deadline moves here; one that is not live goes.
    Refresh { deadline: i64 },
    /// The release of a holder of one permit: removing it tells whether it was live (an
    /// expired one went with the others first).
    RemoveOne,
    /// A release of what is not a live holder: it goes, and is told what it was.
    NotLive,
    /// The release of `giving` of the `held` permits of a live holder.
    Give { giving: u64, held: u64 },
}

/// SEM.REFRESH: moves a live holder's deadline to `now + lease`; it keeps its permits. A holder
/// that had expired has lost them (another may have been granted them).
pub fn refresh<S: Store>(
    store: &mut S,
    now_ms: i64,
    id: &S::Id,
    lease_ms: i64,
) -> Result<Holder, SemError> {
    Ok(plan_refresh(store, now_ms, lease_ms)?.apply(store, id))
}

/// The plan of [`refresh`], changing nothing: an error here is the refresh's.
#[inline(always)]
pub fn plan_refresh<S: Store>(
    store: &S,
    now_ms: i64,
    lease_ms: i64,
) -> Result<HolderPlan<S::Id>, SemError> {
    Ok(HolderPlan {
        survey: survey(store, now_ms)?,
        step: HolderStep::Refresh {
            deadline: now_ms + lease_ms,
        },
    })
}

/// SEM.RELEASE: gives back `count` of a live holder's permits (all without COUNT); the holder
/// stays, with its deadline and ticket, while it holds any. An expired holder is told so: its
/// critical section may have overlapped another holder's, which its caller should know.
pub fn release<S: Store>(
    store: &mut S,
    now_ms: i64,
    id: &S::Id,
    count: Option<u64>,
) -> Result<Holder, SemError> {
    Ok(plan_release(store, now_ms, id, count)?.apply(store, id))
}

/// The plan of [`release`], changing nothing: an error here is the release's.
#[inline(always)]
pub fn plan_release<S: Store>(
    store: &S,
    now_ms: i64,
    id: &S::Id,
    count: Option<u64>,
) -> Result<HolderPlan<S::Id>, SemError> {
    let survey = survey(store, now_ms)?;
    let step = if count.is_none() && !store.has_weights() {
        HolderStep::RemoveOne
    } else if !is_live(store, id, now_ms) {
        HolderStep::NotLive
    } else {
        let held = store.weight(id)?;
        let giving = count.unwrap_or(held);
        if giving > held {
            return Err(SemError::CountTooLarge { held });
        }
        HolderStep::Give { giving, held }
    };
    Ok(HolderPlan { survey, step })
}

impl<Id: IdBytes> HolderPlan<Id> {
    #[inline(always)]
    pub fn apply<S: Store<Id = Id>>(self, store: &mut S, id: &Id) -> Holder {
        let survey = &self.survey;
        prune(store, survey);
        let gone = |store: &mut S| {
            store.remove(slice::from_ref(id));
            survey.lost_or_absent(id)
        };
        match self.step {
            HolderStep::Refresh { deadline } => match store.put_holder(id, deadline, Put::IfHeld) {
                PutOutcome::Updated => Holder::Live,
                PutOutcome::Added | PutOutcome::NotHeld => gone(store),
            },
            HolderStep::RemoveOne if store.remove(slice::from_ref(id)) == 1 => Holder::Live,
            HolderStep::RemoveOne => survey.lost_or_absent(id),
            HolderStep::NotLive => gone(store),
            HolderStep::Give { giving, held } => {
                let extra = survey
                    .extra
                    .saturating_sub(giving.min(held.saturating_sub(1)));
                if giving == held {
                    store.remove(slice::from_ref(id));
                    if held > 1 {
                        store.put_weights(None, &[id], extra);
                    }
                } else {
                    store.put_weights(Some((id, held.saturating_sub(giving))), &[], extra);
                }
                Holder::Live
            }
        }
    }
}

/// SEM.GET: permits in use by live holders, without removing anything (it runs on read-only
/// replicas too).
pub fn in_use<S: Store>(store: &S, now_ms: i64) -> Result<u64, SemError> {
    Ok(survey(store, now_ms)?.in_use())
}

/// One live holder as SEM.GET JSON shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HolderView<Id> {
    pub id: Id,
    pub ms_left: i64,
    pub ticket: Option<u64>,
    pub permits: u64,
}

/// SEM.GET JSON: the semaphore's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot<Id> {
    pub fair: bool,
    pub counter: Option<u64>,
    pub in_use: u64,
    /// Live holders in grant order: fair ones by ticket; plain ones, which keep no grant
    /// record, by deadline (after the fair ones, should another client have mixed them).
    pub holders: Vec<HolderView<Id>>,
}

/// SEM.GET JSON, without changing anything.
pub fn snapshot<S: Store>(store: &S, now_ms: i64) -> Result<Snapshot<S::Id>, SemError> {
    let survey = survey(store, now_ms)?;
    let fair = survey.kind == Some(Kind::Fair);
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
            let permits = store.weight(&id)?;
            holders.push(HolderView {
                id,
                ms_left: deadline - now_ms,
                ticket: Some(ticket),
                permits,
            });
        }
    }
    for (id, deadline) in store.live_by_deadline(now_ms) {
        if !listed.contains(id.id_bytes()) {
            let permits = store.weight(&id)?;
            holders.push(HolderView {
                id,
                ms_left: deadline.saturating_sub(now_ms),
                ticket: None,
                permits,
            });
        }
    }
    Ok(Snapshot {
        fair,
        counter,
        in_use: survey.in_use(),
        holders,
    })
}

#[cfg(test)]
mod tests;
