//! The module's settings: `CONFIG SET/GET sem.<name>`, `loadmodule ... <name> <value>`, and
//! `sem.<name>` lines in redis.conf. Read on the hot path as relaxed atomics.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU8, Ordering};

use crate::types::MAX_LEASE_MS;

/// One numeric setting: its name (after `sem.`), bounds, and current value (the default until
/// set).
pub struct Setting {
    pub name: &'static str,
    pub min: i64,
    pub max: i64,
    pub default: i64,
    pub value: AtomicI64,
    /// Whether the value is bytes, which `CONFIG SET` also takes as `64mb` or `1gb`.
    pub bytes: bool,
}

impl Setting {
    const fn new(name: &'static str, min: i64, max: i64, default: i64) -> Self {
        Setting {
            name,
            min,
            max,
            default,
            value: AtomicI64::new(default),
            bytes: false,
        }
    }

    const fn bytes(name: &'static str, min: i64, max: i64, default: i64) -> Self {
        Setting {
            bytes: true,
            ..Setting::new(name, min, max, default)
        }
    }

    pub fn get(&self) -> i64 {
        self.value.load(Ordering::Relaxed)
    }

    /// Sets the value when it is within bounds.
    pub fn set(&self, value: i64) -> Result<(), String> {
        if (self.min..=self.max).contains(&value) {
            self.value.store(value, Ordering::Relaxed);
            Ok(())
        } else {
            Err(format!(
                "sem.{} must be an integer from {} to {}",
                self.name, self.min, self.max
            ))
        }
    }
}

/// The longest lease, in seconds.
pub static MAX_LEASE: Setting =
    Setting::new("max-lease", 1, MAX_LEASE_MS / 1000, MAX_LEASE_MS / 1000);
/// How many clients may wait for one semaphore.
pub static MAX_WAITERS_PER_SEMAPHORE: Setting =
    Setting::new("max-waiters-per-semaphore", 1, 1_000_000_000, 100_000);
/// How many clients may wait in all: each costs the server about 36 KB besides its
/// connection (`memory.rs`), so 25,000 take about 0.9 GB.
pub static MAX_WAITERS: Setting = Setting::new("max-waiters", 1, 1_000_000_000, 25_000);
/// The share of `maxmemory`, in percent, that waiting clients may take together (`memory.rs`).
pub static WAITERS_MAXMEMORY_PERCENT: Setting =
    Setting::new("waiters-maxmemory-percent", 1, 100, 5);
/// The bytes waiting clients may take together on a server without `maxmemory`.
pub static MAX_WAITERS_MEMORY: Setting = Setting::bytes(
    "max-waiters-memory",
    1024 * 1024,
    1 << 50,
    1024 * 1024 * 1024,
);
/// Accepted and kept, but without effect since fair tickets go on from a clock floor
/// (`fencing.rs`): configuration files that set it still load.
pub static FENCING_MARGIN: Setting =
    Setting::new("fencing-margin", 0, 1_000_000_000_000, 1_000_000_000);

pub static SETTINGS: [&Setting; 6] = [
    &MAX_LEASE,
    &MAX_WAITERS_PER_SEMAPHORE,
    &MAX_WAITERS,
    &WAITERS_MAXMEMORY_PERCENT,
    &MAX_WAITERS_MEMORY,
    &FENCING_MARGIN,
];

/// `command-filter 0|1`, a module argument only (the filter is registered at load): whether the
/// module registers its command filter in Redis Cluster where the server can afford one
/// (`server/filter.rs`). A standalone server never gets one. Without it, Cluster calls must
/// name their derived keys (the long form).
static COMMAND_FILTER: AtomicBool = AtomicBool::new(true);

pub fn command_filter() -> bool {
    COMMAND_FILTER.load(Ordering::Relaxed)
}

/// What the `key-events` module argument asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyEvents {
    /// The cheapest way this server offers (`server/events.rs`, `choose`).
    Auto,
    /// Keyspace events.
    Keyspace,
    /// The key server event (Redis 7.2 and later, Valkey).
    Server,
}

