//! The documentation cannot drift from the code, nor point nowhere. No server needed.
//!
//! - docs/commands.md has one section per command of commands.json (the table that feeds
//!   `COMMAND DOCS`), headed by its syntax line, and none for a command that does not exist;
//!   README.md's command table links every command to its section.
//! - Every command line shown (code blocks and `code` spans; CHANGELOG.md aside) names existing
//!   commands and, for each, only options of that command (a line whose reply is an `(error)`
//!   aside).
//! - Every relative link and `#anchor` of README.md, CHANGELOG.md, docs/ and the clients'
//!   READMEs resolves: to a file or folder, and to a heading by GitHub's anchor rules.
//! - Each client package has its own README, named by its metadata, whose examples are lines
//!   of the examples clients/README.md shows (and the clients' tests run).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use serde_json::Value;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The Markdown pages the checks cover.
fn markdown_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = [
        "README.md",
        "CHANGELOG.md",
        "clients/README.md",
        "clients/python/README.md",
        "clients/node/README.md",
        "clients/rust/README.md",
    ]
    .iter()
    .map(|name| root().join(name))
    .collect();
    for dir in ["docs", "docs/bench"] {
        let mut pages: Vec<PathBuf> = fs::read_dir(root().join(dir))
            .unwrap_or_else(|e| panic!("{dir}: {e}"))
            .map(|entry| entry.unwrap().path())
            .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
            .collect();
        pages.sort();
        files.extend(pages);
    }
    files
}

// ---------------------------------------------------------------------------------------------
// Markdown, as far as the checks need it.

/// A line of a page, and whether it is inside a fenced code block.
fn lines_with_fences(text: &str) -> Vec<(&str, bool)> {
    let mut fence: Option<&str> = None;
    let mut out = Vec::new();
    for line in text.lines() {
        let trimmed = line.trim_start();
        let marker = ["```", "~~~"].into_iter().find(|m| trimmed.starts_with(m));
        match (fence, marker) {
            (None, Some(m)) => {
                fence = Some(m);
                out.push((line, true));
            }
            (Some(open), Some(m)) if open == m => {
                fence = None;
                out.push((line, true));
            }
            (Some(_), _) => out.push((line, true)),
            (None, None) => out.push((line, false)),
        }
    }
    out
}

/// The fenced code blocks of a page: (info string, body).
fn code_blocks(text: &str) -> Vec<(String, String)> {
    let mut blocks = Vec::new();
    let mut current: Option<(String, String)> = None;
    for line in text.lines() {
        let trimmed = line.trim_start();
        match current.take() {
            None if trimmed.starts_with("```") => {
                current = Some((
                    trimmed.trim_start_matches('`').trim().to_string(),
                    String::new(),
                ))
            }
            None => {}
            Some(block) if trimmed.starts_with("```") => blocks.push(block),
            Some((info, mut body)) => {
                body.push_str(line);
                body.push('\n');
                current = Some((info, body));
            }
        }
    }
    blocks
}

/// The `code` spans of a line outside code blocks.
fn code_spans(line: &str) -> Vec<&str> {
    line.split('`').skip(1).step_by(2).collect()
}

/// A line without its `code` spans (links inside code are not links).
fn without_code_spans(line: &str) -> String {
    line.split('`').step_by(2).collect::<Vec<_>>().join(" ")
}

/// GitHub's anchor of a heading: its text as rendered (links and code marks gone), lowercased,
/// without punctuation other than `-` and `_`, spaces made `-`.
fn slug(heading: &str) -> String {
    let mut text = String::new();
    let mut rest = heading;
    // [text](target) renders as text.
    while let Some(open) = rest.find('[') {
        let after = &rest[open + 1..];
        match after.find("](") {
            Some(close) if after[close + 2..].contains(')') && !after[..close].contains('[') => {
                text.push_str(&rest[..open]);
                text.push_str(&after[..close]);
                let target = &after[close + 2..];
                rest = &target[target.find(')').unwrap() + 1..];
            }
            _ => {
                text.push_str(&rest[..open + 1]);
                rest = after;
            }
        }
    }
    text.push_str(rest);
    text.trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The headings of a page: (level, text).
fn headings(text: &str) -> Vec<(usize, String)> {
    lines_with_fences(text)
        .into_iter()
        .filter(|(_, fenced)| !fenced)
        .filter_map(|(line, _)| {
            let level = line.chars().take_while(|c| *c == '#').count();
            let title = line[level..].strip_prefix(' ')?;
            (1..=6)
                .contains(&level)
                .then(|| (level, title.trim().trim_end_matches('#').trim().to_string()))
        })
        .collect()
}

/// The anchors a page's headings make; a repeated one gets `-1`, `-2`, ... as on GitHub.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    for (_, title) in headings(text) {
        let base = slug(&title);
        let n = seen.entry(base.clone()).or_insert(0);
        out.insert(if *n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        });
        *n += 1;
    }
    out
}

