//! What `COMMAND INFO` and `COMMAND DOCS` say of each SEM.* command, built from
//! `commands.json` (`docs.rs`): summary, complexity, arity, key specs and arguments
//! (`RedisModule_SetCommandInfo`, Redis 7.0+), and ACL categories where the server has module
//! ACL categories (7.2+, Valkey), with a `semaphore` category of their own where the server can
//! add one.
//!
//! Two key specs per command: the name at position 1, and the derived keys the command filter
//! inserts after it, as an "unknown" spec. That one sends Redis to the command's own
//! keys-position reply (`getkeys-api`) for ACL checks, Cluster routing and COMMAND GETKEYS,
//! which names exactly the keys of the arguments it is given, with the spec's flags: `%R~`
//! users may call SEM.GET only.

use std::ffi::CString;
use std::os::raw::c_int;
use std::sync::OnceLock;

use redis_module::raw;

use crate::docs::{self, ArgDoc, CommandDoc};
use crate::keys::Command;

/// The `REDISMODULE_CMD_KEY_*` bits of commands.json's key-spec flags.
fn key_flag_bits(flags: &[String]) -> u32 {
    flags
        .iter()
        .map(|flag| match flag.as_str() {
            "RO" => raw::REDISMODULE_CMD_KEY_RO,
            "RW" => raw::REDISMODULE_CMD_KEY_RW,
            "OW" => raw::REDISMODULE_CMD_KEY_OW,
            "RM" => raw::REDISMODULE_CMD_KEY_RM,
            "ACCESS" => raw::REDISMODULE_CMD_KEY_ACCESS,
            "UPDATE" => raw::REDISMODULE_CMD_KEY_UPDATE,
            "INSERT" => raw::REDISMODULE_CMD_KEY_INSERT,
            "DELETE" => raw::REDISMODULE_CMD_KEY_DELETE,
            other => panic!("unknown key-spec flag {other} in commands.json"),
        })
        .fold(0, |bits, bit| bits | bit)
}

/// The flags of `<name>` and of the derived keys, as `command`'s key specs and keys-position
/// replies say.
pub fn key_flags(command: Command) -> (u32, u32) {
    // Read from commands.json once: every call that inserts its own keys asks.
    static FLAGS: OnceLock<[(u32, u32); Command::ALL.len()]> = OnceLock::new();
    FLAGS.get_or_init(|| {
        Command::ALL.map(|command| {
            let doc = docs::command(command.name());
            (
                key_flag_bits(&doc.key_specs[0].flags),
                key_flag_bits(&doc.key_specs[1].flags),
            )
        })
    })[command as usize]
}

/// The ACL category redsem adds where the server can (`RedisModule_AddACLCategory`).
const CATEGORY: &str = "semaphore";

/// Registers every command's info. Fails (with the reason) when the server refuses it.
pub fn register(ctx: *mut raw::RedisModuleCtx) -> Result<(), String> {
    // SAFETY: plain reads of function pointers filled in at load (newer servers only).
    let (add_category, set_categories) = unsafe {
        (
            raw::RedisModule_AddACLCategory,
            raw::RedisModule_SetCommandACLCategories,
        )
    };
    // Adding fails when the category exists already: a server keeps it after MODULE UNLOAD,
    // and a reload must put the commands back in it (an ACL rule `-@semaphore` relies on it).
    let own_category = add_category.map(|add| {
        let name = CString::new(CATEGORY).expect("no NUL");
        // SAFETY: the OnLoad context and a C string.
        unsafe { add(ctx, name.as_ptr()) };
        CATEGORY
    });
    for command in Command::ALL {
        let doc = docs::command(command.name());
        let name = CString::new(command.name()).expect("no NUL in command names");
        // SAFETY: GetCommand takes the context of OnLoad and a command this module created.
        let handle = unsafe { raw::RedisModule_GetCommand.unwrap()(ctx, name.as_ptr()) };
        if handle.is_null() {
            return Err(format!("{} is not registered", command.name()));
        }
        set_info(handle, doc)
            .map_err(|()| format!("the server refused the command info of {}", command.name()))?;
        if let Some(set_categories) = set_categories {
            let standard: Vec<String> = doc
                .acl_categories
                .iter()
                .map(|c| c.to_lowercase())
                .collect();
            let set = |extra: Option<&str>| {
                let all: Vec<&str> = standard.iter().map(String::as_str).chain(extra).collect();
                let categories = CString::new(all.join(" ")).expect("no NUL");
                // SAFETY: a command of this module, during OnLoad, and a valid C string.
                let status = unsafe { set_categories(handle, categories.as_ptr()) };
                status == raw::REDISMODULE_OK as c_int
            };
            // Without the module's own category if the server has none by that name after all.
            if !(set(own_category) || set(None)) {
                return Err(format!(
                    "the server refused the ACL categories of {}",
                    command.name()
                ));
            }
        }
    }
    Ok(())
}

/// C strings that must live until `SetCommandInfo` returns (Redis copies what it keeps).
#[derive(Default)]
struct Strings(Vec<CString>);

impl Strings {
    fn keep(&mut self, text: &str) -> *const std::os::raw::c_char {
        let string = CString::new(text).expect("no NUL in commands.json");
        let ptr = string.as_ptr();
        self.0.push(string);
        ptr
    }
}

