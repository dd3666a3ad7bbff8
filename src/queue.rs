//! The wait queue: who waits for which semaphore, in what order, until when, and what is bound
//! to which connection. Plain data with `now_ms` passed in, so the rules are table-tested here;
//! `waiting.rs` applies them to Redis.
//!
//! Rules:
//! - Waiters stand in lines, one per semaphore; a set acquire (`SEM.ACQUIREALL ... WAIT`)
//!   stands in the line of every semaphore it names. Arrival order is one order across all
//!   lines (ids only grow), so the earliest waiter is at the head of all of its lines: no
//!   deadlock and no starvation, whatever order callers name the semaphores in. A set waiter is
//!   served when it is at the head of each of its lines and all its counts fit; while it heads
//!   a line it cannot yet be served in, nobody behind it there is served.
//! - The waiters of one semaphore are served strictly in arrival order. The head is served as
//!   soon as the acquire rule would grant it; while it would not (its limit is lower than the
//!   holders now live, or the live holders are of the other kind), nobody behind it is served:
//!   head-of-line, so nobody starves.
//! - A newcomer while others wait ([`arrival`]): a renewal (its identifier holds a live permit)
//!   happens at once; otherwise a waiting newcomer joins the end of the line, a plain one that
//!   does not wait may take a free permit ahead of the line (as a non-fair
//!   `java.util.concurrent.Semaphore` does), and a fair one that does not wait is refused without
//!   any change (no barging).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::rc::Rc;

use crate::request::Ask;
use crate::types::Kind;

/// A semaphore, as the waiting side names it: the database it lives in, and its name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SemKey {
    pub db: i32,
    /// Shared: the registry, the lines and the bindings each keep a copy.
    pub name: Rc<[u8]>,
}

pub type WaiterId = u64;

/// What the server knows a waiting client by (its blocked-client handle): the registry indexes
/// its waiters by it, for the callbacks that name a waiter only so.
pub trait Handle {
    fn key(&self) -> usize;
}

/// What a waiter waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wants {
    /// Permits, in its semaphore's line.
    Permits(Ask),
    /// The semaphore to have no live holder (`SEM.WAITEMPTY`): it takes nothing and stands in
    /// nobody's way, so it is not in the line.
    Empty,
    /// Permits of several semaphores at once (`SEM.ACQUIREALL`), one ask per semaphore (the
    /// first is the waiter's `sem`); it stands in each one's line.
    Set(Vec<(SemKey, Ask)>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiter<H> {
    pub id: WaiterId,
    pub sem: SemKey,
    /// The connection waiting.
    pub client: u64,
    pub wants: Wants,
    /// When it started waiting.
    pub since_ms: i64,
    /// When it stops waiting; `None` waits without limit.
    pub until_ms: Option<i64>,
    /// The server's handle on the blocked connection.
    pub handle: H,
}

impl<H> Waiter<H> {
    /// What a waiter for one semaphore's permits asked for.
    pub fn ask(&self) -> Option<&Ask> {
        match &self.wants {
            Wants::Permits(ask) => Some(ask),
            Wants::Empty | Wants::Set(_) => None,
        }
    }

    /// Whether it waits for a semaphore to empty.
    pub fn for_empty(&self) -> bool {
        self.wants == Wants::Empty
    }

    /// Every semaphore whose line it stands in (or whose emptiness it waits for).
    pub fn sems(&self) -> impl Iterator<Item = &SemKey> {
        let (set, one) = match &self.wants {
            Wants::Set(parts) => (Some(parts.iter().map(|(sem, _)| sem)), None),
            _ => (None, Some(&self.sem)),
        };
        set.into_iter().flatten().chain(one)
    }
}

/// How a newcomer is treated while others wait for the same semaphore.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrival {
    /// Nobody waits, or a plain newcomer that does not wait: apply the acquire rule now (if
    /// it finds the semaphore full, a waiting newcomer then joins the line).
    TryNow,
    /// Renew at once if its identifier holds a live permit; otherwise join the end of the line.
    RenewOrWait,
    /// Renew at once if its identifier holds a live permit; otherwise refused, changing nothing.
    RenewOrRefuse,
}

/// The keys of database `db`'s semaphores, as a range of [`SemKey`]s (ordered by database
/// first).
fn db_range(db: i32) -> std::ops::Range<SemKey> {
    let first = |db| SemKey {
        db,
        name: Rc::from([]),
    };
    first(db)..first(db.saturating_add(1))
}

pub fn arrival(kind: Kind, waits: bool, queued: usize) -> Arrival {
    match (queued, waits, kind) {
        (0, _, _) => Arrival::TryNow,
        (_, true, _) => Arrival::RenewOrWait,
        (_, false, Kind::Plain) => Arrival::TryNow,
        (_, false, Kind::Fair) => Arrival::RenewOrRefuse,
    }
}

