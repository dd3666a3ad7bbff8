//! Redis Cluster with real redis-server nodes: the commands route by the name, a semaphore's
//! keys stay in its slot through slot migrations (by hand and by `redis-cli --cluster
//! reshard`) without a ticket ever being handed out twice, ACLs see every key, and a failover
//! never repeats a ticket.
//!
//! Each test starts its own cluster; they run one at a time (a cluster is several processes,
//! and the machine may have two cores).

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::thread::{self, sleep};
use std::time::{Duration, Instant};

use redis::cluster::ClusterConnection;
use serde_json::Value as Json;

use common::cluster::*;
use common::state::snapshot_of_all_keys;
use common::*;

static ONE_CLUSTER_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Runs the tests of this file one after another, whatever `--test-threads` says.
fn one_cluster_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_CLUSTER_AT_A_TIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Runs one command through the cluster client, which follows MOVED and ASK and retries
/// TRYAGAIN itself; what it gives up on is retried here after a pause, until `within`.
fn query_retrying<T: redis::FromRedisValue>(
    conn: &mut ClusterConnection,
    args: &[&str],
    within: Duration,
    retries: &AtomicU64,
) -> Result<T, String> {
    let deadline = Instant::now() + within;
    loop {
        match command(args).query::<T>(conn) {
            Ok(value) => return Ok(value),
            Err(err) if is_transient(&err) && Instant::now() < deadline => {
                retries.fetch_add(1, Ordering::Relaxed);
                sleep(Duration::from_millis(5));
            }
            Err(err) => return Err(format!("{args:?}: {}", error_text(&err))),
        }
    }
}

// The plain-connection helpers of `common`, sending SEM.* calls in the form the cluster's
// servers take (`common::cluster::sem_form`): these shadow the glob import.

fn run<T: redis::FromRedisValue>(conn: &mut redis::Connection, args: &[&str]) -> T {
    command(args)
        .query(conn)
        .unwrap_or_else(|err| panic!("{args:?} failed: {}", error_text(&err)))
}

fn try_run<T: redis::FromRedisValue>(
    conn: &mut redis::Connection,
    args: &[&str],
) -> redis::RedisResult<T> {
    command(args).query(conn)
}

fn error_of(conn: &mut redis::Connection, args: &[&str]) -> String {
    match try_run::<redis::Value>(conn, args) {
        Ok(value) => panic!("{args:?} succeeded with {value:?}"),
        Err(err) => error_text(&err),
    }
}

/// Runs one command through the cluster client, which must succeed at once.
fn cluster_run<T: redis::FromRedisValue>(conn: &mut ClusterConnection, args: &[&str]) -> T {
    command(args)
        .query(conn)
        .unwrap_or_else(|err| panic!("{args:?} failed: {}", error_text(&err)))
}

/// The error a command sent through the cluster client gets.
fn cluster_error(conn: &mut ClusterConnection, args: &[&str]) -> String {
    match command(args).query::<redis::Value>(conn) {
        Ok(value) => panic!("{args:?} succeeded with {value:?}"),
        Err(err) => error_text(&err),
    }
}

/// `SEM.GET <name> JSON`, parsed.
fn get_json(conn: &mut ClusterConnection, name: &str) -> Json {
    let text: String = cluster_run(conn, &["SEM.GET", name, "JSON"]);
    serde_json::from_str(&text).expect("SEM.GET JSON is JSON")
}

/// The keys of a semaphore the module leaves after a command, fair or plain, with holders.
fn keys_of(name: &str, fair: bool) -> Vec<String> {
    if fair {
        vec![
            name.to_string(),
            format!("{name}:counter"),
            format!("{name}:owner"),
        ]
    } else {
        vec![name.to_string()]
    }
}

/// Waits until the replica of the primary `conn` is connected to has processed everything the
/// primary did so far. `WAIT` waits for the offset of the connection's own last write, so this
/// writes first: a key next to `name` (in its slot, served by the primary), deleted at once.
fn wait_for_replica_of(conn: &mut redis::Connection, name: &str) {
    let mark = format!("{name}:wait");
    let _: () = run(conn, &["SET", &mark, "1"]);
    let _: () = run(conn, &["DEL", &mark]);
    let acked: i64 = run(conn, &["WAIT", "1", "5000"]);
    assert_eq!(acked, 1, "the replica did not acknowledge in time");
}