/// The targets of a page's inline links and images, `[text](target)` and `![alt](target)`,
/// and of its reference definitions, `[label]: target`, outside code; with their line numbers.
fn link_targets(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (number, (line, fenced)) in lines_with_fences(text).into_iter().enumerate() {
        if fenced {
            continue;
        }
        let line = without_code_spans(line);
        let mut rest = line.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let end = after.find(')').unwrap_or(after.len());
            let target = after[..end].split_whitespace().next().unwrap_or("");
            out.push((number + 1, target.trim_matches(['<', '>']).to_string()));
            rest = &after[end..];
        }
        let trimmed = line.trim_start();
        if let Some(close) = trimmed.strip_prefix('[').and_then(|r| r.find("]:")) {
            let target = trimmed[close + 3..].split_whitespace().next().unwrap_or("");
            out.push((number + 1, target.to_string()));
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// commands.json

struct Command {
    name: String,
    syntax: String,
    /// Every token of its arguments, at any depth: `ID`, `COUNT`, `WAIT`, `JSON`, ...
    tokens: BTreeSet<String>,
}

fn arg_syntax(arg: &Value) -> String {
    let name = arg["name"].as_str().expect("an argument's name");
    let token = arg["token"].as_str();
    let sub = || -> Vec<String> {
        arg["arguments"]
            .as_array()
            .expect("its arguments")
            .iter()
            .map(arg_syntax)
            .collect()
    };
    let word = match (token, arg["type"].as_str().expect("an argument's type")) {
        (Some(token), "pure-token") => token.to_string(),
        (Some(token), _) => format!("{token} {name}"),
        (None, "block") => sub().join(" "),
        (None, "oneof") => sub().join(" | "),
        (None, _) => name.to_string(),
    };
    let optional = arg["optional"].as_bool().unwrap_or(false);
    let multiple = arg["multiple"].as_bool().unwrap_or(false);
    match (optional, multiple) {
        (_, true) => format!("{word} [{word} ...]"),
        (true, false) => format!("[{word}]"),
        (false, false) => word,
    }
}

fn collect_tokens(args: &Value, into: &mut BTreeSet<String>) {
    for arg in args.as_array().into_iter().flatten() {
        if let Some(token) = arg["token"].as_str() {
            into.insert(token.to_string());
        }
        collect_tokens(&arg["arguments"], into);
    }
}

/// The module's commands, from commands.json.
fn commands() -> BTreeMap<String, Command> {
    let json: serde_json::Map<String, Value> =
        serde_json::from_str(&read(&root().join("commands.json"))).expect("commands.json");
    json.into_iter()
        .map(|(name, doc)| {
            let args = doc["arguments"].as_array().expect("arguments");
            let mut syntax = name.clone();
            for arg in args {
                syntax.push(' ');
                syntax.push_str(&arg_syntax(arg));
            }
            let mut tokens = BTreeSet::new();
            collect_tokens(&doc["arguments"], &mut tokens);
            let command = Command {
                name: name.clone(),
                syntax,
                tokens,
            };
            (name, command)
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// The checks.

/// Each command of commands.json has exactly one `## <syntax line>` section in
/// docs/commands.md, and every `## SEM.` heading there is a command's syntax line.
#[test]
fn the_command_reference_matches_commands_json() {
    let commands = commands();
    assert!(commands.len() >= 10, "commands.json lists too few commands");
    let page = read(&root().join("docs/commands.md"));
    let sections: Vec<String> = headings(&page)
        .into_iter()
        .filter(|(level, title)| *level == 2 && title.starts_with("SEM."))
        .map(|(_, title)| title)
        .collect();
    let mut problems = Vec::new();
    for command in commands.values() {
        let found = sections.iter().filter(|s| **s == command.syntax).count();
        if found != 1 {
            problems.push(format!(
                "docs/commands.md has {found} sections `## {}` (commands.json's syntax of {})",
                command.syntax, command.name
            ));
        }
    }
    for section in &sections {
        if !commands.values().any(|c| c.syntax == *section) {
            problems.push(format!(
                "docs/commands.md: `## {section}` is no command's syntax in commands.json"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// README.md's command table has one row per command, linking to its section.
#[test]
fn the_readme_links_every_command_to_its_reference() {
    let commands = commands();
    let readme = read(&root().join("README.md"));
    let mut listed = BTreeMap::new();
    for line in readme.lines().filter(|line| line.starts_with("| [`SEM.")) {
        let name = line["| [`".len()..].split('`').next().unwrap().to_string();
        let target = line
            .split("](")
            .nth(1)
            .and_then(|rest| rest.split(')').next())
            .unwrap_or("")
            .to_string();
        assert!(
            listed.insert(name.clone(), target).is_none(),
            "README.md lists {name} twice"
        );
    }
    let names: Vec<&String> = listed.keys().collect();
    let want: Vec<&String> = commands.keys().collect();
    assert_eq!(
        names, want,
        "README.md's command table against commands.json"
    );
    for (name, target) in listed {
        let want = format!("docs/commands.md#{}", slug(&commands[&name].syntax));
        assert_eq!(target, want, "README.md's link for {name}");
    }
}

/// The commands shown in code (blocks and spans) of a page, with the words after each up to
/// the end of the line, a comment or another command; lines whose reply is an error left out.
fn shown_commands(text: &str) -> Vec<(usize, String, Vec<String>)> {
    let lines = lines_with_fences(text);
    let mut out = Vec::new();
    for (index, (line, fenced)) in lines.iter().enumerate() {
        let next = lines[index + 1..]
            .iter()
            .map(|(l, _)| l.trim())
            .find(|l| !l.is_empty())
            .unwrap_or("");
        let pieces: Vec<&str> = if *fenced {
            if next.starts_with("(error)") {
                continue;
            }
            vec![line]
        } else {
            code_spans(line)
        };
        for piece in pieces {
            let piece = piece.split(['#', '|', '&', ';']).next().unwrap_or("");
            let mut current: Option<(String, Vec<String>)> = None;
            for word in piece.split_whitespace() {
                let bare = word.trim_matches(|c: char| "[](),.:\"'".contains(c));
                if let Some(name) = word
                    .find("SEM.")
                    .map(|at| &word[at..])
                    .filter(|w| w[4..].starts_with(|c: char| c.is_ascii_uppercase()))
                {
                    let name: String = name
                        .chars()
                        .take_while(|c| c.is_ascii_uppercase() || *c == '.')
                        .collect();
                    out.extend(current.take().map(|(n, w)| (index + 1, n, w)));
                    current = Some((name.trim_end_matches('.').to_string(), Vec::new()));
                } else if let Some((_, words)) = current.as_mut() {
                    words.push(bare.to_string());
                }
            }
            out.extend(current.map(|(n, w)| (index + 1, n, w)));
        }
    }
    out
}

/// Every command a page shows exists, with options of its own: removing a command or an
/// option from commands.json fails here wherever the docs still use it.
#[test]
fn the_docs_use_only_commands_and_options_that_exist() {
    let commands = commands();
    let mut problems = Vec::new();
    // CHANGELOG.md tells of the past, where an option may have been removed since.
    for file in markdown_files()
        .into_iter()
        .filter(|file| !file.ends_with("CHANGELOG.md"))
    {
        let name = file.strip_prefix(root()).unwrap().display().to_string();
        for (line, command, words) in shown_commands(&read(&file)) {
            let Some(known) = commands.get(&command) else {
                problems.push(format!("{name}:{line}: no command {command}"));
                continue;
            };
            for word in words {
                let option_like = word.len() >= 2
                    && word
                        .chars()
                        .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit())
                    && word.starts_with(|c: char| c.is_ascii_uppercase());
                if option_like && !known.tokens.contains(&word) {
                    problems.push(format!("{name}:{line}: {command} has no option {word}"));
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Every relative link resolves to a file or folder, and every `#anchor` to a heading of the
/// page it names (or of its own page).
#[test]
fn every_relative_link_and_anchor_resolves() {
    let mut problems = Vec::new();
    let mut checked = 0;
    for file in markdown_files() {
        let name = file.strip_prefix(root()).unwrap().display().to_string();
        let text = read(&file);
        for (line, target) in link_targets(&text) {
            if target.is_empty() {
                problems.push(format!("{name}:{line}: an empty link"));
                continue;
            }
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (path, anchor) = match target.split_once('#') {
                Some((path, anchor)) => (path, Some(anchor)),
                None => (target.as_str(), None),
            };
            let resolved = if path.is_empty() {
                file.clone()
            } else {
                file.parent().unwrap().join(path)
            };
            if !resolved.exists() {
                problems.push(format!("{name}:{line}: {target}: no such file"));
                continue;
            }
            if let Some(anchor) = anchor {
                let is_markdown = resolved.extension().is_some_and(|ext| ext == "md");
                if !is_markdown || !anchors(&read(&resolved)).contains(anchor) {
                    problems.push(format!("{name}:{line}: {target}: no such heading"));
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    assert!(
        checked > 50,
        "only {checked} links found: is the parser right?"
    );
}

/// Each client package has its own README, which its metadata names, and whose examples are
/// made of lines of the examples clients/README.md shows (which the clients' tests run), in
/// their order.
/// The packages that cannot reach clients/scripts/redsem.lua when built from their own folder
/// (Python's distribution, Go's embed) ship a copy of it: the copy is the source, byte for byte.
#[test]
fn the_packages_copies_of_the_script_are_its_source() {
    let source = read(&root().join("clients/scripts/redsem.lua"));
    for copy in [
        "clients/python/src/redsem/redsem.lua",
        "clients/go/redsem.lua",
        "clients/node/redsem.lua",
    ] {
        let path = root().join(copy);
        assert!(
            !std::fs::symlink_metadata(&path)
                .unwrap_or_else(|err| panic!("{copy}: {err}"))
                .file_type()
                .is_symlink(),
            "{copy} is a symbolic link: a copy of the package's folder alone would lose it"
        );
        assert!(
            read(&path) == source,
            "{copy} differs from clients/scripts/redsem.lua: copy it again"
        );
    }
}

#[test]
fn every_client_package_has_its_own_readme() {
    let pyproject = read(&root().join("clients/python/pyproject.toml"));
    assert!(
        pyproject
            .lines()
            .any(|l| l.trim() == r#"readme = "README.md""#),
        "clients/python/pyproject.toml names no README.md"
    );
    let cargo = read(&root().join("clients/rust/Cargo.toml"));
    assert!(
        cargo.lines().any(|l| l.trim() == r#"readme = "README.md""#),
        "clients/rust/Cargo.toml names no README.md"
    );
    let package: Value =
        serde_json::from_str(&read(&root().join("clients/node/package.json"))).unwrap();
    let files: Vec<&str> = package["files"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        files.contains(&"README.md"),
        "clients/node/package.json: files"
    );

    let tested = code_blocks(&read(&root().join("clients/README.md")));
    // Examples a package's own tests run as written in its README: (what the example names,
    // the test file, what in it runs the example).
    type OwnRun = (&'static str, &'static str, &'static str);
    let python_own: &[OwnRun] = &[(
        "RedisCluster",
        "clients/python/tests/test_cluster.py",
        "def test_the_readmes_cluster_example",
    )];
    let node_own: &[OwnRun] = &[
        (
            "Cluster",
            "clients/node/test/cluster.test.js",
            "the README's cluster example, as written there",
        ),
        (
            "new Redis(6379)",
            "clients/node/test/redsem.test.js",
            "the package README's example, as written there",
        ),
    ];
    let rust_own: &[OwnRun] = &[
        (
            "redsem_client::Cluster",
            "clients/rust/tests/cluster.rs",
            "// README cluster example begins",
        ),
        (
            "redsem_client::aio",
            "clients/rust/tests/aio.rs",
            "// README async example begins",
        ),
    ];
    for (dir, languages, own) in [
        ("python", &["python"][..], python_own),
        ("node", &["js", "javascript"][..], node_own),
        ("rust", &["rust"][..], rust_own),
    ] {
        let readme = read(&root().join(format!("clients/{dir}/README.md")));
        let examples: Vec<String> = code_blocks(&readme)
            .into_iter()
            .filter(|(info, _)| languages.contains(&info.as_str()))
            .map(|(_, body)| body)
            .collect();
        assert!(
            !examples.is_empty(),
            "clients/{dir}/README.md has no example"
        );
        for example in examples {
            let run_by_own_test = own.iter().any(|(names, file, runs)| {
                example.contains(names) && read(&root().join(file)).contains(runs)
            });
            if run_by_own_test {
                continue;
            }
            let shown = tested.iter().any(|(info, body)| {
                let mut lines = body.lines();
                languages.contains(&info.as_str())
                    && example.lines().all(|want| lines.any(|line| line == want))
            });
            assert!(
                shown,
                "clients/{dir}/README.md: this example is not made of lines of one of \
                 clients/README.md's (tested) examples, in order:\n{example}"
            );
        }
        for section in ["Install", "Errors"] {
            assert!(
                headings(&readme).iter().any(|(_, title)| title == section),
                "clients/{dir}/README.md has no section {section}"
            );
        }
    }
}

#[test]
fn slugs_follow_githubs_rules() {
    assert_eq!(slug("SEM.LIMIT name [n | CLEAR]"), "semlimit-name-n--clear");
    assert_eq!(
        slug("What `WAIT` makes durable, and what it does not"),
        "what-wait-makes-durable-and-what-it-does-not"
    );
    assert_eq!(
        slug("How a call's derived keys are declared"),
        "how-a-calls-derived-keys-are-declared"
    );
    assert_eq!(slug("See [the docs](docs/x.md) now"), "see-the-docs-now");
    let page = "# A\n\n## Notes\n\n```\n# not a heading\n```\n\n## Notes\n";
    let want: BTreeSet<String> = ["a", "notes", "notes-1"].map(String::from).into();
    assert_eq!(anchors(page), want);
}