/// How a set arrives in each of its lines, `queued` waiting in each: as a single caller would
/// ([`arrival`]), except that a set that waits joins the end of every line once any of them is
/// busy (it is served as one waiter at the head of all of them).
pub fn set_arrival(
    kind: Kind,
    waits: bool,
    queued: &[usize],
) -> impl Iterator<Item = Arrival> + '_ {
    let busiest = queued.iter().copied().max().unwrap_or(0);
    queued
        .iter()
        .map(move |&here| arrival(kind, waits, if waits { busiest } else { here }))
}

impl Arrival {
    /// Whether the acquire rule may grant it a new permit now (not only renew one it holds).
    pub fn may_acquire(self) -> bool {
        self == Arrival::TryNow
    }
}

/// Something to do at a given time.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Due {
    /// A waiter's wait ended.
    Timeout(WaiterId),
    /// A semaphore with waiters has a holder whose lease ends now.
    LeaseEnd(SemKey),
}

/// A permit held by a `BOUND` holder, given back when its connection closes.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Binding {
    pub sem: SemKey,
    pub holder: Vec<u8>,
}

/// A map keyed by a number the module itself hands out (waiter ids, client ids, handle
/// addresses): no client chooses these keys, so they need no keyed hash against collision
/// floods, and one multiplication does (SipHash costs far more on the hot path).
pub type IdMap<K, V> = HashMap<K, V, std::hash::BuildHasherDefault<IdHasher>>;

/// The hasher of [`IdMap`]: Fibonacci hashing of one integer.
#[derive(Default)]
pub struct IdHasher(u64);

impl std::hash::Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = (self.0.rotate_left(5) ^ u64::from(byte)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0 ^ n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }

    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
}

/// Everything the waiting side remembers. Each entry lives exactly as long as its reason: a
/// waiter until it is served, times out or goes; a due time until it passes or is replaced; a
/// binding until its permit is given back or its connection closes.
#[derive(Debug)]
pub struct Registry<H> {
    next_id: WaiterId,
    waiters: IdMap<WaiterId, Waiter<H>>,
    /// Each waiter by its handle's key.
    by_handle: IdMap<usize, WaiterId>,
    /// Each semaphore's waiters in arrival order (ids only grow). Ordered by database first,
    /// so one database's lines are a range.
    lines: BTreeMap<SemKey, BTreeSet<WaiterId>>,
    /// Each semaphore's waiters for it to empty, in arrival order.
    empties: BTreeMap<SemKey, BTreeSet<WaiterId>>,
    /// How many wait for a semaphore to empty, in all.
    empty_waiters: usize,
    /// Due times, earliest first; the sequence number tells equal times apart.
    schedule: BTreeMap<(i64, u64), Due>,
    next_seq: u64,
    /// Where each semaphore's lease-end entry is in `schedule`.
    lease_ends: HashMap<SemKey, (i64, u64)>,
    /// Where each waiter's timeout entry is in `schedule`.
    timeouts: IdMap<WaiterId, (i64, u64)>,
    bound: IdMap<u64, HashSet<Binding>>,
    bound_by: HashMap<Binding, u64>,
    /// Each semaphore's bound holders, to forget them all when its keys vanished; by database
    /// first, so a flush or swap touches only its own.
    bound_in: BTreeMap<SemKey, HashSet<Vec<u8>>>,
}

impl<H> Default for Registry<H> {
    fn default() -> Self {
        Registry {
            next_id: 1,
            waiters: IdMap::default(),
            by_handle: IdMap::default(),
            lines: BTreeMap::new(),
            empties: BTreeMap::new(),
            empty_waiters: 0,
            schedule: BTreeMap::new(),
            next_seq: 0,
            lease_ends: HashMap::new(),
            timeouts: IdMap::default(),
            bound: IdMap::default(),
            bound_by: HashMap::new(),
            bound_in: BTreeMap::new(),
        }
    }
}

impl<H: Handle> Registry<H> {
    /// Adds a waiter for what it `wants`: at the end of `sem`'s line (permits), of the line of
    /// each semaphore a set names (`sem` is the first), or among those waiting for `sem` to
    /// empty.
    pub fn enqueue(
        &mut self,
        sem: SemKey,
        client: u64,
        wants: Wants,
        now_ms: i64,
        until_ms: Option<i64>,
        handle: H,
    ) -> WaiterId {
        let id = self.next_id;
        self.next_id += 1;
        match &wants {
            Wants::Permits(_) => {
                self.lines.entry(sem.clone()).or_default().insert(id);
            }
            Wants::Set(parts) => {
                for (part, _) in parts {
                    self.lines.entry(part.clone()).or_default().insert(id);
                }
            }
            Wants::Empty => {
                self.empty_waiters += 1;
                self.empties.entry(sem.clone()).or_default().insert(id);
            }
        }
        if let Some(until) = until_ms {
            let slot = self.schedule_at(until, Due::Timeout(id));
            self.timeouts.insert(id, slot);
        }
        let waiter = Waiter {
            id,
            sem,
            client,
            wants,
            since_ms: now_ms,
            until_ms,
            handle,
        };
        self.by_handle.insert(waiter.handle.key(), id);
        self.waiters.insert(id, waiter);
        id
    }