fn arg_type(kind: &str) -> raw::RedisModuleCommandArgType {
    match kind {
        "key" => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_KEY,
        "string" => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_STRING,
        "integer" => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_INTEGER,
        "double" => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_DOUBLE,
        "pure-token" => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_PURE_TOKEN,
        "block" => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_BLOCK,
        "oneof" => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_ONEOF,
        other => panic!("unknown argument type {other} in commands.json"),
    }
}

/// One argument for `SetCommandInfo`; a block's subarguments are kept in `blocks` (zero-
/// terminated arrays that must live until the call returns, as the strings).
fn command_arg(
    arg: &ArgDoc,
    strings: &mut Strings,
    blocks: &mut Vec<Vec<raw::RedisModuleCommandArg>>,
) -> raw::RedisModuleCommandArg {
    // SAFETY: an all-zero argument is valid (null strings, no subarguments).
    let mut out: raw::RedisModuleCommandArg = unsafe { std::mem::zeroed() };
    out.name = strings.keep(&arg.name);
    out.type_ = arg_type(&arg.kind);
    out.key_spec_index = arg.key_spec_index.unwrap_or(-1);
    if let Some(token) = &arg.token {
        out.token = strings.keep(token);
    }
    let mut flags = 0;
    if arg.optional {
        flags |= raw::REDISMODULE_CMD_ARG_OPTIONAL;
    }
    if arg.multiple {
        flags |= raw::REDISMODULE_CMD_ARG_MULTIPLE;
    }
    out.flags = flags as c_int;
    if !arg.subargs.is_empty() {
        let mut subargs: Vec<raw::RedisModuleCommandArg> = arg
            .subargs
            .iter()
            .map(|sub| command_arg(sub, strings, blocks))
            .collect();
        // SAFETY: the zeroed terminator.
        subargs.push(unsafe { std::mem::zeroed() });
        // The vector's heap buffer does not move when the vector itself is moved.
        out.subargs = subargs.as_mut_ptr();
        blocks.push(subargs);
    }
    out
}

fn set_info(handle: *mut raw::RedisModuleCommand, doc: &CommandDoc) -> Result<(), ()> {
    let mut strings = Strings::default();
    let summary = strings.keep(&doc.summary);
    let complexity = strings.keep(&doc.complexity);
    let since = strings.keep(&doc.since);
    // SAFETY: zeroed key specs are the array terminator the API expects; the unions are
    // written with the variant their search and find types name.
    let mut key_specs: Vec<raw::RedisModuleCommandKeySpec> =
        vec![unsafe { std::mem::zeroed() }; doc.key_specs.len() + 1];
    for (spec, out) in doc.key_specs.iter().zip(&mut key_specs) {
        out.flags = u64::from(key_flag_bits(&spec.flags));
        if let Some(notes) = &spec.notes {
            out.notes = strings.keep(notes);
        }
        match spec.index {
            Some(pos) => {
                out.begin_search_type =
                    raw::RedisModuleKeySpecBeginSearchType_REDISMODULE_KSPEC_BS_INDEX;
                out.bs.index.pos = pos;
                if let Some(keynum) = spec.keynum {
                    out.find_keys_type =
                        raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_KEYNUM;
                    out.fk.keynum = raw::RedisModuleCommandKeySpec__bindgen_ty_2__bindgen_ty_2 {
                        keynumidx: keynum.keynumidx,
                        firstkey: keynum.firstkey,
                        keystep: keynum.step,
                    };
                } else {
                    out.find_keys_type =
                        raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_RANGE;
                    out.fk.range = raw::RedisModuleCommandKeySpec__bindgen_ty_2__bindgen_ty_1 {
                        lastkey: 0,
                        keystep: 1,
                        limit: 0,
                    };
                }
            }
            None => {
                out.begin_search_type =
                    raw::RedisModuleKeySpecBeginSearchType_REDISMODULE_KSPEC_BS_UNKNOWN;
                out.find_keys_type =
                    raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_UNKNOWN;
            }
        }
    }
    let mut blocks = Vec::new();
    let mut args: Vec<raw::RedisModuleCommandArg> = doc
        .arguments
        .iter()
        .map(|arg| command_arg(arg, &mut strings, &mut blocks))
        .collect();
    // SAFETY: the zeroed terminator.
    args.push(unsafe { std::mem::zeroed() });
    let version = raw::RedisModuleCommandInfoVersion {
        version: 1,
        sizeof_historyentry: std::mem::size_of::<raw::RedisModuleCommandHistoryEntry>(),
        sizeof_keyspec: std::mem::size_of::<raw::RedisModuleCommandKeySpec>(),
        sizeof_arg: std::mem::size_of::<raw::RedisModuleCommandArg>(),
    };
    let info = raw::RedisModuleCommandInfo {
        version: &version,
        summary,
        complexity,
        since,
        history: std::ptr::null_mut(),
        tips: std::ptr::null(),
        arity: doc.arity,
        key_specs: key_specs.as_mut_ptr(),
        args: args.as_mut_ptr(),
    };
    // SAFETY: every pointer in `info` is valid for the call; Redis copies what it keeps.
    let status = unsafe { raw::RedisModule_SetCommandInfo.unwrap()(handle, &info) };
    (status == raw::REDISMODULE_OK as c_int)
        .then_some(())
        .ok_or(())
}
