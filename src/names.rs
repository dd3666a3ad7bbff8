//! The semaphores somebody waits on, as a filter of their names' hashes that the server's
//! key callbacks ask before anything else: another client's change to a key that is no waited
//! semaphore's (nearly every key the key server event brings) costs a hash and a load, no
//! borrow, no allocation. A name the filter holds may be waited on (the waiting side's registry
//! tells). Names are added when a client starts to wait, and all are forgotten when nobody waits
//! any more. The waiting side's one owner (`state.rs`) holds the filter.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicU16, AtomicU64, AtomicUsize};

use crate::keys::DERIVED;

/// 2^16 bits: with 1,000 waited semaphores about 1.5 % of other keys pass, with 10,000 about 14 %.
const WORDS: usize = 1024;

/// How many set words are remembered (more means many): clearing those alone spares the usual
/// hand-off, whose last waiter leaves after one name was watched, a store to every word.
const TOUCHED: usize = 32;

pub struct Names {
    bits: [AtomicU64; WORDS],
    /// The words set since the filter was last cleared, while they are few (a count above
    /// `TOUCHED` means many).
    touched: [AtomicU16; TOUCHED],
    touched_len: AtomicUsize,
}

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

impl Names {
    pub const fn new() -> Names {
        Names {
            bits: [const { AtomicU64::new(0) }; WORDS],
            touched: [const { AtomicU16::new(0) }; TOUCHED],
            touched_len: AtomicUsize::new(0),
        }
    }

    /// Somebody waits on the semaphore `name` of database `db`.
    pub fn watch(&self, db: i32, name: &[u8]) {
        let (word, mask) = bit(db, name);
        if self.bits[word].fetch_or(mask, Relaxed) != 0 {
            return;
        }
        let len = self.touched_len.load(Relaxed);
        if let Some(slot) = self.touched.get(len) {
            slot.store(word as u16, Relaxed);
        }
        self.touched_len
            .store(len.saturating_add(1).min(TOUCHED + 1), Relaxed);
    }

    fn holds(&self, db: i32, name: &[u8]) -> bool {
        let (word, mask) = bit(db, name);
        self.bits[word].load(Relaxed) & mask != 0
    }

    /// Whether `key` of database `db` may be a waited semaphore's, or one of its derived keys.
    pub fn may_concern(&self, db: i32, key: &[u8]) -> bool {
        if self.holds(db, key) {
            return true;
        }
        // Every derived key's suffix ends in one of these: most keys need no suffix compared.
        matches!(key.last(), Some(b'r' | b's' | b't'))
            && DERIVED.iter().any(|suffix| {
                key.strip_suffix(*suffix)
                    .is_some_and(|name| self.holds(db, name))
            })
    }

    /// Nobody waits any more.
    pub fn forget_all(&self) {
        let len = self.touched_len.swap(0, Relaxed);
        match self.touched.get(..len) {
            Some(touched) => {
                for word in touched {
                    self.bits[usize::from(word.load(Relaxed))].store(0, Relaxed);
                }
            }
            None => {
                for word in &self.bits {
                    word.store(0, Relaxed);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watched_name_and_its_derived_keys_pass_and_few_others_do() {
        let names = Names::new();
        names.watch(0, b"jobs");
        assert!(names.may_concern(0, b"jobs"));
        assert!(names.may_concern(0, b"jobs:owner"));
        assert!(names.may_concern(0, b"jobs:limit"));
        assert!(!names.may_concern(1, b"jobs"));
        let others = (0..1000)
            .filter(|i| names.may_concern(0, format!("other{i}").as_bytes()))
            .count();
        assert!(others < 5, "{others} of 1000 other names pass");
        names.forget_all();
        assert!(!names.may_concern(0, b"jobs"));
        assert!(!names.may_concern(0, b"jobs:owner"));
    }

    /// Forgetting clears every word set, whether few or many names were watched (the same
    /// word watched twice counted once).
    #[test]
    fn forgetting_clears_every_word_set() {
        let names = Box::new(Names::new());
        for count in [1, 31, 32, 33, 5000] {
            for i in 0..count {
                names.watch(i % 3, format!("sem{i}").as_bytes());
                names.watch(i % 3, format!("sem{i}").as_bytes());
            }
            assert!(names.may_concern(0, b"sem0"));
            names.forget_all();
            let set = names.bits.iter().filter(|w| w.load(Relaxed) != 0).count();
            assert_eq!(set, 0, "{count} names watched");
        }
    }
}
