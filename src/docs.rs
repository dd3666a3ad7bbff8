//! The commands' own description, from `commands.json` (Redis's schema for its command docs):
//! the one source of their syntax, flags, key specs and documentation. Registration
//! (`server::command_info`) builds `COMMAND INFO` and `COMMAND DOCS` from it, and
//! `tests/docs.rs` keeps the command reference (docs/commands.md) in step with it.

use std::sync::OnceLock;

use serde_json::Value;

const COMMANDS_JSON: &str = include_str!("../commands.json");

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandDoc {
    pub name: String,
    pub summary: String,
    pub complexity: String,
    pub since: String,
    pub arity: i32,
    /// `WRITE`, `DENYOOM`, `READONLY`.
    pub command_flags: Vec<String>,
    /// `WRITE`, `READ`.
    pub acl_categories: Vec<String>,
    pub key_specs: Vec<KeySpecDoc>,
    pub arguments: Vec<ArgDoc>,
    pub reply: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeySpecDoc {
    pub notes: Option<String>,
    /// `RW`, `RO`, `ACCESS`, `UPDATE`, `INSERT`, `DELETE`.
    pub flags: Vec<String>,
    /// An index spec (the name at this position), or an unknown one (the derived keys).
    pub index: Option<i32>,
    /// With an index spec: the keys' count is at `keynumidx` after it, the first key
    /// `firstkey` after it, each `step` apart (`numsems name ...`); without, the one key at
    /// the index.
    pub keynum: Option<Keynum>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keynum {
    pub keynumidx: i32,
    pub firstkey: i32,
    pub step: i32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArgDoc {
    pub name: String,
    /// `key`, `string`, `integer`, `double`, `pure-token`, `block`.
    pub kind: String,
    pub token: Option<String>,
    pub optional: bool,
    /// The argument repeats (`name [name ...]`).
    pub multiple: bool,
    pub key_spec_index: Option<i32>,
    /// A block's arguments.
    pub subargs: Vec<ArgDoc>,
}

/// Every command, in the file's order.
pub fn all() -> &'static [CommandDoc] {
    static DOCS: OnceLock<Vec<CommandDoc>> = OnceLock::new();
    DOCS.get_or_init(|| parse(COMMANDS_JSON).expect("commands.json is valid (tested)"))
}

/// The description of `name` (as registered, case-insensitive).
pub fn command(name: &str) -> &'static CommandDoc {
    all()
        .iter()
        .find(|doc| doc.name.eq_ignore_ascii_case(name))
        .expect("every command is in commands.json (tested)")
}

fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .map(|items| {
            items
                .iter()
                .filter_map(|item| item.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn text(value: &Value, field: &str) -> Result<String, String> {
    value[field]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| format!("missing \"{field}\""))
}

fn keynum(spec: &Value) -> Option<Keynum> {
    let field = |name: &str| spec[name].as_i64().map(|v| v as i32);
    Some(Keynum {
        keynumidx: field("keynumidx")?,
        firstkey: field("firstkey")?,
        step: field("step")?,
    })
}

fn args(list: &Value) -> Result<Vec<ArgDoc>, String> {
    list.as_array()
        .ok_or("missing arguments")?
        .iter()
        .map(|arg| {
            Ok(ArgDoc {
                name: text(arg, "name")?,
                kind: text(arg, "type")?,
                token: arg["token"].as_str().map(str::to_string),
                optional: arg["optional"].as_bool().unwrap_or(false),
                multiple: arg["multiple"].as_bool().unwrap_or(false),
                key_spec_index: arg["key_spec_index"].as_i64().map(|i| i as i32),
                subargs: match arg.get("arguments") {
                    Some(sub) => args(sub)?,
                    None => Vec::new(),
                },
            })
        })
        .collect()
}

fn parse(json: &str) -> Result<Vec<CommandDoc>, String> {
    let root: serde_json::Map<String, Value> =
        serde_json::from_str(json).map_err(|e| e.to_string())?;
    root.into_iter()
        .map(|(name, doc)| {
            let key_specs = doc["key_specs"]
                .as_array()
                .ok_or("missing key_specs")?
                .iter()
                .map(|spec| KeySpecDoc {
                    notes: spec["notes"].as_str().map(str::to_string),
                    flags: strings(&spec["flags"]),
                    index: spec["begin_search"]["index"]["pos"]
                        .as_i64()
                        .map(|pos| pos as i32),
                    keynum: keynum(&spec["find_keys"]["keynum"]),
                })
                .collect();
            let arguments = args(&doc["arguments"])?;
            Ok(CommandDoc {
                summary: text(&doc, "summary")?,
                complexity: text(&doc, "complexity")?,
                since: text(&doc, "since")?,
                arity: doc["arity"].as_i64().ok_or("missing arity")? as i32,
                command_flags: strings(&doc["command_flags"]),
                acl_categories: strings(&doc["acl_categories"]),
                key_specs,
                arguments,
                reply: text(&doc, "reply")?,
                name,
            })
        })
        .collect()
}

impl ArgDoc {
    /// `name`, `[ID identifier]`, `name [name ...]`, `name limit count [name limit count ...]`.
    #[cfg(test)]
    fn syntax(&self) -> String {
        let word = match (&self.token, self.kind.as_str()) {
            (Some(token), "pure-token") => token.clone(),
            (Some(token), _) => format!("{token} {}", self.name),
            (None, "block") => {
                let words: Vec<String> = self.subargs.iter().map(ArgDoc::syntax).collect();
                words.join(" ")
            }
            (None, "oneof") => {
                let words: Vec<String> = self.subargs.iter().map(ArgDoc::syntax).collect();
                words.join(" | ")
            }
            (None, _) => self.name.clone(),
        };
        match (self.optional, self.multiple) {
            (_, true) => format!("{word} [{word} ...]"),
            (true, false) => format!("[{word}]"),
            (false, false) => word,
        }
    }
}

impl CommandDoc {
    /// The syntax line, as docs/commands.md's headings and redis-cli's hints show it:
    /// `SEM.GET name [JSON]`.
    #[cfg(test)]
    pub fn syntax(&self) -> String {
        let mut line = self.name.clone();
        for arg in &self.arguments {
            line.push(' ');
            line.push_str(&arg.syntax());
        }
        line
    }

    /// The flags string of `RedisModule_CreateCommand`. Every command reports its keys itself
    /// (`getkeys-api`: see `keys.rs`). SEM.RELEASE and SEM.REFRESH never grow memory, so they
    /// are not `deny-oom`: giving a permit back must work exactly when memory is tight.
    pub fn module_flags(&self) -> String {
        let mut flags: Vec<&str> = self
            .command_flags
            .iter()
            .map(|flag| match flag.as_str() {
                "WRITE" => "write",
                "READONLY" => "readonly",
                "DENYOOM" => "deny-oom",
                other => panic!("unknown command flag {other} in commands.json"),
            })
            .collect();
        flags.push("getkeys-api");
        flags.join(" ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::Command;

    #[test]
    fn every_command_is_described_once() {
        let names: Vec<&str> = all().iter().map(|doc| doc.name.as_str()).collect();
        assert_eq!(names.len(), Command::ALL.len());
        for each in Command::ALL {
            let doc = command(each.name());
            assert_eq!(doc.key_specs.len(), 2, "{}", doc.name);
            assert_eq!(doc.key_specs[0].index, Some(1));
            assert_eq!(doc.key_specs[1].index, None, "the derived keys: unknown");
            // The names: the first argument, or every `step`th after numsems.
            match each.set_step() {
                None => {
                    assert_eq!(doc.key_specs[0].keynum, None);
                    assert_eq!(doc.arguments[0].key_spec_index, Some(0));
                }
                Some(step) => {
                    let keynum = doc.key_specs[0].keynum.expect("a keynum spec");
                    assert_eq!((keynum.keynumidx, keynum.firstkey), (0, 1));
                    assert_eq!(keynum.step as usize, step, "{}", doc.name);
                    let names = &doc.arguments[1];
                    assert!(names.multiple, "{}", doc.name);
                    let name = names.subargs.first().unwrap_or(names);
                    assert_eq!(name.key_spec_index, Some(0), "{}", doc.name);
                }
            }
        }
    }

    #[test]
    fn syntax_line_of_a_choice() {
        assert_eq!(command("sem.limit").syntax(), "SEM.LIMIT name [n | CLEAR]");
    }

    #[test]
    fn syntax_lines_of_sets() {
        assert_eq!(
            command("sem.releaseall").syntax(),
            "SEM.RELEASEALL numsems name [name ...] identifier"
        );
        assert_eq!(
            command("sem.acquireall").syntax(),
            "SEM.ACQUIREALL numsems name limit count [name limit count ...] lease \
             [ID identifier] [FAIR] [WITHTICKET] [WAIT seconds] [BOUND]"
        );
    }

    #[test]
    fn syntax_lines() {
        assert_eq!(command("sem.get").syntax(), "SEM.GET name [JSON]");
        assert_eq!(
            command("sem.release").syntax(),
            "SEM.RELEASE name identifier [COUNT k]"
        );
        assert_eq!(command("sem.get").module_flags(), "readonly getkeys-api");
        assert_eq!(
            command("sem.acquire").module_flags(),
            "write deny-oom getkeys-api"
        );
    }
}