    /// Takes a waiter out, wherever it is in its line.
    pub fn remove(&mut self, id: WaiterId) -> Option<Waiter<H>> {
        let waiter = self.waiters.remove(&id)?;
        self.by_handle.remove(&waiter.handle.key());
        if let Some(slot) = self.timeouts.remove(&id) {
            self.schedule.remove(&slot);
        }
        let for_empty = waiter.for_empty();
        if for_empty {
            self.empty_waiters -= 1;
        }
        for sem in waiter.sems() {
            let waiting = if for_empty {
                &mut self.empties
            } else {
                &mut self.lines
            };
            let line = waiting.get_mut(sem).expect("a waiter is in its line");
            line.remove(&id);
            if line.is_empty() {
                waiting.remove(sem);
                if !self.is_waited(sem) {
                    self.set_lease_end(sem, None);
                }
            }
        }
        Some(waiter)
    }

    /// Takes out the waiter whose handle has `key`.
    pub fn remove_by_handle(&mut self, key: usize) -> Option<Waiter<H>> {
        let id = *self.by_handle.get(&key)?;
        self.remove(id)
    }

    pub fn waiter(&self, id: WaiterId) -> Option<&Waiter<H>> {
        self.waiters.get(&id)
    }

    /// Whether waiter `id` is at the head of every line it stands in.
    pub fn heads_every_line(&self, id: WaiterId) -> bool {
        self.waiters.get(&id).is_some_and(|waiter| {
            waiter
                .sems()
                .all(|sem| self.lines.get(sem).and_then(|line| line.first()) == Some(&id))
        })
    }

    /// The first waiter in `sem`'s line.
    pub fn head(&self, sem: &SemKey) -> Option<&Waiter<H>> {
        let id = self.lines.get(sem)?.first()?;
        self.waiters.get(id)
    }

    pub fn queued(&self, sem: &SemKey) -> usize {
        self.lines.get(sem).map_or(0, BTreeSet::len)
    }

    pub fn total_waiters(&self) -> usize {
        self.waiters.len()
    }

    /// How many wait for `sem` to empty.
    pub fn waiting_for_empty(&self, sem: &SemKey) -> usize {
        self.empties.get(sem).map_or(0, BTreeSet::len)
    }

    /// How many wait for a semaphore to empty, in all.
    pub fn empty_waiters(&self) -> usize {
        self.empty_waiters
    }

    /// Takes out every waiter for `sem` to empty, in arrival order: it is empty.
    pub fn take_empties(&mut self, sem: &SemKey) -> Vec<Waiter<H>> {
        let ids: Vec<WaiterId> = self
            .empties
            .get(sem)
            .map(|ids| ids.iter().copied().collect())
            .unwrap_or_default();
        ids.into_iter().filter_map(|id| self.remove(id)).collect()
    }

    /// How long each waiter in `sem`'s line has waited, in line order (for SEM.GET JSON,
    /// which is O(N) anyway).
    pub fn ages_ms(&self, sem: &SemKey, now_ms: i64) -> Vec<i64> {
        self.lines.get(sem).map_or_else(Vec::new, |line| {
            line.iter()
                .filter_map(|id| self.waiters.get(id))
                .map(|w| now_ms.saturating_sub(w.since_ms))
                .collect()
        })
    }

    /// How long the head of `sem`'s line has waited.
    pub fn longest_wait_ms(&self, sem: &SemKey, now_ms: i64) -> Option<i64> {
        self.head(sem).map(|w| now_ms.saturating_sub(w.since_ms))
    }

    /// Whether somebody waits for `sem`: for permits, or for it to empty.
    pub fn is_waited(&self, sem: &SemKey) -> bool {
        self.lines.contains_key(sem) || self.empties.contains_key(sem)
    }

    /// How many semaphores have waiters for permits.
    pub fn waited_count(&self) -> usize {
        self.lines.len()
    }

    /// The semaphores with waiters of either kind, in `db` (every database when `None`), in
    /// order: the cost is theirs only, not every line's.
    pub fn waited(&self, db: Option<i32>) -> Vec<SemKey> {
        let in_db = |map: &BTreeMap<SemKey, BTreeSet<WaiterId>>| -> BTreeSet<SemKey> {
            match db {
                None => map.keys().cloned().collect(),
                Some(db) => map
                    .range(db_range(db))
                    .map(|(sem, _)| sem.clone())
                    .collect(),
            }
        };
        let mut sems = in_db(&self.lines);
        sems.extend(in_db(&self.empties));
        sems.into_iter().collect()
    }

