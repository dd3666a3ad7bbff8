//! What `COMMAND INFO` and `COMMAND DOCS` say of each SEM.* command: arity and key specs
//! (`RedisModule_SetCommandInfo`, Redis 7.0+), and ACL categories where the server has module
//! ACL categories (7.2+, Valkey).
//!
//! Two key specs per command: the name at position 1, and the derived keys the command filter
//! inserts after it, as an "unknown" spec. That one sends Redis to the command's own
//! keys-position reply (`getkeys-api`) for ACL checks, Cluster routing and COMMAND GETKEYS,
//! which names exactly the keys of the arguments it is given, with these flags: `%R~` users may
//! call SEM.GET only.

use std::ffi::CString;
use std::os::raw::c_int;

use redis_module::raw;

use crate::keys::Command;

struct Description {
    /// Negative: at least that many arguments, command name included. The filter inserts the
    /// derived keys, so no SEM.* command has an exact arity as far as Redis can see.
    arity: c_int,
    /// How the command uses `<name>`, and the derived keys.
    name_flags: u32,
    derived_flags: u32,
    summary: &'static str,
    complexity: &'static str,
    acl_categories: &'static str,
}

// As Redis flags its own commands (INSERT, UPDATE and DELETE exclude each other): an acquire
// updates and returns data (the ticket), as INCR does; a release deletes, as ZREM does. Any write
// may grant a waiter, which updates the owner set and the counter.
const ACQUIRES: u32 =
    raw::REDISMODULE_CMD_KEY_RW | raw::REDISMODULE_CMD_KEY_ACCESS | raw::REDISMODULE_CMD_KEY_UPDATE;
const UPDATES: u32 = raw::REDISMODULE_CMD_KEY_RW | raw::REDISMODULE_CMD_KEY_UPDATE;
const READS: u32 = raw::REDISMODULE_CMD_KEY_RO | raw::REDISMODULE_CMD_KEY_ACCESS;

fn describe(command: Command) -> Description {
    let prune = "O((1 + E) log N) for N holders and E expired holders removed";
    match command {
        Command::Acquire => Description {
            arity: -4,
            name_flags: ACQUIRES,
            derived_flags: ACQUIRES,
            summary: "Takes a permit of a counting semaphore, or replies nil when it is full",
            complexity: prune,
            acl_categories: "write",
        },
        Command::AcquireFair => Description {
            arity: -4,
            name_flags: ACQUIRES,
            derived_flags: ACQUIRES,
            summary: "Takes a permit of a fair counting semaphore with a fencing ticket",
            complexity: prune,
            acl_categories: "write",
        },
        Command::Refresh => Description {
            arity: -4,
            name_flags: UPDATES,
            derived_flags: UPDATES,
            summary: "Extends a live permit's lease",
            complexity: prune,
            acl_categories: "write",
        },
        Command::Release => Description {
            arity: -3,
            name_flags: raw::REDISMODULE_CMD_KEY_RW | raw::REDISMODULE_CMD_KEY_DELETE,
            derived_flags: UPDATES,
            summary: "Gives a permit back",
            complexity: prune,
            acl_categories: "write",
        },
        Command::Get => Description {
            arity: -2,
            name_flags: READS,
            derived_flags: READS,
            summary: "Counts the live holders of a semaphore, or describes them as JSON",
            complexity: "O(log N + E) for N holders and E expired ones; O(N log N) with JSON",
            acl_categories: "read",
        },
    }
}

/// The flags of `<name>` and of the derived keys, as `command`'s key specs and keys-position
/// replies say.
pub fn key_flags(command: Command) -> (u32, u32) {
    let description = describe(command);
    (description.name_flags, description.derived_flags)
}

/// Registers every command's info. Fails (with the reason logged) when the server refuses it.
pub fn register(ctx: *mut raw::RedisModuleCtx) -> Result<(), String> {
    for command in Command::ALL {
        let description = describe(command);
        let name = CString::new(command.name()).expect("no NUL in command names");
        // SAFETY: GetCommand takes the context of OnLoad and a command this module created.
        let handle = unsafe { raw::RedisModule_GetCommand.unwrap()(ctx, name.as_ptr()) };
        if handle.is_null() {
            return Err(format!("{} is not registered", command.name()));
        }
        set_info(handle, &description)
            .map_err(|()| format!("the server refused the command info of {}", command.name()))?;
        if let Some(set_categories) =
            // SAFETY: a plain read of a function pointer filled in at load (7.2+ only).
            unsafe { raw::RedisModule_SetCommandACLCategories }
        {
            let categories = CString::new(description.acl_categories).expect("no NUL");
            // SAFETY: a command of this module, during OnLoad, and a valid C string.
            if unsafe { set_categories(handle, categories.as_ptr()) }
                != raw::REDISMODULE_OK as c_int
            {
                return Err(format!(
                    "the server refused the ACL categories of {}",
                    command.name()
                ));
            }
        }
    }
    Ok(())
}

fn set_info(handle: *mut raw::RedisModuleCommand, description: &Description) -> Result<(), ()> {
    let summary = CString::new(description.summary).expect("no NUL");
    let complexity = CString::new(description.complexity).expect("no NUL");
    let since = c"0.1.0";
    let notes =
        c"<name>:owner and <name>:counter, inserted after the name by the module's command filter";
    let name_flags = u64::from(description.name_flags);
    let derived_flags = u64::from(description.derived_flags);
    // SAFETY: zeroed key specs are the array terminator the API expects; the unions are
    // written with the variant their search and find types name.
    let mut key_specs: [raw::RedisModuleCommandKeySpec; 3] = unsafe { std::mem::zeroed() };
    key_specs[0].flags = name_flags;
    key_specs[0].begin_search_type =
        raw::RedisModuleKeySpecBeginSearchType_REDISMODULE_KSPEC_BS_INDEX;
    key_specs[0].bs.index.pos = 1;
    key_specs[0].find_keys_type = raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_RANGE;
    key_specs[0].fk.range = raw::RedisModuleCommandKeySpec__bindgen_ty_2__bindgen_ty_1 {
        lastkey: 0,
        keystep: 1,
        limit: 0,
    };
    key_specs[1].notes = notes.as_ptr();
    key_specs[1].flags = derived_flags;
    key_specs[1].begin_search_type =
        raw::RedisModuleKeySpecBeginSearchType_REDISMODULE_KSPEC_BS_UNKNOWN;
    key_specs[1].find_keys_type = raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_UNKNOWN;
    let version = raw::RedisModuleCommandInfoVersion {
        version: 1,
        sizeof_historyentry: std::mem::size_of::<raw::RedisModuleCommandHistoryEntry>(),
        sizeof_keyspec: std::mem::size_of::<raw::RedisModuleCommandKeySpec>(),
        sizeof_arg: std::mem::size_of::<raw::RedisModuleCommandArg>(),
    };
    let info = raw::RedisModuleCommandInfo {
        version: &version,
        summary: summary.as_ptr(),
        complexity: complexity.as_ptr(),
        since: since.as_ptr(),
        history: std::ptr::null_mut(),
        tips: std::ptr::null(),
        arity: description.arity,
        key_specs: key_specs.as_mut_ptr(),
        args: std::ptr::null_mut(),
    };
    // SAFETY: every pointer in `info` is valid for the call; Redis copies what it keeps.
    let status = unsafe { raw::RedisModule_SetCommandInfo.unwrap()(handle, &info) };
    (status == raw::REDISMODULE_OK as c_int)
        .then_some(())
        .ok_or(())
}
