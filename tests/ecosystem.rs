//! What makes the module feel native: COMMAND DOCS from commands.json, INFO sem, the sem.*
//! configs (CONFIG SET/GET, loadmodule arguments, redis.conf, CONFIG REWRITE).

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use redis::Value;

#[test]
fn command_docs_come_from_commands_json() {
    let server = Server::start();
    let mut c = server.connection();
    let spec: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/commands.json")).unwrap(),
    )
    .unwrap();
    for (name, doc) in spec.as_object().unwrap() {
        let docs: Vec<Value> = run(&mut c, &["COMMAND", "DOCS", name]);
        let text = format!("{docs:?}");
        let summary = doc["summary"].as_str().unwrap();
        assert!(text.contains(summary), "{name}: {text}");
        for arg in doc["arguments"].as_array().unwrap() {
            let arg_name = arg["name"].as_str().unwrap();
            assert!(
                text.contains(&format!("\"{arg_name}\"")),
                "{name} lacks {arg_name}"
            );
            if let Some(token) = arg["token"].as_str() {
                assert!(
                    text.contains(&format!("\"{token}\"")),
                    "{name} lacks {token}"
                );
            }
        }
        let info: Vec<Vec<Value>> = run(&mut c, &["COMMAND", "INFO", name]);
        assert_eq!(
            info[0][1],
            Value::Int(doc["arity"].as_i64().unwrap()),
            "{name} arity"
        );
    }
}

#[test]
fn info_sem_counts_what_happened() {
    let server = Server::start();
    let mut c = server.connection();
    let _: String = run(&mut c, &["SEM.ACQUIREFAIR", "i", "1", "0.1", "ID", "short"]);
    let _: String = run(&mut c, &["SEM.ACQUIREFAIR", "i", "2", "30", "ID", "long"]);
    let _: Option<String> = run(&mut c, &["SEM.ACQUIREFAIR", "i", "2", "30", "ID", "third"]);
    let _: String = run(&mut c, &["SEM.ACQUIREFAIR", "i", "2", "30", "ID", "long"]);
    std::thread::sleep(Duration::from_millis(150));
    let _: i64 = run(&mut c, &["SEM.REFRESH", "i", "short", "10"]);
    let _: i64 = run(&mut c, &["SEM.REFRESH", "i", "long", "10"]);
    let _: i64 = run(&mut c, &["SEM.RELEASE", "i", "long"]);
    let info = info_sem(&mut c);
    let want = [
        ("sem_acquired", 2),
        ("sem_renewed", 1),
        ("sem_refused", 1),
        ("sem_refreshed", 1),
        ("sem_released", 1),
        ("sem_lost", 1),
        ("sem_expired", 1),
        ("sem_waits_started", 0),
        ("sem_waiters", 0),
        ("sem_bound_holders", 0),
    ];
    for (field, value) in want {
        assert_eq!(info.get(field), Some(&value), "{field} in {info:?}");
    }

    // A wait that times out, and a BOUND permit.
    let mut holder = server.connection();
    let _: String = run(&mut holder, &["SEM.ACQUIRE", "w", "1", "10", "BOUND"]);
    let none: Option<String> = run(&mut c, &["SEM.ACQUIRE", "w", "1", "10", "WAIT", "0.05"]);
    assert_eq!(none, None);
    let info = info_sem(&mut c);
    assert_eq!(info["sem_waits_started"], 1);
    assert_eq!(info["sem_waits_timed_out"], 1);
    assert_eq!(info["sem_bound_holders"], 1);
    drop(holder);
    wait_until(
        "the BOUND permit came back",
        Duration::from_secs(10),
        || info_sem(&mut c)["sem_bound_released"] == 1,
    );
    assert_eq!(info_sem(&mut c)["sem_bound_holders"], 0);

    // Every wait that ends is counted once: granted, timed out, or otherwise (CLIENT UNBLOCK,
    // a client that leaves). Once nobody waits, no timer stays armed.
    let _: String = run(&mut c, &["SEM.ACQUIRE", "u", "1", "30", "ID", "h"]);
    let waiting = |c: &mut redis::Connection, waiters: u64| {
        let socket = Waiter::send(server.port, "SEM.ACQUIRE u 1 30 WAIT 100");
        wait_until("the client waits", Duration::from_secs(10), || {
            info_sem(c)["sem_waiters"] == waiters
        });
        socket
    };
    let unblocked = waiting(&mut c, 1);
    let unblocked_id = unblocked.id.to_string();
    let _: i64 = run(&mut c, &["CLIENT", "UNBLOCK", &unblocked_id]);
    let leaving = waiting(&mut c, 1);
    drop(leaving);
    wait_until("the client left", Duration::from_secs(10), || {
        info_sem(&mut c)["sem_waiters"] == 0
    });
    let _granted = waiting(&mut c, 1);
    let _: i64 = run(&mut c, &["SEM.RELEASE", "u", "h"]);
    let info = info_sem(&mut c);
    assert_eq!(info["sem_waits_started"], 4, "{info:?}");
    assert_eq!(info["sem_waits_granted"], 1, "{info:?}");
    assert_eq!(info["sem_waits_timed_out"], 1, "{info:?}");
    assert_eq!(info["sem_waits_cancelled"], 2, "{info:?}");
    assert_eq!(info["sem_waiters"], 0, "{info:?}");
    // (Work deferred to the timer, such as serving the line after a client left, may still be
    // pending for a moment.)
    wait_until("the timer is stopped", Duration::from_secs(10), || {
        info_sem(&mut c)["sem_armed_timers"] == 0
    });
}