    /// Schedules (or moves, or with `None` cancels) `sem`'s next lease end.
    pub fn set_lease_end(&mut self, sem: &SemKey, at_ms: Option<i64>) {
        let at_ms = at_ms.filter(|&at| self.lease_end_matters(sem, at));
        let current = self.lease_ends.get(sem).copied();
        if current.map(|(at, _)| at) == at_ms {
            return;
        }
        if let Some(slot) = current {
            self.schedule.remove(&slot);
            self.lease_ends.remove(sem);
        }
        if let Some(at) = at_ms {
            let slot = self.schedule_at(at, Due::LeaseEnd(sem.clone()));
            self.lease_ends.insert(sem.clone(), slot);
        }
    }

    /// The lease end a newcomer found at `at_ms` as it joined `sem`'s line without the head
    /// being looked at: one already scheduled that comes first stays (the head's, found when it
    /// was last looked at: a lease that has ended since is no longer live for the newcomer,
    /// but its end may still free the head's permits).
    pub fn newcomer_lease_end(&mut self, sem: &SemKey, at_ms: Option<i64>) {
        if let Some(&(scheduled, _)) = self.lease_ends.get(sem) {
            if at_ms.is_none_or(|at| scheduled <= at) {
                return;
            }
        } else if at_ms.is_none() {
            return;
        }
        self.set_lease_end(sem, at_ms);
    }

    /// Whether a lease end at `at_ms` may serve somebody waiting for `sem`: not when the line's
    /// only waiter stops waiting first (a newcomer schedules the lease end again as it
    /// arrives). Longer lines and waits for empty are taken as needing it (a look-up each).
    fn lease_end_matters(&self, sem: &SemKey, at_ms: i64) -> bool {
        if self.empties.contains_key(sem) {
            return true;
        }
        let Some(line) = self.lines.get(sem).filter(|line| line.len() == 1) else {
            return true;
        };
        line.first()
            .and_then(|id| self.waiters.get(id))
            .and_then(|waiter| waiter.until_ms)
            .is_none_or(|until| at_ms <= until)
    }

    fn schedule_at(&mut self, at_ms: i64, due: Due) -> (i64, u64) {
        let slot = (at_ms, self.next_seq);
        self.next_seq += 1;
        self.schedule.insert(slot, due);
        slot
    }

    /// How many due times are scheduled (wait ends and lease ends).
    pub fn scheduled(&self) -> usize {
        self.schedule.len()
    }

    /// The earliest due time, if any.
    pub fn next_due_ms(&self) -> Option<i64> {
        self.schedule.first_key_value().map(|((at, _), _)| *at)
    }

    /// Takes out everything due at or before `now_ms`, earliest first.
    pub fn take_due(&mut self, now_ms: i64) -> Vec<Due> {
        std::iter::from_fn(|| self.take_one_due(now_ms)).collect()
    }

    /// Takes out the earliest thing due at or before `now_ms`, if any: work in slices takes
    /// them one at a time.
    pub fn take_one_due(&mut self, now_ms: i64) -> Option<Due> {
        let entry = self.schedule.first_entry()?;
        if entry.key().0 > now_ms {
            return None;
        }
        let item = entry.remove();
        match &item {
            Due::Timeout(id) => {
                self.timeouts.remove(id);
            }
            Due::LeaseEnd(sem) => {
                self.lease_ends.remove(sem);
            }
        }
        Some(item)
    }

    /// Takes out every waiter (the server stopped granting, as when it became a replica).
    pub fn take_all_waiters(&mut self) -> Vec<Waiter<H>> {
        let mut ids: Vec<WaiterId> = self.waiters.keys().copied().collect();
        ids.sort_unstable();
        ids.into_iter().filter_map(|id| self.remove(id)).collect()
    }

    /// Records that `client`'s connection holds `binding`'s permit.
    pub fn bind(&mut self, client: u64, binding: Binding) {
        self.unbind(&binding);
        self.bound_in
            .entry(binding.sem.clone())
            .or_default()
            .insert(binding.holder.clone());
        self.bound_by.insert(binding.clone(), client);
        self.bound.entry(client).or_default().insert(binding);
    }

    /// Forgets `binding` (its permit was given back or lost).
    pub fn unbind(&mut self, binding: &Binding) {
        let Some(client) = self.bound_by.remove(binding) else {
            return;
        };
        if let Some(set) = self.bound.get_mut(&client) {
            set.remove(binding);
            if set.is_empty() {
                self.bound.remove(&client);
            }
        }
        if let Some(holders) = self.bound_in.get_mut(&binding.sem) {
            holders.remove(&binding.holder);
            if holders.is_empty() {
                self.bound_in.remove(&binding.sem);
            }
        }
    }