/// Every key on every node except `owner` that belongs to one of `names`.
fn stray_keys(cluster: &Cluster, owner: usize, names: &[String]) -> Vec<(usize, String)> {
    cluster
        .alive()
        .into_iter()
        .filter(|&node| node != owner)
        .flat_map(|node| {
            cluster
                .keys_on(node)
                .into_iter()
                .filter(|key| names.iter().any(|name| key.starts_with(name.as_str())))
                .map(move |key| (node, key))
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Routing
// ---------------------------------------------------------------------------------------------

/// Names owned by each primary, `per_primary` of each, hash-tagged `{<prefix><n>}`.
fn names_on_every_primary(
    cluster: &Cluster,
    prefix: &str,
    per_primary: usize,
) -> BTreeMap<usize, Vec<String>> {
    let owners = cluster.slot_owners();
    let mut by_primary: BTreeMap<usize, Vec<String>> = cluster
        .primaries()
        .into_iter()
        .map(|primary| (primary, Vec::new()))
        .collect();
    for n in 0.. {
        if by_primary.values().all(|names| names.len() == per_primary) {
            break;
        }
        let name = format!("{{{prefix}{n}}}");
        let names = by_primary
            .get_mut(&owners[usize::from(key_slot(name.as_bytes()))])
            .expect("every slot is served by a primary");
        if names.len() < per_primary {
            names.push(name);
        }
    }
    by_primary
}

#[test]
fn commands_route_by_name_and_keys_stay_in_their_slot() {
    let _one = one_cluster_at_a_time();
    let cluster = Cluster::start(3, 1, &[]);
    let mut conn = cluster.cluster_connection();
    let by_primary = names_on_every_primary(&cluster, "route", 10);

    // Clients see one key, the name, and route by it.
    let mut any = cluster.connection(cluster.alive()[0]);
    for form in [
        &["SEM.ACQUIRE", "{jobs}", "1", "1"][..],
        &["SEM.ACQUIREFAIR", "{jobs}", "1", "1", "WITHTICKET"],
        &["SEM.REFRESH", "{jobs}", "a", "1"],
        &["SEM.RELEASE", "{jobs}", "a"],
        &["SEM.GET", "{jobs}", "JSON"],
    ] {
        let args: Vec<&str> = ["COMMAND", "GETKEYS"].iter().chain(form).copied().collect();
        let keys: Vec<String> = run(&mut any, &args);
        assert_eq!(keys, ["{jobs}"], "{form:?}");
    }

    // Every command on every name, through the cluster client: fair names on even positions,
    // plain ones on odd positions.
    for (&node, names) in &by_primary {
        let mut on_node = cluster.connection(node);
        for (i, name) in names.iter().enumerate() {
            let name = name.as_str();
            if i % 2 == 0 {
                let fresh = FirstGrant::before(&mut on_node);
                let a: (String, u64) = cluster_run(
                    &mut conn,
                    &["SEM.ACQUIREFAIR", name, "3", "60", "ID", "a", "WITHTICKET"],
                );
                assert_eq!(a.0, "a", "{name}");
                let first = fresh.ticket(&mut on_node, a.1 as i64) as u64;
                let second: (String, u64) = cluster_run(
                    &mut conn,
                    &["SEM.ACQUIREFAIR", name, "3", "60", "WITHTICKET"],
                );
                assert_eq!(second.1, first + 1, "{name}");
                let third: (String, u64) = cluster_run(
                    &mut conn,
                    &["SEM.ACQUIREFAIR", name, "3", "60", "ID", "c", "WITHTICKET"],
                );
                assert_eq!(third, ("c".to_string(), first + 2), "{name}");
                let full: Option<String> =
                    cluster_run(&mut conn, &["SEM.ACQUIREFAIR", name, "3", "60"]);
                assert_eq!(full, None, "{name}");
                let refreshed: i64 = cluster_run(&mut conn, &["SEM.REFRESH", name, "a", "90"]);
                assert_eq!(refreshed, 1, "{name}");
                let released: i64 = cluster_run(&mut conn, &["SEM.RELEASE", name, "c"]);
                assert_eq!(released, 1, "{name}");
                let live: i64 = cluster_run(&mut conn, &["SEM.GET", name]);
                assert_eq!(live, 2, "{name}");
                let json = get_json(&mut conn, name);
                assert_eq!(json["fair"], true, "{json}");
                assert_eq!(json["counter"], first + 2, "{json}");
                let holders: Vec<(String, u64)> = json["holders"]
                    .as_array()
                    .expect("holders")
                    .iter()
                    .map(|h| {
                        (
                            h["id"].as_str().unwrap().into(),
                            h["ticket"].as_u64().unwrap(),
                        )
                    })
                    .collect();
                assert_eq!(
                    holders,
                    [("a".to_string(), first), (second.0.clone(), first + 1)],
                    "{json}"
                );
            } else {
                let p: String =
                    cluster_run(&mut conn, &["SEM.ACQUIRE", name, "2", "60", "ID", "p"]);
                assert_eq!(p, "p");
                let other: String = cluster_run(&mut conn, &["SEM.ACQUIRE", name, "2", "60"]);
                let full: Option<String> =
                    cluster_run(&mut conn, &["SEM.ACQUIRE", name, "2", "60"]);
                assert_eq!(full, None, "{name}");
                let refreshed: i64 = cluster_run(&mut conn, &["SEM.REFRESH", name, "p", "90"]);
                assert_eq!(refreshed, 1, "{name}");
                let released: i64 = cluster_run(&mut conn, &["SEM.RELEASE", name, &other]);
                assert_eq!(released, 1, "{name}");
                let json = get_json(&mut conn, name);
                assert_eq!(json["fair"], false, "{json}");
                assert_eq!(json["counter"], Json::Null, "{json}");
                assert_eq!(json["holders"][0]["id"], "p", "{json}");
                let live: i64 = cluster_run(&mut conn, &["SEM.GET", name]);
                assert_eq!(live, 1, "{name}");
            }
        }
    }

    // Each primary holds exactly the keys of its own names, all of them.
    for (&primary, names) in &by_primary {
        let mut expected: Vec<String> = names
            .iter()
            .enumerate()
            .flat_map(|(i, name)| keys_of(name, i % 2 == 0))
            .collect();
        expected.sort();
        assert_eq!(cluster.keys_on(primary), expected, "primary {primary}");
        let slots: BTreeSet<u16> = expected.iter().map(|key| cluster.slot_of(key)).collect();
        assert!(
            slots
                .iter()
                .all(|&slot| cluster.owner_of_slot(slot) == primary),
            "primary {primary} holds keys of slots {slots:?} it does not serve"
        );
    }

    // Each replica holds exactly what its primary holds: members, scores, counters, expiries.
    for &primary in by_primary.keys() {
        let mut primary_conn = cluster.connection(primary);
        wait_for_replica_of(&mut primary_conn, &by_primary[&primary][0]);
        let replicas = cluster.replicas_of(primary);
        assert_eq!(replicas.len(), 1, "primary {primary}");
        let on_primary = snapshot_of_all_keys(&mut primary_conn);
        let on_replica = snapshot_of_all_keys(&mut cluster.replica_connection(replicas[0]));
        assert_eq!(on_primary.len(), by_primary[&primary].len() * 2);
        assert_eq!(
            on_replica, on_primary,
            "replica {} of {primary}",
            replicas[0]
        );
    }

    // A set routes by its names, which must share a slot (hash tags); names of several slots
    // are refused by the server (CROSSSLOT) before the module sees them.
    let keys: Vec<String> = run(
        &mut any,
        &[
            "COMMAND",
            "GETKEYS",
            "SEM.ACQUIREALL",
            "2",
            "{jobs}a",
            "1",
            "1",
            "{jobs}b",
            "1",
            "1",
            "5",
        ],
    );
    assert_eq!(keys, ["{jobs}a", "{jobs}b"]);
    let mut set_node = cluster.connection(cluster.owner_of_key("{set}gpu"));
    let fresh = FirstGrant::before(&mut set_node);
    let set: (String, Vec<u64>) = cluster_run(
        &mut conn,
        &[
            "SEM.ACQUIREALL",
            "2",
            "{set}gpu",
            "1",
            "1",
            "{set}licence",
            "2",
            "1",
            "10",
            "ID",
            "j",
            "FAIR",
            "WITHTICKET",
        ],
    );
    // Neither name had a counter: each ticket is the clock of the grant.
    assert_eq!(set.0, "j");
    assert_eq!(set.1.len(), 2);
    for ticket in set.1 {
        fresh.ticket(&mut set_node, ticket as i64);
    }
    let refreshed: i64 = cluster_run(
        &mut conn,
        &["SEM.REFRESHALL", "2", "{set}gpu", "{set}licence", "j", "10"],
    );
    assert_eq!(refreshed, 2);
    let released: i64 = cluster_run(
        &mut conn,
        &["SEM.RELEASEALL", "2", "{set}gpu", "{set}licence", "j"],
    );
    assert_eq!(released, 2);
    for form in [
        &[
            "SEM.ACQUIREALL",
            "2",
            "{a}x",
            "1",
            "1",
            "{b}x",
            "1",
            "1",
            "10",
        ][..],
        &["SEM.RELEASEALL", "2", "{a}x", "{b}x", "j"],
        &["SEM.REFRESHALL", "2", "{a}x", "{b}x", "j", "10"],
    ] {
        let err = cluster_error(&mut conn, form);
        assert!(err.starts_with("CROSSSLOT "), "{form:?}: {err}");
    }

    // A name without a hash tag spreads its keys over several slots: Redis refuses the call
    // (CROSSSLOT) before the module sees it. (The module's own hash-tag error is for a name
    // whose keys share a slot by chance; with `:owner` and `:counter` declared, none does:
    // their slots follow from the name's 16-bit CRC, and none of the 65,536 values works.)
    let before: usize = cluster
        .alive()
        .iter()
        .map(|&n| cluster.keys_on(n).len())
        .sum();
    for name in ["jobs", "printers", "queue"] {
        for form in [
            &["SEM.ACQUIRE", name, "1", "10"][..],
            &["SEM.ACQUIREFAIR", name, "1", "10", "WITHTICKET"],
            &["SEM.REFRESH", name, "a", "10"],
            &["SEM.RELEASE", name, "a"],
            &["SEM.GET", name],
            &["SEM.GET", name, "JSON"],
        ] {
            let err = cluster_error(&mut conn, form);
            assert!(err.starts_with("CROSSSLOT "), "{form:?}: {err}");
        }
    }
    let after: usize = cluster
        .alive()
        .iter()
        .map(|&n| cluster.keys_on(n).len())
        .sum();
    assert_eq!(after, before, "a refused call created keys");
}

/// A short call the server was not told the keys of is refused in Cluster with a message
/// naming the long form, from a connection, a script and a transaction, and changes nothing;
/// the long form is served. In the default configuration that is Redis 8.4 and later for every
/// call, and Valkey 9 for a script's (its filter inserts only for connections); with
/// `command-filter 0`, every server.
#[test]
fn short_calls_the_server_cannot_see_whole_are_refused_in_cluster() {
    for module_args in [&[][..], &["command-filter", "0"]] {
        let _one = one_cluster_at_a_time();
        let cluster = Cluster::start_configured(3, 0, module_args, &[]);
        let owner = cluster.owner_of_key("{k}");
        let mut conn = cluster.connection(owner);
        let (valkey, major, minor) = server_version(&mut conn);
        let connections_refused = cluster_refuses_short_form(valkey, major, minor, module_args);
        let scripts_refused = connections_refused || (valkey && major >= 9);
        let short = "return redis.call('SEM.ACQUIRE', KEYS[1], '2', '60', 'ID', 'e')";
        let long = "return redis.call('SEM.ACQUIRE', KEYS[1], KEYS[2], KEYS[3], KEYS[4], \
                    KEYS[5], '5', '60', 'ID', 'l')";
        let calls: [(&[&str], bool); 3] = [
            (
                &["SEM.ACQUIRE", "{k}", "2", "60", "ID", "c"],
                connections_refused,
            ),
            (&["SEM.GET", "{k}"], connections_refused),
            (&["EVAL", short, "1", "{k}"], scripts_refused),
        ];
        for (args, refused) in calls {
            // `common`'s helpers send the call as written.
            match common::try_run::<redis::Value>(&mut conn, args) {
                Err(err) if refused => {
                    let text = error_text(&err);
                    assert!(text.contains("takes the long form"), "{args:?}: {text}");
                }
                Ok(_) if !refused => {}
                other => panic!("{module_args:?} {args:?}: {other:?}"),
            }
        }
        if connections_refused {
            let transaction: redis::RedisResult<Vec<redis::Value>> = redis::pipe()
                .atomic()
                .cmd("SEM.ACQUIRE")
                .arg("{k}")
                .arg("2")
                .arg("60")
                .query(&mut conn);
            let text = error_text(&transaction.expect_err("refused in MULTI/EXEC"));
            assert!(text.contains("takes the long form"), "{text}");
            assert_eq!(cluster.keys_on(owner), Vec::<String>::new());
        }
        let keys = long_form(&["SEM.GET", "{k}"]);
        let mut eval = vec!["EVAL", long, "5"];
        eval.extend(keys[1..].iter().map(String::as_str));
        let id: String = common::run(&mut conn, &eval);
        assert_eq!(id, "l");
        let held: i64 = common::run(&mut conn, &["ZCARD", "{k}"]);
        assert_eq!(
            held,
            1 + i64::from(!connections_refused) + i64::from(!scripts_refused)
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Slot migration by hand
// ---------------------------------------------------------------------------------------------

#[test]
fn a_migrating_slot_never_grants_a_ticket_twice() {
    a_migrating_slot_never_grants_twice(&[]);
}

/// Without a filter the calls name every key (the long form), and the server sees them all.
#[test]
fn a_migrating_slot_never_grants_twice_to_the_long_form() {
    a_migrating_slot_never_grants_twice(&["command-filter", "0"]);
}

fn a_migrating_slot_never_grants_twice(module_args: &[&str]) {
    let _one = one_cluster_at_a_time();
    let cluster = Cluster::start_configured(3, 0, module_args, &[]);
    let slot = cluster.slot_of("{v}");
    let src = cluster.owner_of_slot(slot);
    let dst = *cluster.primaries().iter().find(|&&p| p != src).unwrap();
    let (src_id, dst_id) = (cluster.id(src).to_string(), cluster.id(dst).to_string());
    let dst_address = format!("127.0.0.1:{}", cluster.port(dst));
    let src_address = format!("127.0.0.1:{}", cluster.port(src));
    let slot_arg = slot.to_string();
    let mut on_src = cluster.connection(src);
    let mut on_dst = cluster.connection(dst);
    let acquire = |id| ["SEM.ACQUIREFAIR", "{v}", "5", "10", "ID", id, "WITHTICKET"];

    // Two grants, both released: only the counter is left, at the second ticket.
    let fresh = FirstGrant::before(&mut on_src);
    let h1: (String, u64) = run(&mut on_src, &acquire("h1"));
    let first = fresh.ticket(&mut on_src, h1.1 as i64) as u64;
    let h2: (String, u64) = run(&mut on_src, &acquire("h2"));
    assert_eq!(h2.1, first + 1);
    for id in ["h1", "h2"] {
        let released: i64 = run(&mut on_src, &["SEM.RELEASE", "{v}", id]);
        assert_eq!(released, 1);
    }
    assert_eq!(cluster.keys_on(src), ["{v}:counter"]);

    // The migration starts.
    let ok: String = run(
        &mut on_dst,
        &["CLUSTER", "SETSLOT", &slot_arg, "IMPORTING", &src_id],
    );
    assert_eq!(ok, "OK");
    let ok: String = run(
        &mut on_src,
        &["CLUSTER", "SETSLOT", &slot_arg, "MIGRATING", &dst_id],
    );
    assert_eq!(ok, "OK");

    // The source has one of the three keys: it cannot serve the call, nor send it away.
    for args in [&acquire("h3")[..], &["SEM.GET", "{v}", "JSON"]] {
        let err = error_of(&mut on_src, args);
        assert!(
            err.starts_with("TRYAGAIN "),
            "{args:?} on the source: {err}"
        );
    }
    // The target, asked directly, sends the client back; asked after ASKING, it has none of
    // the keys (the counter above all) and must not grant its first ticket again.
    let err = error_of(&mut on_dst, &acquire("h3"));
    assert_eq!(err, format!("MOVED {slot} {src_address}"));
    for args in [&acquire("h3")[..], &["SEM.GET", "{v}", "JSON"]] {
        let ok: String = run(&mut on_dst, &["ASKING"]);
        assert_eq!(ok, "OK");
        let err = error_of(&mut on_dst, args);
        assert!(
            err.starts_with("TRYAGAIN "),
            "{args:?} on the target: {err}"
        );
    }
    assert_eq!(cluster.keys_on(dst), Vec::<String>::new());

    // The counter moves: nothing on the target is in its way.
    let migrated: String = run(
        &mut on_src,
        &[
            "MIGRATE",
            "127.0.0.1",
            &cluster.port(dst).to_string(),
            "{v}:counter",
            "0",
            "5000",
        ],
    );
    assert_eq!(migrated, "OK");
    assert_eq!(cluster.keys_on(src), Vec::<String>::new());
    assert_eq!(cluster.keys_on(dst), ["{v}:counter"]);

    // Now the source has none of the keys and sends the client on; the target has only the
    // counter, still not all the keys.
    let err = error_of(&mut on_src, &acquire("h3"));
    assert_eq!(err, format!("ASK {slot} {dst_address}"));
    let ok: String = run(&mut on_dst, &["ASKING"]);
    assert_eq!(ok, "OK");
    let err = error_of(&mut on_dst, &acquire("h3"));
    assert!(err.starts_with("TRYAGAIN "), "on the target: {err}");

    // The migration ends: the target serves the slot and goes on from the counter (or from its
    // own floor, when that is higher).
    for conn in [&mut on_dst, &mut on_src] {
        let ok: String = run(conn, &["CLUSTER", "SETSLOT", &slot_arg, "NODE", &dst_id]);
        assert_eq!(ok, "OK");
    }
    let dst_floor = ticket_floor(&mut on_dst) as u64;
    let h3: (String, u64) = run(&mut on_dst, &acquire("h3"));
    assert_eq!(h3, ("h3".to_string(), (h2.1 + 1).max(dst_floor)));
    let err = error_of(&mut on_src, &acquire("h4"));
    assert_eq!(err, format!("MOVED {slot} {dst_address}"));
    cluster.wait_until_healthy();
    let mut conn = cluster.cluster_connection();
    let h4: (String, u64) = cluster_run(&mut conn, &acquire("h4"));
    assert_eq!(h4, ("h4".to_string(), h3.1 + 1));
    let counter: String = run(&mut on_dst, &["GET", "{v}:counter"]);
    assert_eq!(counter, h4.1.to_string());
    assert_eq!(cluster.keys_on(src), Vec::<String>::new());
}

// ---------------------------------------------------------------------------------------------
// Resharding under load
// ---------------------------------------------------------------------------------------------

/// Client threads hammering fair semaphores through the cluster client.
const RESHARD_CLIENTS: usize = 10;
/// The names, in the lowest slots of the first primary, which `redis-cli --cluster reshard`
/// moves first.
const RESHARD_SLOTS: [u16; 3] = [0, 1, 2];
const RESHARD_NAMES: usize = 40;
const RESHARD_LIMIT: usize = 3;
/// Unrelated keys in each of the slots.
const FILLERS_PER_SLOT: usize = 1000;

/// One client's grants, in the order it got them: (name index, ticket).
type Grants = Vec<(usize, u64)>;

/// What the reshard clients share.
struct Load {
    names: Vec<String>,
    stop: AtomicBool,
    grants: AtomicU64,
    refusals: AtomicU64,
    /// Retries after the cluster client gave up (TRYAGAIN, ASK, MOVED...).
    retries: AtomicU64,
    /// Holders in their critical section, per name, as the clients count them: granted and
    /// not yet released. Never more than the limit.
    inside: Vec<AtomicUsize>,
    max_inside: AtomicUsize,
    /// The highest `SEM.GET` a holder saw.
    max_live: AtomicUsize,
}

/// [`query_retrying`] within the reshard clients' patience.
fn sem_query<T: redis::FromRedisValue>(
    conn: &mut ClusterConnection,
    load: &Load,
    args: &[&str],
) -> Result<T, String> {
    query_retrying(conn, args, Duration::from_secs(20), &load.retries)
}

/// One reshard client: acquire a random name (a fresh identifier each time), check the
/// count, release. Stops at the first failure, and stops the others.
/// A quarter of the rounds take a set of two names of one slot instead.
fn reshard_client(cluster: &Cluster, load: &Load, client: usize) -> Result<Grants, String> {
    let result = reshard_client_loop(cluster, load, client);
    if result.is_err() {
        load.stop.store(true, Ordering::SeqCst);
    }
    result
}

fn reshard_client_loop(cluster: &Cluster, load: &Load, client: usize) -> Result<Grants, String> {
    let mut conn = cluster.cluster_connection();
    let mut grants = Vec::new();
    let mut random = 0x9e37_79b9_7f4a_7c15_u64 ^ (client as u64 + 1);
    let limit = RESHARD_LIMIT.to_string();
    for attempt in 0.. {
        if load.stop.load(Ordering::SeqCst) {
            break;
        }
        random ^= random << 13;
        random ^= random >> 7;
        random ^= random << 17;
        // Half the attempts go to two hot names, where the limit is reached.
        let index = if random.is_multiple_of(2) {
            (random >> 1) as usize % 2
        } else {
            (random >> 1) as usize % load.names.len()
        };
        let id = format!("c{client}-{attempt}");
        // A quarter of the attempts take a set: the name and another one in its slot.
        if (random >> 9).is_multiple_of(4) {
            let other = load
                .names
                .iter()
                .position(|other| {
                    other != &load.names[index]
                        && cluster.slot_of(other) == cluster.slot_of(&load.names[index])
                })
                .expect("every slot has several names");
            set_round(&mut conn, load, [index, other], &id)?
                .into_iter()
                .for_each(|grant| grants.push(grant));
            continue;
        }
        let name = load.names[index].as_str();
        let granted: Option<(String, u64)> = sem_query(
            &mut conn,
            load,
            &[
                "SEM.ACQUIREFAIR",
                name,
                &limit,
                "10",
                "ID",
                &id,
                "WITHTICKET",
            ],
        )?;
        let Some((holder, ticket)) = granted else {
            load.refusals.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        if holder != id {
            return Err(format!("{name}: asked for {id}, granted {holder}"));
        }
        grants.push((index, ticket));
        load.grants.fetch_add(1, Ordering::Relaxed);
        let inside = load.inside[index].fetch_add(1, Ordering::SeqCst) + 1;
        load.max_inside.fetch_max(inside, Ordering::SeqCst);
        let live: usize = sem_query(&mut conn, load, &["SEM.GET", name])?;
        load.max_live.fetch_max(live, Ordering::SeqCst);
        load.inside[index].fetch_sub(1, Ordering::SeqCst);
        let released: i64 = sem_query(&mut conn, load, &["SEM.RELEASE", name, &id])?;
        if released != 1 {
            return Err(format!(
                "{name}: SEM.RELEASE {id} (ticket {ticket}) replied {released}"
            ));
        }
    }
    Ok(grants)
}

/// One set round of a reshard client: `SEM.ACQUIREALL` of two names of one slot (fair, with
/// tickets), the count checked in each, then `SEM.RELEASEALL`. Returns the grants made.
fn set_round(
    conn: &mut ClusterConnection,
    load: &Load,
    pair: [usize; 2],
    id: &str,
) -> Result<Grants, String> {
    let limit = RESHARD_LIMIT.to_string();
    let [a, b] = pair.map(|index| load.names[index].as_str());
    let granted: Option<(String, Vec<u64>)> = sem_query(
        conn,
        load,
        &[
            "SEM.ACQUIREALL",
            "2",
            a,
            &limit,
            "1",
            b,
            &limit,
            "1",
            "10",
            "ID",
            id,
            "FAIR",
            "WITHTICKET",
        ],
    )?;
    let Some((holder, tickets)) = granted else {
        load.refusals.fetch_add(1, Ordering::Relaxed);
        return Ok(Vec::new());
    };
    if holder != id || tickets.len() != 2 {
        return Err(format!(
            "{a}, {b}: asked for {id}, granted {holder} {tickets:?}"
        ));
    }
    load.grants.fetch_add(1, Ordering::Relaxed);
    for (index, name) in pair.into_iter().zip([a, b]) {
        let inside = load.inside[index].fetch_add(1, Ordering::SeqCst) + 1;
        load.max_inside.fetch_max(inside, Ordering::SeqCst);
        let live: usize = sem_query(conn, load, &["SEM.GET", name])?;
        load.max_live.fetch_max(live, Ordering::SeqCst);
    }
    for index in pair {
        load.inside[index].fetch_sub(1, Ordering::SeqCst);
    }
    let released: i64 = sem_query(conn, load, &["SEM.RELEASEALL", "2", a, b, id])?;
    if released != 2 {
        return Err(format!("{a}, {b}: SEM.RELEASEALL {id} replied {released}"));
    }
    Ok(pair.into_iter().zip(tickets).collect())
}

/// The sum of `field` over the lines of an INFO section that start with `prefix`:
/// `cmdstat_sem.get:calls=3,...,failed_calls=0` or `errorstat_ASK:count=10`.
fn info_count(info: &str, prefix: &str, field: &str) -> u64 {
    info.lines()
        .filter(|line| line.starts_with(prefix))
        .filter_map(|line| line.split_once(':'))
        .flat_map(|(_, values)| values.split(','))
        .filter_map(|pair| pair.split_once('='))
        .filter(|(key, _)| *key == field)
        .map(|(_, value)| value.trim().parse::<u64>().expect("a count"))
        .sum()
}

/// Waits until the clients have made `more` grants since `since`, or one of them stopped.
fn wait_for_grants(load: &Load, since: u64, more: u64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while load.grants.load(Ordering::SeqCst) < since + more && !load.stop.load(Ordering::SeqCst) {
        assert!(Instant::now() < deadline, "the clients made no progress");
        sleep(Duration::from_millis(10));
    }
}

/// `redis-cli --cluster reshard` of `count` slots from `from` to `to`; asserts it succeeded,
/// moved exactly [`RESHARD_SLOTS`] and left no slot open on any node.
fn reshard(cluster: &Cluster, from: usize, to: usize, extra: &[&str]) {
    let entry = format!("127.0.0.1:{}", cluster.port(from));
    let count = RESHARD_SLOTS.len().to_string();
    let mut args = vec![
        "--cluster",
        "reshard",
        &entry,
        "--cluster-from",
        cluster.id(from),
        "--cluster-to",
        cluster.id(to),
        "--cluster-slots",
        &count,
        "--cluster-yes",
    ];
    args.extend_from_slice(extra);
    let started = Instant::now();
    let (ok, output) = redis_cli_run(&args);
    assert!(
        ok,
        "redis-cli {args:?} failed:\n{output}\n{}",
        cluster.logs()
    );
    eprintln!("reshard {extra:?} took {:?}", started.elapsed());
    let moved: BTreeSet<u16> = output
        .lines()
        .filter_map(|line| line.trim().strip_prefix("Moving slot "))
        .filter_map(|rest| rest.split_whitespace().next()?.parse().ok())
        .collect();
    assert_eq!(moved, RESHARD_SLOTS.into_iter().collect(), "{output}");
    for node in cluster.alive() {
        let open: Vec<String> = cluster
            .view_of(node)
            .into_iter()
            .flat_map(|view| view.open_slots)
            .collect();
        assert!(open.is_empty(), "node {node} still has open slots {open:?}");
    }
    cluster.wait_until_healthy();
    for slot in RESHARD_SLOTS {
        assert_eq!(cluster.owner_of_slot(slot), to, "slot {slot}");
    }
}

/// Short-form calls, as `redis-cli -c` sends them, in the default configuration: served where
/// a command filter declares their keys, refused with the message naming the long form where
/// none does (Redis 8.4 and later), and then sent in the long form.
#[test]
fn reshard_of_busy_fair_semaphores_completes_without_repeating_a_ticket() {
    reshard_of_busy_fair_semaphores(&[]);
}

/// The same without the filter on any server: short calls refused, the long form served.
#[test]
fn reshard_without_the_filter_in_the_long_form_never_repeats_a_ticket() {
    reshard_of_busy_fair_semaphores(&["command-filter", "0"]);
}

fn reshard_of_busy_fair_semaphores(module_args: &[&str]) {
    let _one = one_cluster_at_a_time();
    let cluster = Cluster::start_configured(3, 0, module_args, &[]);
    // The source serves the lowest slots, so `reshard` takes RESHARD_SLOTS from it.
    let source = cluster.owner_of_slot(0);
    let slots: Vec<u16> = (0..=RESHARD_SLOTS.len() as u16).collect();
    assert!(slots
        .iter()
        .all(|&slot| cluster.owner_of_slot(slot) == source));
    let target = *cluster.primaries().iter().find(|&&p| p != source).unwrap();
    let names: Vec<String> = RESHARD_SLOTS
        .iter()
        .enumerate()
        .flat_map(|(i, &slot)| {
            let count = (RESHARD_NAMES + i) / RESHARD_SLOTS.len();
            names_in_slot(&format!("s{slot}-"), slot, count)
        })
        .collect();
    assert_eq!(names.len(), RESHARD_NAMES);
    for name in &names {
        assert!(RESHARD_SLOTS.contains(&cluster.slot_of(name)), "{name}");
    }
    // Unrelated keys in the same slots make each migration take longer.
    let mut on_source = cluster.connection(source);
    for slot in RESHARD_SLOTS {
        let tag = &names_in_slot("filler", slot, 1)[0];
        let mut mset = vec!["MSET".to_string()];
        for n in 0..FILLERS_PER_SLOT {
            mset.extend([format!("{tag}:{n}"), n.to_string()]);
        }
        let args: Vec<&str> = mset.iter().map(String::as_str).collect();
        let ok: String = run(&mut on_source, &args);
        assert_eq!(ok, "OK");
    }
    // The form the clients send follows the server (see `Cluster::start_configured`).
    let (valkey, major, minor) = server_version(&mut on_source);
    assert_eq!(
        sends_long_form(),
        cluster_refuses_short_form(valkey, major, minor, module_args)
    );
    // No name has a counter yet: each one's first ticket is the clock of its first grant.
    let fresh = FirstGrant::before(&mut on_source);
    let floors_before =
        [source, target].map(|node| ticket_floor(&mut cluster.connection(node)) as u64);
    let load = Load {
        inside: (0..names.len()).map(|_| AtomicUsize::new(0)).collect(),
        names,
        stop: AtomicBool::new(false),
        grants: AtomicU64::new(0),
        refusals: AtomicU64::new(0),
        retries: AtomicU64::new(0),
        max_inside: AtomicUsize::new(0),
        max_live: AtomicUsize::new(0),
    };

    let results: Vec<Result<Grants, String>> = thread::scope(|scope| {
        let clients: Vec<_> = (0..RESHARD_CLIENTS)
            .map(|client| {
                let (cluster, load) = (&cluster, &load);
                scope.spawn(move || reshard_client(cluster, load, client))
            })
            .collect();
        let driven = || {
            wait_for_grants(&load, 0, 200);
            reshard(&cluster, source, target, &[]);
            wait_for_grants(&load, load.grants.load(Ordering::SeqCst), 200);
            reshard(&cluster, target, source, &["--cluster-pipeline", "1"]);
            wait_for_grants(&load, load.grants.load(Ordering::SeqCst), 200);
        };
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(driven));
        load.stop.store(true, Ordering::SeqCst);
        let results = clients
            .into_iter()
            .map(|client| client.join().expect("a client panicked"))
            .collect();
        if let Err(panic) = outcome {
            std::panic::resume_unwind(panic);
        }
        results
    });
    let mut per_client = Vec::new();
    for (client, result) in results.into_iter().enumerate() {
        per_client.push(result.unwrap_or_else(|err| panic!("client {client}: {err}")));
    }
    // The clients ran into the open slots: sent to the wrong node (ASK), or to a node with
    // some of a name's keys (TRYAGAIN); no SEM.* call failed once it ran.
    let (mut redirected, mut unstable, mut sets) = (0, 0, 0);
    for node in cluster.alive() {
        let errors: String = run(&mut cluster.connection(node), &["INFO", "errorstats"]);
        redirected += info_count(&errors, "errorstat_ASK:", "count");
        unstable += info_count(&errors, "errorstat_TRYAGAIN:", "count");
        let calls: String = run(&mut cluster.connection(node), &["INFO", "commandstats"]);
        let failed = info_count(&calls, "cmdstat_sem.", "failed_calls");
        assert_eq!(failed, 0, "node {node}:\n{calls}");
        sets += info_count(&calls, "cmdstat_sem.acquireall:", "calls");
    }
    assert!(sets > 0, "no set was asked for");
    eprintln!(
        "{} grants ({sets} set calls), {} refusals, {} retries after the cluster client's \
         own; {redirected} ASK, {unstable} TRYAGAIN",
        load.grants.load(Ordering::SeqCst),
        load.refusals.load(Ordering::SeqCst),
        load.retries.load(Ordering::SeqCst),
    );
    assert!(
        redirected > 0 && unstable > 0,
        "the clients never met a migration"
    );

    // The limit held, and was reached.
    assert!(load.max_inside.load(Ordering::SeqCst) <= RESHARD_LIMIT);
    assert!(load.max_live.load(Ordering::SeqCst) <= RESHARD_LIMIT);
    assert!(load.refusals.load(Ordering::SeqCst) > 0);
    // Each client saw each name's tickets grow.
    let mut tickets: Vec<Vec<u64>> = vec![Vec::new(); load.names.len()];
    for (client, grants) in per_client.iter().enumerate() {
        let mut last: HashMap<usize, u64> = HashMap::new();
        for &(index, ticket) in grants {
            if let Some(previous) = last.insert(index, ticket) {
                assert!(
                    ticket > previous,
                    "client {client} got ticket {ticket} of {} after {previous}",
                    load.names[index]
                );
            }
            tickets[index].push(ticket);
        }
    }
    // No ticket was handed out twice, none was lost, and each counter is the last ticket,
    // on the node serving the slot, the only one holding the name's keys. The first ticket is
    // the clock of a grant during the load (or the node's floor, one past its last ticket),
    // each later one above the one before: both nodes took their clock floors before the
    // load, below every ticket, and each node's floor is now past every ticket it handed out.
    let floors = [source, target].map(|node| ticket_floor(&mut cluster.connection(node)) as u64);
    for (index, name) in load.names.iter().enumerate() {
        let mut granted = tickets[index].clone();
        granted.sort_unstable();
        if let Some(&first) = granted.first() {
            fresh.ticket(&mut on_source, first as i64);
            assert!(
                floors_before.iter().all(|&floor| floor < first),
                "{name}: {first}, floors before the load {floors_before:?}"
            );
        }
        if let Some(&last) = granted.last() {
            assert!(
                floors.iter().any(|&floor| floor > last),
                "{name}: {last}, floors {floors:?}"
            );
        }
        for pair in granted.windows(2) {
            assert!(pair[1] > pair[0], "tickets of {name}: {pair:?}");
        }
        let counter: Option<u64> = run(&mut on_source, &["GET", &format!("{name}:counter")]);
        assert_eq!(counter, granted.last().copied(), "counter of {name}");
    }
    let mut expected: Vec<String> = load
        .names
        .iter()
        .zip(&tickets)
        .filter(|(_, tickets)| !tickets.is_empty())
        .map(|(name, _)| format!("{name}:counter"))
        .collect();
    expected.sort();
    let mut held: Vec<String> = cluster
        .keys_on(source)
        .into_iter()
        .filter(|key| load.names.iter().any(|name| key.starts_with(name.as_str())))
        .collect();
    held.sort();
    assert_eq!(held, expected, "every holder was released");
    assert_eq!(stray_keys(&cluster, source, &load.names), Vec::new());
    for slot in RESHARD_SLOTS {
        let count: usize = run(
            &mut on_source,
            &["CLUSTER", "COUNTKEYSINSLOT", &slot.to_string()],
        );
        let names = load.names.iter().zip(&tickets);
        let counters = names
            .filter(|(name, tickets)| cluster.slot_of(name) == slot && !tickets.is_empty())
            .count();
        assert_eq!(count, FILLERS_PER_SLOT + counters, "slot {slot}");
    }
}

// ---------------------------------------------------------------------------------------------
// ACLs
// ---------------------------------------------------------------------------------------------

/// A connection to `node` logged in as `user`.
fn connection_as(cluster: &Cluster, node: usize, user: &str) -> redis::Connection {
    let mut conn = cluster.connection(node);
    let ok: String = run(&mut conn, &["AUTH", user, "pw"]);
    assert_eq!(ok, "OK");
    conn
}

/// `ACL LOG` entries as (username, reason, object).
fn acl_log(conn: &mut redis::Connection) -> Vec<(String, String, String)> {
    let entries: Vec<HashMap<String, redis::Value>> = run(conn, &["ACL", "LOG"]);
    let field = |entry: &HashMap<String, redis::Value>, name: &str| -> String {
        redis::from_redis_value(&entry[name]).expect("a text field")
    };
    entries
        .iter()
        .map(|entry| {
            (
                field(entry, "username"),
                field(entry, "reason"),
                field(entry, "object"),
            )
        })
        .collect()
}

#[test]
fn acl_covers_every_key_in_cluster() {
    let _one = one_cluster_at_a_time();
    let cluster = Cluster::start(3, 0, &[]);
    let owner = cluster.owner_of_key("{jobs}");
    let mut admin = cluster.connection(owner);
    for rule in [
        &["exact", "on", ">pw", "~{jobs}", "+@all"][..],
        &["prefix", "on", ">pw", "~{jobs}*", "+@all"],
        &["reader", "on", ">pw", "%R~{jobs}*", "+@all"],
    ] {
        let args: Vec<&str> = ["ACL", "SETUSER"].iter().chain(rule).copied().collect();
        let ok: String = run(&mut admin, &args);
        assert_eq!(ok, "OK");
    }
    let ok: String = run(&mut admin, &["ACL", "LOG", "RESET"]);
    assert_eq!(ok, "OK");
    let writers: [&[&str]; 4] = [
        &["SEM.ACQUIRE", "{jobs}", "2", "60", "ID", "x"],
        &[
            "SEM.ACQUIREFAIR",
            "{jobs}",
            "2",
            "60",
            "ID",
            "x",
            "WITHTICKET",
        ],
        &["SEM.REFRESH", "{jobs}", "keep", "60"],
        &["SEM.RELEASE", "{jobs}", "keep"],
    ];
    let readers: [&[&str]; 2] = [&["SEM.GET", "{jobs}"], &["SEM.GET", "{jobs}", "JSON"]];

    // `~{jobs}` covers the name only: every command touches a derived key too.
    let mut exact = connection_as(&cluster, owner, "exact");
    for args in writers.iter().chain(&readers) {
        let err = error_of(&mut exact, args);
        assert!(err.starts_with("NOPERM "), "{args:?}: {err}");
    }
    assert_eq!(cluster.keys_on(owner), Vec::<String>::new());
    let log = acl_log(&mut admin);
    assert!(!log.is_empty());
    for (user, reason, object) in &log {
        assert_eq!(
            (user.as_str(), reason.as_str()),
            ("exact", "key"),
            "{log:?}"
        );
        assert!(
            ["{jobs}:owner", "{jobs}:counter"].contains(&object.as_str()),
            "{log:?}"
        );
    }

    // `~{jobs}*` covers them all.
    let mut prefix = connection_as(&cluster, owner, "prefix");
    let fresh = FirstGrant::before(&mut admin);
    let granted: (String, u64) = run(
        &mut prefix,
        &[
            "SEM.ACQUIREFAIR",
            "{jobs}",
            "2",
            "60",
            "ID",
            "f",
            "WITHTICKET",
        ],
    );
    assert_eq!(granted.0, "f");
    let first = fresh.ticket(&mut admin, granted.1 as i64) as u64;
    let refreshed: i64 = run(&mut prefix, &["SEM.REFRESH", "{jobs}", "f", "60"]);
    assert_eq!(refreshed, 1);
    let live: i64 = run(&mut prefix, &["SEM.GET", "{jobs}"]);
    assert_eq!(live, 1);
    let released: i64 = run(&mut prefix, &["SEM.RELEASE", "{jobs}", "f"]);
    assert_eq!(released, 1);
    let plain: String = run(
        &mut prefix,
        &["SEM.ACQUIRE", "{jobs}", "2", "60", "ID", "p"],
    );
    assert_eq!(plain, "p");
    let released: i64 = run(&mut prefix, &["SEM.RELEASE", "{jobs}", "p"]);
    assert_eq!(released, 1);
    let keep: (String, u64) = run(
        &mut prefix,
        &[
            "SEM.ACQUIREFAIR",
            "{jobs}",
            "2",
            "60",
            "ID",
            "keep",
            "WITHTICKET",
        ],
    );
    assert_eq!(keep, ("keep".to_string(), first + 1));
    let json: String = run(&mut prefix, &["SEM.GET", "{jobs}", "JSON"]);

    // `%R~{jobs}*` reads, and writes nothing.
    let mut reader = connection_as(&cluster, owner, "reader");
    let live: i64 = run(&mut reader, &["SEM.GET", "{jobs}"]);
    assert_eq!(live, 1);
    let read: String = run(&mut reader, &["SEM.GET", "{jobs}", "JSON"]);
    let (read, json): (Json, Json) = (
        serde_json::from_str(&read).unwrap(),
        serde_json::from_str(&json).unwrap(),
    );
    assert_eq!(read["counter"], first + 1);
    assert_eq!(read["holders"][0]["id"], "keep");
    assert_eq!(read["holders"][0]["ticket"], json["holders"][0]["ticket"]);
    let before = snapshot_of_all_keys(&mut admin);
    let _ = run::<String>(&mut admin, &["ACL", "LOG", "RESET"]);
    for args in writers {
        let err = error_of(&mut reader, args);
        assert!(err.starts_with("NOPERM "), "{args:?}: {err}");
    }
    assert_eq!(snapshot_of_all_keys(&mut admin), before);
    let log = acl_log(&mut admin);
    assert!(
        log.iter()
            .all(|(user, reason, _)| user == "reader" && reason == "key"),
        "{log:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Failover
// ---------------------------------------------------------------------------------------------

const FAILOVER_CLIENTS: usize = 4;
const FAILOVER_NAMES: usize = 4;
/// Grants per name to see before the kill, and after it.
const FAILOVER_GRANTS: usize = 20;

/// A grant as a client saw it.
#[derive(Debug, Clone, Copy)]
struct Grant {
    name: usize,
    ticket: u64,
    /// When the client first sent the request (retries included after it).
    sent: Instant,
    /// When the client read the grant.
    acked: Instant,
}

/// What the failover clients share.
struct FailoverLoad {
    names: Vec<String>,
    stop: AtomicBool,
    grants: Mutex<Vec<Grant>>,
}

/// Loops acquire and release on every name in turn, retrying through the failover: errors
/// on the way are expected (the primary is gone until its replica takes over), and a
/// connection that keeps failing is replaced, which reads the layout afresh.
fn failover_client(
    client_handle: &redis::cluster::ClusterClient,
    load: &FailoverLoad,
    client: usize,
) -> Result<(), String> {
    let mut conn = client_handle
        .get_connection()
        .map_err(|err| err.to_string())?;
    let mut failures = 0;
    let mut attempt = 0;
    while !load.stop.load(Ordering::SeqCst) {
        attempt += 1;
        let index = (client + attempt) % load.names.len();
        let name = load.names[index].as_str();
        let id = format!("c{client}-{attempt}");
        let sent = Instant::now();
        let deadline = sent + Duration::from_secs(30);
        let granted: Option<(String, u64)> = loop {
            let args = ["SEM.ACQUIREFAIR", name, "100", "5", "ID", &id, "WITHTICKET"];
            match command(&args).query(&mut conn) {
                Ok(granted) => break granted,
                Err(err) if is_transient(&err) && Instant::now() < deadline => {
                    failures += 1;
                    sleep(Duration::from_millis(20));
                    if failures % 3 == 0 {
                        if let Ok(fresh) = client_handle.get_connection() {
                            conn = fresh;
                        }
                    }
                }
                Err(err) => return Err(format!("{args:?}: {}", error_text(&err))),
            }
        };
        let acked = Instant::now();
        let Some((holder, ticket)) = granted else {
            return Err(format!("{name} is full"));
        };
        if holder != id {
            return Err(format!("{name}: asked for {id}, granted {holder}"));
        }
        load.grants.lock().unwrap().push(Grant {
            name: index,
            ticket,
            sent,
            acked,
        });
        // A release lost in the failover leaves a holder that expires in 5 s: harmless.
        let _ = command(&["SEM.RELEASE", name, &id]).query::<i64>(&mut conn);
    }
    Ok(())
}

/// Waits until every name has `count` grants matching `counted`, or a client stopped.
fn wait_for_grants_per_name(load: &FailoverLoad, count: usize, counted: impl Fn(&Grant) -> bool) {
    let deadline = Instant::now() + CONVERGE_WITHIN;
    loop {
        let mut per_name = vec![0; load.names.len()];
        for grant in load.grants.lock().unwrap().iter().filter(|g| counted(g)) {
            per_name[grant.name] += 1;
        }
        if per_name.iter().all(|&n| n >= count) || load.stop.load(Ordering::SeqCst) {
            return;
        }
        assert!(Instant::now() < deadline, "too few grants: {per_name:?}");
        sleep(Duration::from_millis(10));
    }
}

#[test]
fn failover_never_repeats_a_ticket() {
    let _one = one_cluster_at_a_time();
    let mut cluster = Cluster::start(
        3,
        1,
        &[
            "--cluster-node-timeout",
            "1000",
            "--cluster-replica-validity-factor",
            "0",
        ],
    );
    let by_primary = names_on_every_primary(&cluster, "fo", FAILOVER_NAMES);
    let (&victim, names) = by_primary.iter().next().unwrap();
    let heir = cluster.replicas_of(victim)[0];
    let load = FailoverLoad {
        names: names.clone(),
        stop: AtomicBool::new(false),
        grants: Mutex::new(Vec::new()),
    };

    let mut synced_at = None;
    let mut killed_at = None;
    let mut killed_at_unix_ms = 0;
    let mut dead_at = None;
    let cluster_client = cluster.client();
    let results: Vec<Result<(), String>> = thread::scope(|scope| {
        let clients: Vec<_> = (0..FAILOVER_CLIENTS)
            .map(|client| {
                let (cluster_client, load) = (&cluster_client, &load);
                scope.spawn(move || failover_client(cluster_client, load, client))
            })
            .collect();
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            wait_for_grants_per_name(&load, FAILOVER_GRANTS, |_| true);
            // Everything acknowledged so far is on the replica; what follows may not be.
            synced_at = Some(Instant::now());
            wait_for_replica_of(&mut cluster.connection(victim), &names[0]);
            wait_for_grants_per_name(&load, FAILOVER_GRANTS / 2, |grant| {
                grant.sent > synced_at.unwrap()
            });
            killed_at = Some(Instant::now());
            killed_at_unix_ms = unix_ms_now();
            cluster.kill(victim);
            let dead = Instant::now();
            dead_at = Some(dead);
            let mut heir_conn = cluster.connection(heir);
            wait_until("the replica is promoted", CONVERGE_WITHIN, || {
                run::<String>(&mut heir_conn, &["INFO", "replication"]).contains("role:master")
            });
            for node in cluster.alive() {
                let mut conn = cluster.connection(node);
                wait_until("the cluster is up again", CONVERGE_WITHIN, || {
                    run::<String>(&mut conn, &["CLUSTER", "INFO"]).contains("cluster_state:ok")
                });
            }
            eprintln!("failover took {:?}", dead.elapsed());
            wait_for_grants_per_name(&load, FAILOVER_GRANTS, |grant| grant.sent > dead);
        }));
        load.stop.store(true, Ordering::SeqCst);
        let results = clients
            .into_iter()
            .map(|client| client.join().expect("a client panicked"))
            .collect();
        if let Err(panic) = outcome {
            std::panic::resume_unwind(panic);
        }
        results
    });
    for (client, result) in results.into_iter().enumerate() {
        result.unwrap_or_else(|err| panic!("client {client}: {err}"));
    }
    let (synced_at, killed_at, dead_at) =
        (synced_at.unwrap(), killed_at.unwrap(), dead_at.unwrap());
    let slot = cluster.slot_of(&names[0]);
    assert_eq!(
        cluster.owner_of_slot(slot),
        heir,
        "the replica serves the slots"
    );

    let grants = load.grants.into_inner().unwrap();
    for (index, name) in names.iter().enumerate() {
        let of_name: Vec<&Grant> = grants.iter().filter(|g| g.name == index).collect();
        let tickets: BTreeSet<u64> = of_name.iter().map(|g| g.ticket).collect();
        assert_eq!(
            tickets.len(),
            of_name.len(),
            "{name}: a ticket was granted twice"
        );
        // Acknowledged by the old primary before it died, and asked of the new one.
        let before: Vec<u64> = of_name
            .iter()
            .filter(|g| g.acked < killed_at)
            .map(|g| g.ticket)
            .collect();
        let after: Vec<u64> = of_name
            .iter()
            .filter(|g| g.sent > dead_at)
            .map(|g| g.ticket)
            .collect();
        let last_before = *before.iter().max().expect("grants before the kill");
        let last_replicated = of_name
            .iter()
            .filter(|g| g.acked < synced_at)
            .map(|g| g.ticket)
            .max()
            .expect("grants before WAIT");
        let first_after = *after.iter().min().expect("grants after the failover");
        eprintln!(
            "{name}: {} grants up to ticket {last_before} before the kill (up to \
             {last_replicated} replicated for sure), {} from ticket {first_after} after",
            before.len(),
            after.len()
        );
        assert!(
            first_after > last_before,
            "{name}: ticket {first_after} after the failover, {last_before} before it"
        );
        // The new primary's tickets go on from the floor it took when promoted (the clock in
        // microseconds), not from the counter it had from its old primary.
        assert!(
            first_after > last_replicated && first_after >= killed_at_unix_ms as u64 * 1000,
            "{name}: ticket {first_after} after the failover, though ticket {last_replicated} \
             had reached the replica and the old primary was killed at {killed_at_unix_ms} ms"
        );
    }
}

#[test]
fn waiters_are_answered_when_their_slot_leaves_the_node() {
    let _one = one_cluster_at_a_time();
    let cluster = Cluster::start(3, 0, &[]);
    let slot = cluster.slot_of("{w}");
    let src = cluster.owner_of_slot(slot);
    let dst = *cluster.primaries().iter().find(|&&p| p != src).unwrap();
    let (src_id, dst_id) = (cluster.id(src).to_string(), cluster.id(dst).to_string());
    let slot_arg = slot.to_string();
    let mut on_src = cluster.connection(src);
    let mut on_dst = cluster.connection(dst);
    let _: String = run(
        &mut on_src,
        &["SEM.ACQUIREFAIR", "{w}", "1", "30", "ID", "h"],
    );

    let mut waiter = cluster.connection(src);
    let waiting = thread::spawn(move || {
        let started = Instant::now();
        let reply = try_run::<Option<String>>(
            &mut waiter,
            &["SEM.ACQUIREFAIR", "{w}", "1", "30", "WAIT", "10"],
        );
        (reply.map_err(|err| error_text(&err)), started.elapsed())
    });
    let waiters = |conn: &mut redis::Connection| -> i64 {
        let doc: String = run(conn, &["SEM.GET", "{w}", "JSON"]);
        serde_json::from_str::<Json>(&doc).unwrap()["waiters"]
            .as_i64()
            .unwrap()
    };
    wait_until("the waiter is in line", Duration::from_secs(5), || {
        waiters(&mut on_src) == 1
    });

    // The slot starts to leave. Redis serves a call on a moving slot only where every key it
    // names exists, and `{w}:permits` does not: where the command filter hears of `CLUSTER
    // SETSLOT`, the waiter is answered at once with TRYAGAIN, as a new call would be, and its
    // client retries until the slot has moved. Without a filter (Redis 8.4 and later) the
    // waiter waits on until its keys leave (below).
    let _: String = run(
        &mut on_dst,
        &["CLUSTER", "SETSLOT", &slot_arg, "IMPORTING", &src_id],
    );
    let _: String = run(
        &mut on_src,
        &["CLUSTER", "SETSLOT", &slot_arg, "MIGRATING", &dst_id],
    );
    let filtered = !sends_long_form();
    let mut waiting = Some(waiting);
    if filtered {
        let (reply, waited) = waiting.take().unwrap().join().unwrap();
        let err = reply.expect_err("no permit is granted on a slot that is leaving");
        assert!(err.starts_with("TRYAGAIN "), "{err}");
        assert!(waited < Duration::from_secs(5), "answered after {waited:?}");
    } else {
        sleep(Duration::from_millis(200));
        assert!(
            !waiting.as_ref().unwrap().is_finished(),
            "answered at SETSLOT"
        );
    }
    let err = error_of(
        &mut on_src,
        &["SEM.ACQUIREFAIR", "{w}", "1", "30", "WAIT", "10"],
    );
    assert!(err.starts_with("TRYAGAIN "), "a new call: {err}");

    let moved: String = run(
        &mut on_src,
        &[
            "MIGRATE",
            "127.0.0.1",
            &cluster.port(dst).to_string(),
            "",
            "0",
            "5000",
            "KEYS",
            "{w}",
            "{w}:owner",
            "{w}:counter",
        ],
    );
    assert_eq!(moved, "OK");
    if let Some(waiting) = waiting {
        // Its keys left (deleted here by MIGRATE): the waiter is answered at once, sent on.
        let (reply, waited) = waiting.join().unwrap();
        let err = reply.expect_err("no permit is granted on a slot that has left");
        assert!(
            err.starts_with("ASK ") || err.starts_with("TRYAGAIN "),
            "{err}"
        );
        assert!(waited < Duration::from_secs(5), "answered after {waited:?}");
    }
    assert!(
        cluster.keys_on(src).is_empty(),
        "nothing was created on the source"
    );

    for node in [dst, src] {
        let mut conn = cluster.connection(node);
        let _: String = run(
            &mut conn,
            &["CLUSTER", "SETSLOT", &slot_arg, "NODE", &dst_id],
        );
    }
    let holders = zset(&mut on_dst, "{w}");
    assert_eq!(holders.len(), 1, "the holder moved with its keys");
}

/// Valkey 9's atomic slot migration (`CLUSTER MIGRATESLOTS`) is refused while a loaded module
/// does not declare that it handles it. redsem declares it: the migration runs, the semaphore's
/// keys arrive whole on the target, and its tickets go on growing there. (Other servers have no
/// such command: the test checks the server and says so.)
#[test]
fn valkey_atomic_slot_migration_moves_a_semaphore_whole() {
    let _one = one_cluster_at_a_time();
    let cluster = Cluster::start(3, 0, &[]);
    let (valkey, major) = server_kind(&mut cluster.connection(cluster.alive()[0]));
    if !(valkey && major >= 9) {
        eprintln!("no atomic slot migration on this server: nothing to check");
        return;
    }
    let mut conn = cluster.cluster_connection();
    let name = "{asm}";
    let slot = cluster.slot_of(name);
    let from = cluster.owner_of_slot(slot);
    let to = cluster
        .primaries()
        .into_iter()
        .find(|&n| n != from)
        .expect("another primary");
    let mut last = 0;
    for id in ["a", "b"] {
        let (_, ticket): (String, u64) = cluster_run(
            &mut conn,
            &["SEM.ACQUIREFAIR", name, "5", "600", "ID", id, "WITHTICKET"],
        );
        assert!(ticket > last);
        last = ticket;
    }
    let range = slot.to_string();
    let mut source = cluster.connection(from);
    let started: redis::RedisResult<redis::Value> = command(&[
        "CLUSTER",
        "MIGRATESLOTS",
        "SLOTSRANGE",
        &range,
        &range,
        "NODE",
        cluster.id(to),
    ])
    .query(&mut source);
    assert!(started.is_ok(), "MIGRATESLOTS refused: {started:?}");
    wait_until("the slot moved", Duration::from_secs(30), || {
        cluster.owner_of_slot(slot) == to
    });
    let mut target = cluster.connection(to);
    let holders: Vec<String> = run(&mut target, &["ZRANGE", name, "0", "-1"]);
    assert_eq!(holders, ["a", "b"]);
    let counter: u64 = run(&mut target, &["GET", "{asm}:counter"]);
    assert_eq!(counter, last);
    let (_, ticket): (String, u64) = cluster_run(
        &mut conn,
        &["SEM.ACQUIREFAIR", name, "5", "600", "ID", "c", "WITHTICKET"],
    );
    assert!(ticket > last, "ticket {ticket} after {last}");
    let json = get_json(&mut conn, name);
    assert_eq!(json["holders"].as_array().map(Vec::len), Some(3), "{json}");
}
