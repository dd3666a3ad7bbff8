//! Fencing tickets never repeat across the lives of a single server, whatever it starts from:
//! nothing at all (no persistence, or a crash before the first save), an RDB file, an AOF, or
//! a `DEBUG RELOAD`; and a replica's full sync leaves the primary's tickets alone. Every start
//! takes a floor from the clock (`INFO sem`, `sem_ticket_floor`), so the next ticket of a name
//! whose counter came back is above every ticket of the server's earlier lives; a name whose
//! counter was lost starts from the clock of its grant, at least the floor. Within one life,
//! every fair grant moves the floor past its ticket: no ticket repeats on a node, of any name,
//! whatever happens to the keys between two grants.

mod common;

use common::*;

const NO_PERSISTENCE: [&str; 4] = ["--save", "", "--appendonly", "no"];

/// Three fair grants on `name`, each released before the next: their tickets. A name without a
/// counter starts from the clock of its first grant (see [`FirstGrant`]).
fn three_tickets(conn: &mut redis::Connection, name: &str) -> Vec<u64> {
    (0..3)
        .map(|_| {
            let (id, ticket): (String, u64) =
                run(conn, &["SEM.ACQUIREFAIR", name, "1", "30", "WITHTICKET"]);
            let released: i64 = run(conn, &["SEM.RELEASE", name, &id]);
            assert_eq!(released, 1);
            ticket
        })
        .collect()
}

/// The next fair ticket of `name`, released at once.
fn next_ticket(conn: &mut redis::Connection, name: &str) -> u64 {
    let (id, ticket): (String, u64) =
        run(conn, &["SEM.ACQUIREFAIR", name, "1", "30", "WITHTICKET"]);
    let released: i64 = run(conn, &["SEM.RELEASE", name, &id]);
    assert_eq!(released, 1);
    ticket
}

/// This server's floor, asserted to be the clock (in microseconds) of some instant from
/// `since_ms` to now.
fn floor_taken_since(conn: &mut redis::Connection, since_ms: i64) -> u64 {
    let floor = info_sem(conn)["sem_ticket_floor"];
    let now_ms = unix_ms_now();
    assert!(
        (since_ms as u64 * 1000..=now_ms as u64 * 1000).contains(&floor),
        "floor {floor} is not the clock from {since_ms} to {now_ms} ms"
    );
    floor
}

/// The tickets of a life, then the next one after a restart: above them all. Where the counter
/// came back, it is the floor the restart took; where it was lost, the clock of the grant.
fn assert_next_life_goes_on_above(before: &[u64], conn: &mut redis::Connection, since_ms: i64) {
    let floor = floor_taken_since(conn, since_ms);
    let counter: Option<u64> = run(conn, &["GET", "lock:counter"]);
    let fresh = FirstGrant::before(conn);
    let next = next_ticket(conn, "lock");
    assert!(
        before.iter().all(|&earlier| next > earlier),
        "ticket {next} after the restart, {before:?} before it"
    );
    match counter {
        Some(counter) => assert_eq!(
            next,
            (counter + 1).max(floor),
            "after a reloaded counter, the floor the restart took (the next one up if higher)"
        ),
        None => {
            fresh.ticket(conn, next as i64);
        }
    }
}

#[test]
fn a_restart_without_persistence_never_repeats_a_ticket() {
    let started_ms = unix_ms_now();
    let server = Server::start_with(&NO_PERSISTENCE);
    let mut conn = server.connection();
    floor_taken_since(&mut conn, started_ms);
    let fresh = FirstGrant::before(&mut conn);
    let before = three_tickets(&mut conn, "lock");
    let first = fresh.ticket(&mut conn, before[0] as i64) as u64;
    assert_eq!(before, [first, first + 1, first + 2]);

    // SHUTDOWN NOSAVE: the server exits without a reply and leaves no file.
    assert!(try_run::<()>(&mut conn, &["SHUTDOWN", "NOSAVE"]).is_err());
    let dir = server.stop();
    assert!(!dir.join("dump.rdb").exists() && !dir.join("appendonlydir").exists());

    let restarting_ms = unix_ms_now();
    let restarted = Server::restart_in(&dir, &NO_PERSISTENCE);
    let mut conn = restarted.connection();
    let keys: i64 = run(&mut conn, &["DBSIZE"]);
    assert_eq!(keys, 0, "the restart lost everything");
    assert_next_life_goes_on_above(&before, &mut conn, restarting_ms);
}