    /// Forgets every binding of `sem`: its holders are gone (its key expired or was deleted).
    pub fn unbind_all(&mut self, sem: &SemKey) {
        let holders: Vec<Vec<u8>> = self
            .bound_in
            .get(sem)
            .map(|holders| holders.iter().cloned().collect())
            .unwrap_or_default();
        for holder in holders {
            self.unbind(&Binding {
                sem: sem.clone(),
                holder,
            });
        }
    }

    pub fn bound_count(&self) -> usize {
        self.bound_by.len()
    }

    /// The permits `client`'s connection held, forgotten here: it closed.
    pub fn take_bindings(&mut self, client: u64) -> Vec<Binding> {
        let mut bindings: Vec<Binding> = self
            .bound
            .get(&client)
            .map(|set| set.iter().cloned().collect())
            .unwrap_or_default();
        for binding in &bindings {
            self.unbind(binding);
        }
        bindings.sort_by(|a, b| (&a.sem, &a.holder).cmp(&(&b.sem, &b.holder)));
        bindings
    }

    /// Forgets every binding in `db` (every database when `None`): the data was flushed.
    pub fn drop_bindings(&mut self, db: Option<i32>) {
        for binding in self.bindings_in(db) {
            self.unbind(&binding);
        }
    }

    /// The bindings of semaphores in `db` (every database when `None`).
    fn bindings_in(&self, db: Option<i32>) -> Vec<Binding> {
        let sems: Box<dyn Iterator<Item = (&SemKey, &HashSet<Vec<u8>>)>> = match db {
            None => Box::new(self.bound_in.iter()),
            Some(db) => Box::new(self.bound_in.range(db_range(db))),
        };
        sems.flat_map(|(sem, holders)| {
            holders.iter().map(|holder| Binding {
                sem: sem.clone(),
                holder: holder.clone(),
            })
        })
        .collect()
    }