/// A raw connection that sends one command and never reads its reply: dropping it is a client
/// that leaves while it waits.
struct Waiter {
    id: i64,
    _socket: std::net::TcpStream,
}

impl Waiter {
    fn send(port: u16, line: &str) -> Waiter {
        use std::io::{BufRead, BufReader, Write};
        let mut socket = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
        socket.write_all(b"CLIENT ID\r\n").expect("send");
        let mut reply = String::new();
        BufReader::new(socket.try_clone().expect("clone"))
            .read_line(&mut reply)
            .expect("CLIENT ID");
        let id = reply.trim().trim_start_matches(':').parse().expect("an id");
        socket
            .write_all(format!("{line}\r\n").as_bytes())
            .expect("send");
        Waiter {
            id,
            _socket: socket,
        }
    }
}

/// MODULE LIST reports the crate's version, encoded as Redis modules do (1.2.3 is 10203), so
/// a server shows which release it runs.
#[test]
fn module_list_reports_the_crates_version() {
    let server = Server::start();
    let mut c = server.connection();
    let modules: Vec<Vec<Value>> = run(&mut c, &["MODULE", "LIST"]);
    let fields = |module: &Vec<Value>| -> BTreeMap<String, Value> {
        module
            .chunks(2)
            .map(|pair| (redis::from_redis_value(&pair[0]).unwrap(), pair[1].clone()))
            .collect()
    };
    let sem = modules
        .iter()
        .map(fields)
        .find(|module| module.get("name") == Some(&Value::BulkString(b"sem".to_vec())))
        .expect("MODULE LIST has no module named sem");
    let [major, minor, patch] = [
        env!("CARGO_PKG_VERSION_MAJOR"),
        env!("CARGO_PKG_VERSION_MINOR"),
        env!("CARGO_PKG_VERSION_PATCH"),
    ]
    .map(|part| part.parse::<i64>().unwrap());
    assert_eq!(sem["ver"], Value::Int(major * 10_000 + minor * 100 + patch));
}

/// One version for all: the client packages carry the module's (the crate's) version, and the
/// CHANGELOG has an entry for it.
#[test]
fn the_packages_and_changelog_carry_the_crates_version() {
    let version = env!("CARGO_PKG_VERSION");
    let read = |path: &str| {
        std::fs::read_to_string(format!("{}/{path}", env!("CARGO_MANIFEST_DIR")))
            .unwrap_or_else(|err| panic!("{path}: {err}"))
    };
    let version_line = |path: &str| -> String {
        read(path)
            .lines()
            .find_map(|line| line.strip_prefix("version = "))
            .unwrap_or_else(|| panic!("{path} has no version line"))
            .trim_matches('"')
            .to_string()
    };
    assert_eq!(version_line("clients/python/pyproject.toml"), version);
    assert_eq!(version_line("clients/rust/Cargo.toml"), version);
    let package: serde_json::Value =
        serde_json::from_str(&read("clients/node/package.json")).unwrap();
    assert_eq!(package["version"], version);
    // The Java package's own version: the first <version> after its <artifactId>.
    let pom = read("clients/java/pom.xml");
    let after_artifact = &pom[pom
        .find("<artifactId>redsem-client</artifactId>")
        .expect("clients/java/pom.xml names redsem-client")..];
    let java = after_artifact
        .split("<version>")
        .nth(1)
        .and_then(|rest| rest.split("</version>").next())
        .expect("clients/java/pom.xml has a version");
    assert_eq!(java, version, "clients/java/pom.xml");
    let changelog = read("CHANGELOG.md");
    assert!(
        changelog
            .lines()
            .any(|line| line == format!("## {version}")),
        "CHANGELOG.md has no section ## {version}"
    );
}

/// The redis.conf snippet of docs/operations.md, as written there (its `loadmodule` line aside:
/// the harness loads the module), starts a server with those settings.
#[test]
fn the_readmes_redis_conf_snippet_works() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/operations.md"))
            .unwrap();
    let snippet: Vec<&str> = readme
        .lines()
        .skip_while(|line| *line != "# redis.conf")
        .skip(1)
        .take_while(|line| !line.starts_with("```"))
        .filter(|line| !line.starts_with("loadmodule "))
        .collect();
    assert!(
        snippet.len() > 5,
        "docs/operations.md has no redis.conf snippet"
    );
    let server = Server::start_configured(&snippet.join("\n"), &[], &["--save", ""]);
    let mut c = server.connection();
    for (name, want) in [
        ("sem.max-lease", "3600"),
        ("sem.max-waiters-per-semaphore", "10000"),
        ("sem.max-waiters", "20000"),
        ("sem.waiters-maxmemory-percent", "5"),
        ("sem.max-waiters-memory", "536870912"),
        ("maxmemory-policy", "noeviction"),
    ] {
        let got: Vec<String> = run(&mut c, &["CONFIG", "GET", name]);
        assert_eq!(got, [name, want]);
    }
}

