//! The semaphores somebody waits on, as a filter of their names' hashes that the server's
//! callbacks read before anything else: another client's change to a key that is no waited
//! semaphore's (nearly every key the key server event brings) costs a hash and a load, no lock,
//! no allocation, no call above server/. A name the filter holds may be waited on (the waiting
//! side's registry tells). Names are added when a client starts to wait, and all are forgotten
//! when nobody waits any more.

use std::sync::atomic::{AtomicU16, AtomicU64, AtomicUsize, Ordering};

use crate::keys::DERIVED;

/// 2^16 bits: with 1,000 waited semaphores about 1.5 % of other keys pass, with 10,000 about 14 %.
const WORDS: usize = 1024;
static BITS: [AtomicU64; WORDS] = [const { AtomicU64::new(0) }; WORDS];

/// A hash of the database, the name's length and its first and last eight bytes: a handful of
/// instructions whatever the length.
fn bit(db: i32, name: &[u8]) -> (usize, u64) {
    let word = |bytes: &[u8]| {
        let mut buf = [0u8; 8];
        buf[..bytes.len()].copy_from_slice(bytes);
        u64::from_le_bytes(buf)
    };
    let head = word(&name[..name.len().min(8)]);
    let tail = word(&name[name.len().saturating_sub(8)..]);
    let mut hash = (db as u32 as u64) ^ ((name.len() as u64) << 32);
    for part in [head, tail] {
        hash = (hash ^ part).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        hash ^= hash >> 29;
    }
    let index = (hash % (WORDS as u64 * 64)) as usize;
    (index / 64, 1 << (index % 64))
}

/// The words set since the filter was last cleared, while they are few (a count above
/// `TOUCHED.len()` means many): clearing those alone spares the usual hand-off, whose last
/// waiter leaves after one name was watched, a store to every word.
static TOUCHED: [AtomicU16; 32] = [const { AtomicU16::new(0) }; 32];
static TOUCHED_LEN: AtomicUsize = AtomicUsize::new(0);

/// Somebody waits on the semaphore `name` of database `db`.
pub fn watch(db: i32, name: &[u8]) {
    let (word, mask) = bit(db, name);
    if BITS[word].fetch_or(mask, Ordering::Relaxed) != 0 {
        return;
    }
    let len = TOUCHED_LEN.load(Ordering::Relaxed);
    if let Some(slot) = TOUCHED.get(len) {
        slot.store(word as u16, Ordering::Relaxed);
    }
    TOUCHED_LEN.store(
        len.saturating_add(1).min(TOUCHED.len() + 1),
        Ordering::Relaxed,
    );
}

fn holds(db: i32, name: &[u8]) -> bool {
    let (word, mask) = bit(db, name);
    BITS[word].load(Ordering::Relaxed) & mask != 0
}

/// Whether `key` of database `db` may be a waited semaphore's, or one of its derived keys.
pub fn may_concern(db: i32, key: &[u8]) -> bool {
    if holds(db, key) {
        return true;
    }
    // Every derived key's suffix ends in one of these: most keys need no suffix compared.
    matches!(key.last(), Some(b'r' | b's' | b't'))
        && DERIVED.iter().any(|suffix| {
            key.strip_suffix(*suffix)
                .is_some_and(|name| holds(db, name))
        })
}

/// Nobody waits any more.
pub fn forget_all() {
    let len = TOUCHED_LEN.swap(0, Ordering::Relaxed);
    match TOUCHED.get(..len) {
        Some(touched) => {
            for word in touched {
                BITS[usize::from(word.load(Ordering::Relaxed))].store(0, Ordering::Relaxed);
            }
        }
        None => {
            for word in &BITS {
                word.store(0, Ordering::Relaxed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watched_name_and_its_derived_keys_pass_and_few_others_do() {
        forget_all();
        watch(0, b"jobs");
        assert!(may_concern(0, b"jobs"));
        assert!(may_concern(0, b"jobs:owner"));
        assert!(may_concern(0, b"jobs:limit"));
        let others = (0..1000)
            .filter(|i| may_concern(0, format!("other{i}").as_bytes()))
            .count();
        assert!(others < 5, "{others} of 1000 other names pass");
        forget_all();
        assert!(!may_concern(0, b"jobs"));
        assert!(!may_concern(0, b"jobs:owner"));
        // Forgetting clears every word set, whether few or many names were watched (one test:
        // the filter is one for the process).
        for names in [1, 31, 32, 33, 5000] {
            forget_all();
            for i in 0..names {
                watch(i % 3, format!("sem{i}").as_bytes());
            }
            assert!(may_concern(0, b"sem0"));
            forget_all();
            let set = BITS
                .iter()
                .filter(|w| w.load(Ordering::Relaxed) != 0)
                .count();
            assert_eq!(set, 0, "{names} names watched");
        }
    }
}