    /// Databases `a` and `b` swapped contents: bindings follow their keys.
    pub fn swap_binding_dbs(&mut self, a: i32, b: i32) {
        let mut moved: Vec<(Binding, u64)> = Vec::new();
        for db in if a == b { vec![a] } else { vec![a, b] } {
            for binding in self.bindings_in(Some(db)) {
                let client = self.bound_by[&binding];
                moved.push((binding, client));
            }
        }
        for (binding, _) in &moved {
            self.unbind(binding);
        }
        for (mut binding, client) in moved {
            binding.sem.db = if binding.sem.db == a { b } else { a };
            self.bind(client, binding);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Handle for usize {
        fn key(&self) -> usize {
            *self
        }
    }

    fn sem(name: &str) -> SemKey {
        SemKey {
            db: 0,
            name: name.as_bytes().into(),
        }
    }

    fn ask(holder: &str) -> Wants {
        Wants::Permits(ask_of(holder))
    }

    fn ask_of(holder: &str) -> Ask {
        Ask {
            kind: Kind::Fair,
            limit: 1,
            lease_ms: 1000,
            count: None,
            holder: holder.as_bytes().to_vec(),
            with_ticket: false,
            bound: false,
        }
    }

    #[test]
    fn newcomers_while_others_wait() {
        let table = [
            (Kind::Plain, false, 0, Arrival::TryNow),
            (Kind::Plain, true, 0, Arrival::TryNow),
            (Kind::Fair, false, 0, Arrival::TryNow),
            (Kind::Fair, true, 0, Arrival::TryNow),
            (Kind::Plain, false, 3, Arrival::TryNow),
            (Kind::Plain, true, 3, Arrival::RenewOrWait),
            (Kind::Fair, false, 3, Arrival::RenewOrRefuse),
            (Kind::Fair, true, 3, Arrival::RenewOrWait),
        ];
        for (kind, waits, queued, want) in table {
            assert_eq!(
                arrival(kind, waits, queued),
                want,
                "{kind:?} {waits} {queued}"
            );
        }
    }

    #[test]
    fn a_set_arrives_in_each_of_its_lines() {
        use Arrival::{RenewOrRefuse as Refuse, RenewOrWait as Wait, TryNow as Try};
        // A set that waits joins every line once one is busy; one that does not is a single
        // caller in each.
        let table: [(Kind, bool, &[usize], &[Arrival]); 6] = [
            (Kind::Plain, true, &[0, 0], &[Try, Try]),
            (Kind::Plain, true, &[0, 2], &[Wait, Wait]),
            (Kind::Fair, true, &[1, 0], &[Wait, Wait]),
            (Kind::Plain, false, &[0, 2], &[Try, Try]),
            (Kind::Fair, false, &[0, 2], &[Try, Refuse]),
            (Kind::Fair, false, &[0, 0], &[Try, Try]),
        ];
        for (kind, waits, queued, want) in table {
            let got: Vec<Arrival> = set_arrival(kind, waits, queued).collect();
            assert_eq!(got, want, "{kind:?} {waits} {queued:?}");
        }
    }

    #[test]
    fn the_handle_index_follows_every_way_out() {
        let mut r = Registry::default();
        let a = r.enqueue(sem("s"), 1, ask("a"), 0, None, 101usize);
        let b = r.enqueue(sem("s"), 2, ask("b"), 0, None, 102usize);
        r.enqueue(sem("s"), 3, Wants::Empty, 0, None, 103usize);
        // Answered by id: its handle names nobody any more.
        r.remove(a).unwrap();
        assert!(r.remove_by_handle(101).is_none());
        // Gone by its handle (a disconnect): out of its line too.
        assert_eq!(r.remove_by_handle(102).map(|w| w.id), Some(b));
        assert_eq!(r.queued(&sem("s")), 0);
        // Taken with the others waiting for empty.
        assert_eq!(r.take_empties(&sem("s")).len(), 1);
        assert!(r.remove_by_handle(103).is_none());
        assert_eq!(r.total_waiters(), 0);
    }

    #[test]
    fn lines_are_first_come_first_served_per_semaphore() {
        let mut r = Registry::default();
        let a = r.enqueue(sem("s"), 1, ask("a"), 0, None, 1);
        let b = r.enqueue(sem("s"), 2, ask("b"), 1, None, 2);
        let x = r.enqueue(sem("t"), 3, ask("x"), 2, None, 3);
        let c = r.enqueue(sem("s"), 4, ask("c"), 3, None, 4);
        assert_eq!(r.head(&sem("s")).map(|w| w.id), Some(a));
        assert_eq!(r.queued(&sem("s")), 3);
        assert_eq!(r.longest_wait_ms(&sem("s"), 10), Some(10));
        // Leaving from the middle keeps the order of the others.
        r.remove(b).unwrap();
        assert_eq!(
            r.remove(a)
                .and_then(|w| w.ask().map(|ask| ask.holder.clone())),
            Some(b"a".to_vec())
        );
        assert_eq!(r.head(&sem("s")).map(|w| w.id), Some(c));
        assert_eq!(r.head(&sem("t")).map(|w| w.id), Some(x));
        assert!(r.is_waited(&sem("s")) && r.is_waited(&sem("t")));
        r.remove(c).unwrap();
        assert!(!r.is_waited(&sem("s")), "an empty line is forgotten");
        assert_eq!(r.waited_count(), 1);
        assert_eq!(r.waited(None), [sem("t")]);
        assert_eq!(r.total_waiters(), 1);
        assert!(r.remove(c).is_none(), "removed twice");
    }

    #[test]
    fn each_database_has_its_own_lines() {
        let mut r = Registry::default();
        let in_db = |db, name| SemKey { db, ..sem(name) };
        let a = r.enqueue(sem("s"), 1, ask("a"), 0, None, 5);
        let b = r.enqueue(in_db(3, "s"), 2, ask("b"), 0, None, 6);
        r.enqueue(in_db(3, ""), 3, ask("c"), 0, None, 7);
        r.enqueue(in_db(4, "a"), 4, ask("d"), 0, None, 8);
        r.enqueue(in_db(2, "zz"), 5, ask("e"), 0, None, 9);
        assert_eq!(r.waited(Some(3)), [in_db(3, ""), in_db(3, "s")]);
        assert_eq!(r.waited(Some(1)), []);
        assert_eq!(r.waited(None).len(), 5);
        r.remove(a);
        assert!(!r.is_waited(&sem("s")));
        assert!(r.is_waited(&in_db(3, "s")), "still waited on in db 3");
        r.remove(b);
        assert!(!r.is_waited(&in_db(3, "s")));
    }

    fn set(names: &[&str], holder: &str) -> Wants {
        Wants::Set(
            names
                .iter()
                .map(|name| (sem(name), ask_of(holder)))
                .collect(),
        )
    }

    /// One arrival order across lines: the earliest waiter heads all of its lines, whatever
    /// order the semaphores were named in, and a set waiter leaves every line at once.
    #[test]
    fn a_set_waiter_stands_in_every_line_it_names() {
        let mut r = Registry::default();
        let a = r.enqueue(sem("x"), 1, ask("a"), 0, None, 10);
        let s1 = r.enqueue(sem("y"), 2, set(&["y", "x"], "s1"), 1, Some(100), 11);
        let s2 = r.enqueue(sem("x"), 3, set(&["x", "y", "z"], "s2"), 2, None, 12);
        let b = r.enqueue(sem("z"), 4, ask("b"), 3, None, 13);
        // (line, its waiters in order)
        let table = [
            ("x", vec![a, s1, s2]),
            ("y", vec![s1, s2]),
            ("z", vec![s2, b]),
        ];
        for (name, want) in &table {
            assert_eq!(r.queued(&sem(name)), want.len(), "{name}");
            assert_eq!(r.head(&sem(name)).map(|w| w.id), Some(want[0]), "{name}");
        }
        // (waiter, heads every line) before and after the first leaves.
        assert_eq!(
            [a, s1, s2, b].map(|id| r.heads_every_line(id)),
            [true, false, false, false]
        );
        r.remove(a);
        assert_eq!(
            [s1, s2, b].map(|id| r.heads_every_line(id)),
            [true, false, false]
        );
        assert_eq!(
            r.waiter(s1).map(|w| w.sems().cloned().collect::<Vec<_>>()),
            Some(vec![sem("y"), sem("x")])
        );
        r.set_lease_end(&sem("y"), Some(50));
        r.remove(s1);
        assert!(r.heads_every_line(s2));
        assert_eq!(
            r.take_due(1_000),
            [Due::LeaseEnd(sem("y"))],
            "s1's timeout went"
        );
        r.remove(s2);
        assert_eq!(r.waited(None), [sem("z")]);
        assert!(r.heads_every_line(b));
        assert_eq!(r.total_waiters(), 1);
    }

    #[test]
    fn waiters_for_empty_stand_outside_the_line() {
        let mut r = Registry::default();
        let e1 = r.enqueue(sem("s"), 1, Wants::Empty, 0, Some(50), 14);
        let a = r.enqueue(sem("s"), 2, ask("a"), 1, None, 15);
        let e2 = r.enqueue(sem("s"), 3, Wants::Empty, 2, None, 16);
        r.enqueue(sem("t"), 4, Wants::Empty, 3, None, 17);
        // The line has only the waiter for permits; the others are counted apart.
        assert_eq!(r.head(&sem("s")).map(|w| w.id), Some(a));
        assert_eq!(r.queued(&sem("s")), 1);
        assert_eq!(r.waiting_for_empty(&sem("s")), 2);
        assert_eq!(
            (r.empty_waiters(), r.total_waiters(), r.waited_count()),
            (3, 4, 1)
        );
        assert_eq!(r.waited(None), [sem("s"), sem("t")]);
        r.set_lease_end(&sem("s"), Some(10));
        // The line emptying keeps the lease end while some wait for empty.
        r.remove(a);
        assert!(r.is_waited(&sem("s")));
        assert_eq!(r.next_due_ms(), Some(10));
        let ids: Vec<WaiterId> = r.take_empties(&sem("s")).iter().map(|w| w.id).collect();
        assert_eq!(ids, [e1, e2]);
        assert!(!r.is_waited(&sem("s")));
        assert_eq!(r.empty_waiters(), 1);
        assert_eq!(
            r.take_due(1_000),
            [],
            "their timeout and lease end went with them"
        );
    }

    #[test]
    fn due_times_come_out_one_at_a_time() {
        let mut r = Registry::default();
        let a = r.enqueue(sem("s"), 1, ask("a"), 0, Some(20), 18);
        r.set_lease_end(&sem("s"), Some(10));
        assert_eq!(r.take_one_due(9), None);
        assert_eq!(r.take_one_due(25), Some(Due::LeaseEnd(sem("s"))));
        assert_eq!(r.take_one_due(25), Some(Due::Timeout(a)));
        assert_eq!(r.take_one_due(25), None);
        assert_eq!(r.scheduled(), 0);
    }

    #[test]
    fn a_lease_end_after_the_only_waiters_own_end_is_not_kept() {
        let mut r = Registry::default();
        let a = r.enqueue(sem("s"), 1, ask("a"), 0, Some(100), 19);
        r.set_lease_end(&sem("s"), Some(150));
        assert_eq!(r.next_due_ms(), Some(100), "only the wait's end");
        assert_eq!(r.scheduled(), 1);
        r.set_lease_end(&sem("s"), Some(100));
        assert_eq!(
            r.scheduled(),
            2,
            "at the wait's very end it may still serve"
        );
        // A second waiter (waiting longer): the lease end counts again.
        let b = r.enqueue(sem("s"), 2, ask("b"), 1, None, 20);
        r.set_lease_end(&sem("s"), Some(150));
        assert_eq!(r.scheduled(), 2);
        r.remove(a);
        r.remove(b);
        assert_eq!(r.scheduled(), 0);
        // Somebody waiting for the semaphore to empty needs it too.
        r.enqueue(sem("t"), 3, ask("c"), 0, Some(10), 21);
        r.enqueue(sem("t"), 4, Wants::Empty, 0, Some(10), 22);
        r.set_lease_end(&sem("t"), Some(50));
        assert_eq!(r.scheduled(), 3);
    }

    #[test]
    fn timeouts_and_lease_ends_come_due_in_time_order() {
        let mut r = Registry::default();
        let a = r.enqueue(sem("s"), 1, ask("a"), 0, Some(500), 23);
        let b = r.enqueue(sem("s"), 2, ask("b"), 0, Some(300), 24);
        let _forever = r.enqueue(sem("s"), 3, ask("c"), 0, None, 25);
        r.set_lease_end(&sem("s"), Some(400));
        assert_eq!(r.next_due_ms(), Some(300));
        assert_eq!(r.take_due(299), []);
        assert_eq!(r.take_due(450), [Due::Timeout(b), Due::LeaseEnd(sem("s"))]);
        // Moving a lease end replaces it; a removed waiter's timeout is gone.
        r.set_lease_end(&sem("s"), Some(900));
        r.set_lease_end(&sem("s"), Some(800));
        r.remove(a);
        assert_eq!(r.take_due(10_000), [Due::LeaseEnd(sem("s"))]);
        assert_eq!(r.next_due_ms(), None);
    }

    /// A newcomer, which looks at the holders without the head, moves the line's lease end
    /// earlier only: the end it cannot see (a lease that ended before it looked) stays.
    #[test]
    fn a_newcomer_moves_a_lease_end_earlier_only() {
        // (scheduled, the newcomer's, then due)
        let table = [
            (None, Some(100), Some(100)),
            (None, None, None),
            (Some(100), Some(200), Some(100)),
            (Some(100), None, Some(100)),
            (Some(200), Some(100), Some(100)),
            (Some(100), Some(100), Some(100)),
        ];
        for (i, (scheduled, found, due)) in table.into_iter().enumerate() {
            let mut r = Registry::default();
            r.enqueue(sem("s"), 1, ask("a"), 0, None, 40);
            r.set_lease_end(&sem("s"), scheduled);
            r.enqueue(sem("s"), 2, ask("b"), 5, None, 41);
            r.newcomer_lease_end(&sem("s"), found);
            assert_eq!(r.next_due_ms(), due, "case {i}");
            assert_eq!(r.scheduled(), usize::from(due.is_some()), "case {i}");
        }
    }

    #[test]
    fn an_empty_line_cancels_its_lease_end() {
        let mut r = Registry::default();
        let a = r.enqueue(sem("s"), 1, ask("a"), 0, None, 26);
        r.set_lease_end(&sem("s"), Some(100));
        r.remove(a);
        assert_eq!(r.next_due_ms(), None);
    }

    #[test]
    fn taking_all_waiters_leaves_nothing() {
        let mut r = Registry::default();
        r.enqueue(sem("s"), 1, ask("a"), 0, Some(10), 27);
        r.enqueue(sem("t"), 2, ask("b"), 0, None, 28);
        r.set_lease_end(&sem("t"), Some(5));
        let all: Vec<Vec<u8>> = r
            .take_all_waiters()
            .into_iter()
            .filter_map(|w| w.ask().map(|ask| ask.holder.clone()))
            .collect();
        assert_eq!(all, [b"a".to_vec(), b"b".to_vec()]);
        assert_eq!(r.total_waiters(), 0);
        assert_eq!(r.next_due_ms(), None);
        assert!(r.waited(None).is_empty());
    }

    #[test]
    fn bindings_follow_their_connection() {
        let mut r: Registry<usize> = Registry::default();
        let binding = |name: &str, holder: &str| Binding {
            sem: sem(name),
            holder: holder.as_bytes().to_vec(),
        };
        r.bind(7, binding("s", "a"));
        r.bind(7, binding("t", "b"));
        r.bind(8, binding("s", "c"));
        // A renewal with BOUND from another connection moves the binding there.
        r.bind(8, binding("t", "b"));
        r.unbind(&binding("s", "c"));
        assert_eq!(r.take_bindings(7), [binding("s", "a")]);
        assert_eq!(r.take_bindings(8), [binding("t", "b")]);
        assert_eq!(r.bound_count(), 0);

        r.bind(1, binding("s", "a"));
        r.bind(
            1,
            Binding {
                sem: SemKey { db: 2, ..sem("s") },
                holder: b"z".to_vec(),
            },
        );
        r.swap_binding_dbs(0, 2);
        let mut held = r.take_bindings(1);
        held.sort_by_key(|b| b.sem.db);
        assert_eq!(held[0].sem.db, 0);
        assert_eq!(held[0].holder, b"z");
        assert_eq!(held[1].sem.db, 2);
        r.bind(1, binding("s", "a"));
        r.bind(
            2,
            Binding {
                sem: SemKey { db: 1, ..sem("s") },
                holder: b"y".to_vec(),
            },
        );
        r.drop_bindings(Some(0));
        assert_eq!(r.bound_count(), 1, "another database's binding stays");
        r.drop_bindings(None);
        assert_eq!(r.bound_count(), 0);

        // A semaphore whose keys vanished forgets all its bindings, and only its own.
        r.bind(1, binding("s", "a"));
        r.bind(2, binding("s", "b"));
        r.bind(2, binding("t", "c"));
        r.unbind_all(&sem("s"));
        assert_eq!(r.bound_count(), 1);
        assert_eq!(r.take_bindings(2), [binding("t", "c")]);
        assert_eq!(r.take_bindings(1), []);
    }
}