#[test]
fn a_crash_before_the_first_save_never_repeats_a_ticket() {
    let args = ["--save", "60 1", "--appendonly", "no"];
    let server = Server::start_with(&args);
    let mut conn = server.connection();
    let before = three_tickets(&mut conn, "lock");
    let saves: String = run(&mut conn, &["INFO", "persistence"]);
    assert!(saves.contains("rdb_changes_since_last_save:"), "{saves}");
    assert!(
        !saves.contains("rdb_changes_since_last_save:0\r"),
        "the grants are unsaved: {saves}"
    );

    // kill -9 well within the 60 s: no RDB file to load at the restart, so no loading event.
    let dir = server.stop();
    assert!(!dir.join("dump.rdb").exists(), "a save came first");

    let restarting_ms = unix_ms_now();
    let restarted = Server::restart_in(&dir, &args);
    let mut conn = restarted.connection();
    let keys: i64 = run(&mut conn, &["DBSIZE"]);
    assert_eq!(keys, 0, "the crash lost everything");
    assert_next_life_goes_on_above(&before, &mut conn, restarting_ms);
}

#[test]
fn debug_reload_and_restarts_from_a_file_never_repeat_a_ticket() {
    // DEBUG RELOAD: the server saves, empties itself and loads the file again.
    let server = Server::start_with(&DEBUG_ARGS);
    let mut conn = server.connection();
    let mut before = three_tickets(&mut conn, "lock");
    let reloading_ms = unix_ms_now();
    let ok: String = run(&mut conn, &["DEBUG", "RELOAD"]);
    assert_eq!(ok, "OK");
    let counter: u64 = run(&mut conn, &["GET", "lock:counter"]);
    assert_eq!(counter, before[2], "the reload kept the counter");
    assert_next_life_goes_on_above(&before, &mut conn, reloading_ms);
    before.push(run(&mut conn, &["GET", "lock:counter"]));

    // A restart from the RDB file a SAVE wrote.
    let ok: String = run(&mut conn, &["SAVE"]);
    assert_eq!(ok, "OK");
    before.extend(three_tickets(&mut conn, "lock"));
    let dir = server.stop();
    let restarting_ms = unix_ms_now();
    let restarted = Server::restart_in(&dir, &DEBUG_ARGS);
    let mut conn = restarted.connection();
    let counter: u64 = run(&mut conn, &["GET", "lock:counter"]);
    assert_eq!(counter, before[3], "the file holds the counter of the SAVE");
    assert_next_life_goes_on_above(&before, &mut conn, restarting_ms);
    drop(restarted);

    // A restart from an AOF that holds every grant.
    let server = Server::start_with(&AOF_PRIMARY_ARGS);
    let mut conn = server.connection();
    let before = three_tickets(&mut conn, "lock");
    let dir = server.stop();
    let restarting_ms = unix_ms_now();
    let restarted = Server::restart_in(&dir, &AOF_PRIMARY_ARGS);
    let mut conn = restarted.connection();
    let counter: u64 = run(&mut conn, &["GET", "lock:counter"]);
    assert_eq!(counter, before[2], "the AOF holds every grant");
    assert_next_life_goes_on_above(&before, &mut conn, restarting_ms);
}

#[test]
fn a_module_loaded_at_runtime_takes_a_floor_at_once() {
    let mut args = NO_PERSISTENCE.to_vec();
    args.extend(["--enable-module-command", "yes"]);
    let server = Server::start_with(&args);
    let mut conn = server.connection();
    let before = three_tickets(&mut conn, "lock");
    let ok: String = run(&mut conn, &["MODULE", "UNLOAD", "sem"]);
    assert_eq!(ok, "OK");
    // The data outlives the module, but a load cannot tell what it missed: it takes a floor.
    let loading_ms = unix_ms_now();
    let path = module_path();
    let ok: String = run(&mut conn, &["MODULE", "LOAD", path.to_str().unwrap()]);
    assert_eq!(ok, "OK");
    assert_next_life_goes_on_above(&before, &mut conn, loading_ms);
}