/// `key-events auto|keyspace|server`, a module argument only (chosen at load): how the module
/// hears of another client changing a waited semaphore's keys (`server/events.rs`).
static KEY_EVENTS: AtomicU8 = AtomicU8::new(0);

pub fn key_events() -> KeyEvents {
    match KEY_EVENTS.load(Ordering::Relaxed) {
        1 => KeyEvents::Keyspace,
        2 => KeyEvents::Server,
        _ => KeyEvents::Auto,
    }
}

/// Puts every setting back to its default (a new load must not inherit an earlier load's).
pub fn reset() {
    for setting in SETTINGS {
        setting.value.store(setting.default, Ordering::Relaxed);
    }
    COMMAND_FILTER.store(true, Ordering::Relaxed);
    KEY_EVENTS.store(0, Ordering::Relaxed);
}

/// The longest lease allowed now, in milliseconds.
pub fn max_lease_ms() -> i64 {
    MAX_LEASE.get().saturating_mul(1000)
}

/// Applies `loadmodule` arguments: `<name> <value>` pairs.
pub fn apply_module_args(args: &[&[u8]]) -> Result<(), String> {
    if !args.len().is_multiple_of(2) {
        return Err("module arguments come in pairs: <name> <value>".into());
    }
    for pair in args.chunks(2) {
        let name = String::from_utf8_lossy(pair[0]);
        let name = name.strip_prefix("sem.").unwrap_or(&name);
        if name.eq_ignore_ascii_case("command-filter") {
            let on = match pair[1] {
                b"1" | b"yes" => true,
                b"0" | b"no" => false,
                _ => return Err("command-filter must be 1 (yes) or 0 (no)".into()),
            };
            COMMAND_FILTER.store(on, Ordering::Relaxed);
            continue;
        }
        if name.eq_ignore_ascii_case("key-events") {
            let value = match pair[1].to_ascii_lowercase().as_slice() {
                b"auto" => 0,
                b"keyspace" => 1,
                b"server" => 2,
                _ => return Err("key-events must be auto, keyspace or server".into()),
            };
            KEY_EVENTS.store(value, Ordering::Relaxed);
            continue;
        }
        let setting = SETTINGS
            .iter()
            .find(|s| s.name.eq_ignore_ascii_case(name))
            .ok_or_else(|| format!("unknown module argument {name}"))?;
        let value = std::str::from_utf8(pair[1])
            .ok()
            .and_then(|v| v.parse::<i64>().ok())
            .ok_or_else(|| format!("sem.{} must be an integer", setting.name))?;
        setting.set(value)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_refuse_values_out_of_bounds() {
        let setting = Setting::new("x", 1, 10, 5);
        assert_eq!(setting.get(), 5);
        assert!(setting.set(11).is_err());
        assert!(setting.set(0).is_err());
        assert_eq!(setting.get(), 5);
        setting.set(10).unwrap();
        assert_eq!(setting.get(), 10);
    }

    #[test]
    fn module_arguments_come_in_pairs_of_known_names() {
        assert!(apply_module_args(&[b"max-lease"]).is_err());
        assert!(apply_module_args(&[b"nonsense", b"1"]).is_err());
        assert!(apply_module_args(&[b"max-waiters", b"many"]).is_err());
        assert!(apply_module_args(&[b"max-waiters", b"0"]).is_err());
        assert!(apply_module_args(&[b"command-filter", b"maybe"]).is_err());
        apply_module_args(&[b"command-filter", b"no"]).unwrap();
        assert!(!command_filter());
        apply_module_args(&[b"command-filter", b"1"]).unwrap();
        assert!(command_filter());
        assert!(apply_module_args(&[b"key-events", b"sometimes"]).is_err());
        apply_module_args(&[b"key-events", b"SERVER"]).unwrap();
        assert_eq!(key_events(), KeyEvents::Server);
        apply_module_args(&[b"key-events", b"auto"]).unwrap();
        assert_eq!(key_events(), KeyEvents::Auto);
        apply_module_args(&[b"sem.max-waiters", b"77"]).unwrap();
        assert_eq!(MAX_WAITERS.get(), 77);
        MAX_WAITERS.set(MAX_WAITERS.default).unwrap();
    }
}