#[test]
fn settings_are_module_configs() {
    let server = Server::start_configured(
        "sem.max-waiters-per-semaphore 1\n",
        &[],
        &["--save", "", "--appendonly", "no"],
    );
    let mut c = server.connection();
    let max: Vec<String> = run(&mut c, &["CONFIG", "GET", "sem.max-waiters-per-semaphore"]);
    assert_eq!(max, ["sem.max-waiters-per-semaphore", "1"]);

    // The maximum lease.
    let _: String = run(&mut c, &["CONFIG", "SET", "sem.max-lease", "60"]);
    let err = error_of(&mut c, &["SEM.ACQUIRE", "l", "1", "60.001"]);
    assert!(
        err.starts_with("ERR lease must be") && err.contains("at most 60,"),
        "{err}"
    );
    let id: Option<String> = run(&mut c, &["SEM.ACQUIRE", "l", "1", "60"]);
    assert!(id.is_some());
    let err = error_of(&mut c, &["CONFIG", "SET", "sem.max-lease", "0"]);
    assert!(err.contains("between 1 and 31536000"), "{err}");
    let err = error_of(&mut c, &["CONFIG", "SET", "sem.max-lease", "soon"]);
    assert!(err.starts_with("ERR"), "{err}");

    // One waiter per semaphore: a second one gets a clear error and changes nothing.
    let _: String = run(&mut c, &["SEM.ACQUIRE", "w", "1", "30", "ID", "h"]);
    let mut waiting = server.connection();
    let blocked = std::thread::spawn(move || -> Option<String> {
        run(&mut waiting, &["SEM.ACQUIRE", "w", "1", "30", "WAIT", "5"])
    });
    wait_until("one waiter", Duration::from_secs(5), || {
        info_sem(&mut c)["sem_waiters"] == 1
    });
    let err = error_of(&mut c, &["SEM.ACQUIRE", "w", "1", "30", "WAIT", "5"]);
    assert!(
        err.starts_with("ERR 1 clients already wait for this semaphore"),
        "{err}"
    );
    assert_eq!(info_sem(&mut c)["sem_waiters"], 1);
    let _: i64 = run(&mut c, &["SEM.RELEASE", "w", "h"]);
    assert!(blocked.join().unwrap().is_some(), "the waiter was served");

    // CONFIG REWRITE writes them into redis.conf.
    let _: String = run(&mut c, &["CONFIG", "SET", "sem.max-waiters", "1234"]);
    let _: String = run(&mut c, &["CONFIG", "REWRITE"]);
    let written = std::fs::read_to_string(server.dir.join("redis.conf")).unwrap();
    assert!(written.contains("sem.max-waiters 1234"), "{written}");
    assert!(written.contains("sem.max-lease 60"), "{written}");
}

#[test]
fn module_arguments_set_the_configs_and_bad_ones_refuse_to_load() {
    let server = Server::start_configured(
        "",
        &["max-lease", "30", "fencing-margin", "7"],
        &["--save", "", "--appendonly", "no"],
    );
    let mut c = server.connection();
    let all: Vec<String> = run(&mut c, &["CONFIG", "GET", "sem.*"]);
    let all: BTreeMap<String, String> = all
        .chunks(2)
        .map(|pair| (pair[0].clone(), pair[1].clone()))
        .collect();
    assert_eq!(all["sem.max-lease"], "30");
    assert_eq!(all["sem.fencing-margin"], "7");
    assert_eq!(all["sem.max-waiters"], "25000");
    // Accepted so that older configuration files load, but tickets no longer jump by it: a
    // fresh name's tickets go one by one from the clock of its first grant.
    let fresh = FirstGrant::before(&mut c);
    let tickets: Vec<u64> = (0..2)
        .map(|_| run::<(String, u64)>(&mut c, &["SEM.ACQUIREFAIR", "f", "2", "10", "WITHTICKET"]).1)
        .collect();
    let first = fresh.ticket(&mut c, tickets[0] as i64) as u64;
    assert_eq!(tickets, [first, first + 1]);

    let redis_server = std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".into());
    let dir = std::env::temp_dir().join(format!("redsem-badargs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .unwrap()
        .port()
        .to_string();
    let out = std::process::Command::new(redis_server)
        .args(["--bind", "127.0.0.1", "--port", &port, "--dir"])
        .arg(&dir)
        .arg("--loadmodule")
        .arg(module_path())
        .args(["max-lease", "0"])
        .output()
        .expect("redis-server");
    assert!(!out.status.success(), "a bad argument must refuse to load");
    let log = String::from_utf8_lossy(&out.stdout);
    assert!(
        log.contains("sem.max-lease must be an integer from 1 to"),
        "{log}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