#[test]
fn a_replicas_full_sync_leaves_the_primarys_tickets_alone() {
    let primary = Server::start_with(&PRIMARY_ARGS);
    let mut on_primary = primary.connection();
    let floor = info_sem(&mut on_primary)["sem_ticket_floor"];
    let fresh = FirstGrant::before(&mut on_primary);
    let before = three_tickets(&mut on_primary, "lock");
    let first = fresh.ticket(&mut on_primary, before[0] as i64) as u64;
    assert_eq!(before, [first, first + 1, first + 2]);

    let syncing_ms = unix_ms_now();
    let replica = start_replica_of(&primary);
    let mut on_replica = replica.connection();
    // The replica took a floor of its own when its load of the primary's data ended; the
    // primary, which only saved, kept its floor (one past its last ticket) and counts on one
    // by one.
    floor_taken_since(&mut on_replica, syncing_ms);
    assert_eq!(info_sem(&mut on_primary)["sem_ticket_floor"], first + 3);
    assert!(first + 3 > floor);
    assert_eq!(next_ticket(&mut on_primary, "lock"), first + 3);
    wait_for_replica(&mut on_primary);
    let counter: u64 = run(&mut on_replica, &["GET", "lock:counter"]);
    assert_eq!(
        counter,
        first + 3,
        "the replica holds the primary's counter"
    );
}

/// Fair tickets strictly growing on one node, whatever happens to the keys between two grants
/// within about one millisecond: each round is one pipeline (a grant to `a`, the commands of
/// `between`, a grant to `b`), and every ticket of the test is above every one before it.
fn tickets_keep_growing_through(
    conn: &mut redis::Connection,
    rounds: usize,
    between: &[Vec<Vec<u8>>],
) -> Vec<u64> {
    let mut tickets: Vec<u64> = Vec::with_capacity(rounds * 2);
    for round in 0..rounds {
        let (a, b) = (format!("a{round}"), format!("b{round}"));
        let mut pipe = redis::pipe();
        pipe.cmd("SEM.ACQUIREFAIR")
            .arg(&["t", "5", "60", "ID", &a, "WITHTICKET"]);
        for command in between {
            pipe.cmd(std::str::from_utf8(&command[0]).unwrap())
                .arg(&command[1..])
                .ignore();
        }
        pipe.cmd("SEM.ACQUIREFAIR")
            .arg(&["t", "5", "60", "ID", &b, "WITHTICKET"]);
        let ((_, first), (_, second)): ((String, u64), (String, u64)) =
            pipe.query(conn).expect("a round");
        for ticket in [first, second] {
            if let Some(&last) = tickets.last() {
                assert!(
                    ticket > last,
                    "round {round}: ticket {ticket} after {last} (between: {:?})",
                    between
                        .iter()
                        .map(|c| String::from_utf8_lossy(&c[0]).into_owned())
                        .collect::<Vec<_>>()
                );
            }
            tickets.push(ticket);
        }
        // Room for the next round, whatever the step left.
        let _: () = run(conn, &["DEL", "t", "t:owner", "t:counter"]);
    }
    tickets
}

fn words(args: &[&str]) -> Vec<Vec<u8>> {
    args.iter().map(|a| a.as_bytes().to_vec()).collect()
}

#[test]
fn no_ticket_repeats_on_a_node_when_the_keys_go_between_two_grants_in_one_millisecond() {
    let server = Server::start_with(&NO_PERSISTENCE);
    let mut conn = server.connection();
    tickets_keep_growing_through(
        &mut conn,
        200,
        &[words(&["DEL", "t", "t:owner", "t:counter"])],
    );
    tickets_keep_growing_through(&mut conn, 200, &[words(&["FLUSHDB"])]);
    let cases: &[&[&[&str]]] = &[
        &[&["UNLINK", "t:counter"]],
        &[&["DEL", "t:counter"]],
        &[&["FLUSHALL"]],
        &[&["SWAPDB", "0", "1"], &["FLUSHDB"]],
        &[&["MOVE", "t:counter", "2"]],
        &[&["RENAME", "t:counter", "elsewhere"]],
        // An expiry: a deadline already past deletes the key at once.
        &[&["PEXPIREAT", "t:counter", "1"]],
    ];
    for case in cases {
        let between: Vec<_> = case.iter().map(|c| words(c)).collect();
        tickets_keep_growing_through(&mut conn, 50, &between);
        let _: () = run(&mut conn, &["FLUSHALL"]);
    }
    // A counter restored from long before.
    let _: (String, u64) = run(
        &mut conn,
        &["SEM.ACQUIREFAIR", "t", "5", "60", "WITHTICKET"],
    );
    let old: Vec<u8> = run(&mut conn, &["DUMP", "t:counter"]);
    let restore = vec![
        b"RESTORE".to_vec(),
        b"t:counter".to_vec(),
        b"0".to_vec(),
        old,
        b"REPLACE".to_vec(),
    ];
    let tickets = tickets_keep_growing_through(&mut conn, 50, &[restore]);
    // Every later grant, of any name, goes on above.
    let (_, other): (String, u64) = run(
        &mut conn,
        &["SEM.ACQUIREFAIR", "u", "5", "60", "WITHTICKET"],
    );
    assert!(other > *tickets.last().unwrap());
    assert!(info_sem(&mut conn)["sem_ticket_floor"] > other);
}

#[test]
fn a_hand_off_after_the_counter_went_gets_a_ticket_above_every_one_before() {
    let server = Server::start_with(&NO_PERSISTENCE);
    let mut conn = server.connection();
    for round in 0..20 {
        let (first, ticket): (String, u64) = run(
            &mut conn,
            &["SEM.ACQUIREFAIR", "h", "1", "60", "WITHTICKET"],
        );
        let waiter = Pending::send(
            &server,
            &["SEM.ACQUIREFAIR", "h", "1", "60", "WITHTICKET", "WAIT", "5"],
        );
        until_in_line(&mut conn, "h", 1);
        // Within about one millisecond: another name's first grant, then the counter goes and
        // the permit is handed over.
        let ((_, other), (), released): ((String, u64), (), i64) = redis::pipe()
            .cmd("SEM.ACQUIREFAIR")
            .arg(&[&format!("o{round}"), "1", "60", "WITHTICKET"])
            .cmd("DEL")
            .arg("h:counter")
            .cmd("SEM.RELEASE")
            .arg("h")
            .arg(&first)
            .query(&mut conn)
            .expect("SEM.ACQUIREFAIR, DEL and SEM.RELEASE");
        assert_eq!(released, 1);
        assert!(other > ticket);
        let (next, handed): (String, u64) =
            redis::FromRedisValue::from_redis_value(&waiter.reply().expect("the waiter's grant"))
                .expect("[id, ticket]");
        assert!(
            handed > other,
            "round {round}: ticket {handed} after {other}"
        );
        let released: i64 = run(&mut conn, &["SEM.RELEASE", "h", &next]);
        assert_eq!(released, 1);
    }
}

#[test]
fn a_set_of_names_without_counters_gets_distinct_growing_tickets() {
    let server = Server::start_with(&NO_PERSISTENCE);
    let mut conn = server.connection();
    let mut last = 0;
    for _ in 0..50 {
        let (_, tickets): (String, Vec<u64>) = run(
            &mut conn,
            &[
                "SEM.ACQUIREALL",
                "3",
                "x",
                "1",
                "1",
                "y",
                "1",
                "1",
                "z",
                "1",
                "1",
                "60",
                "FAIR",
                "WITHTICKET",
            ],
        );
        for ticket in tickets {
            assert!(ticket > last, "ticket {ticket} after {last}");
            last = ticket;
        }
        let _: () = run(&mut conn, &["FLUSHDB"]);
    }
}

#[test]
fn a_counter_written_by_hand_far_ahead_lifts_its_own_name_only() {
    let server = Server::start_with(&NO_PERSISTENCE);
    let mut conn = server.connection();
    let (_, before): (String, u64) = run(
        &mut conn,
        &["SEM.ACQUIREFAIR", "mine", "5", "60", "WITHTICKET"],
    );
    // Another client sets one name's counter to the last ticket a score holds exactly.
    let _: () = run(&mut conn, &["SET", "theirs:counter", "9007199254740991"]);
    let (_, last): (String, u64) = run(
        &mut conn,
        &["SEM.ACQUIREFAIR", "theirs", "5", "60", "WITHTICKET"],
    );
    assert_eq!(last, 9_007_199_254_740_992);
    let err = error_of(&mut conn, &["SEM.ACQUIREFAIR", "theirs", "5", "60"]);
    assert!(err.contains("2^53"), "{err}");
    // Every other name goes on from the node's floor, above its own tickets.
    let (_, after): (String, u64) = run(
        &mut conn,
        &["SEM.ACQUIREFAIR", "mine", "5", "60", "WITHTICKET"],
    );
    assert_eq!(after, before + 1);
    let (_, fresh): (String, u64) = run(
        &mut conn,
        &["SEM.ACQUIREFAIR", "new", "5", "60", "WITHTICKET"],
    );
    assert!(fresh > after && fresh < last, "{fresh}");
}
