"""Tests of the redsem package through redis-py's cluster clients (redis.cluster.RedisCluster and
redis.asyncio.cluster.RedisCluster) against a real local Redis Cluster started with
scripts/test-cluster. They skip themselves unless REDSEM_CLUSTER names the cluster to test:

  module    every node has the module (with its command filter)
  filter0   every node has the module loaded with `command-filter 0` (as on Redis 8.4+: only the
            long form, which names every key, is taken)
  scripts   no node has the module: the package runs its Lua script there

REDIS_SERVER names the server binary (default redis-server), REDSEM_MODULE the module (default
target/debug/libredsem.so of the repository), REDSEM_TEST_CLUSTER scripts/test-cluster.
Every test runs through the sync and the asyncio cluster client: the asyncio one on an event
loop of its own thread, so one test body drives both.
"""

import asyncio
import importlib.resources
import json
import os
import re
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest
import redis
import redis.asyncio.cluster
import redis.cluster
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.retry import Retry

from redsem import (
    AsyncSemaphore,
    AsyncSemaphoreSet,
    ModuleRequired,
    NotAcquired,
    NotDurable,
    PermitLost,
    Semaphore,
    SemaphoreError,
    SemaphoreSet,
    clear_limit,
    clear_limit_async,
    set_limit,
    set_limit_async,
    stored_limit,
    stored_limit_async,
    wait_empty,
    wait_empty_async,
)

ROOT = Path(__file__).resolve().parents[3]
CLUSTER = os.environ.get("REDSEM_CLUSTER") or ""
MODULE = os.environ.get("REDSEM_MODULE") or str(ROOT / "target/debug/libredsem.so")
REDIS_SERVER = os.environ.get("REDIS_SERVER") or "redis-server"
TEST_CLUSTER = os.environ.get("REDSEM_TEST_CLUSTER") or str(ROOT / "scripts/test-cluster")
SCRIPTS = CLUSTER == "scripts"

pytestmark = pytest.mark.skipif(not CLUSTER, reason="REDSEM_CLUSTER is not set")
assert CLUSTER in ("", "module", "filter0", "scripts"), f"REDSEM_CLUSTER={CLUSTER}"

SUFFIXES = ("", ":owner", ":counter", ":permits", ":limit", ":wake")
SEMAPHORE_COMMANDS = ("eval", "evalsha", "blpop", "sem.", "command|info")


class Cluster:
    """A local Redis Cluster of scripts/test-cluster, as REDSEM_CLUSTER asks."""

    def __init__(self, replicas: int = 0) -> None:
        self.dir = tempfile.mkdtemp(prefix="redsem-py-cluster-")
        options = ["--server", REDIS_SERVER, "--replicas", str(replicas)]
        if CLUSTER == "scripts":
            options.append("--modules-later")
        else:
            assert os.path.exists(MODULE), f"{MODULE} is missing: build the module (cargo build)"
            options += ["--module", MODULE]
            if CLUSTER == "filter0":
                options += ["--module-arg", "command-filter", "--module-arg", "0"]
        self.ports = [n["port"] for n in self.tool("start", *options)["nodes"]]
        self.port = self.primaries()[0]

    def tool(self, op, *args):
        done = subprocess.run(
            [TEST_CLUSTER, op, self.dir, *map(str, args)],
            capture_output=True, text=True, timeout=120,
        )
        assert done.returncode == 0, f"test-cluster {op}: {done.stdout}{done.stderr}"
        return json.loads(done.stdout) if done.stdout.strip() else None

    def view(self) -> dict:
        """CLUSTER NODES, as the first node that answers sees the cluster."""
        for port in self.ports:
            r = self.node(port)
            try:
                return r.execute_command("CLUSTER NODES")
            except redis.ConnectionError:
                continue
            finally:
                r.close()
        raise AssertionError("no node answers")

    def live_nodes(self):
        """(port, CLUSTER NODES entry) of each node not marked failing."""
        return [
            (int(address.split(":")[1].split("@")[0]), node)
            for address, node in self.view().items()
            if "fail" not in node["flags"]
        ]

    def live_ports(self):
        return [port for port, _ in self.live_nodes()]

    def primaries(self):
        """The ports of the live primaries."""
        return [port for port, node in self.live_nodes() if "master" in node["flags"]]

    def owner(self, name) -> int:
        """The port of the primary serving ``name``'s slot, as the nodes see it now."""
        slot = key_slot(name.encode())
        for port, node in self.live_nodes():
            if "master" in node["flags"]:
                if any(int(r[0]) <= slot <= int(r[-1]) for r in node["slots"]):
                    return port
        raise AssertionError(f"no primary serves slot {slot}")

    def node(self, port) -> redis.Redis:
        # No retry: a node killed by a test refuses at once.
        return redis.Redis(port=port, retry=Retry(NoBackoff(), 0))

    def live(self, name) -> int:
        """Permits of ``name`` in use, as the primary of its slot counts them."""
        r = self.node(self.owner(name))
        try:
            keys = [name + suffix for suffix in SUFFIXES]
            if SCRIPTS:
                return r.eval(script_source(), 6, *keys, "GET")
            return r.execute_command("SEM.GET", *keys[:5])
        finally:
            r.close()

    def semaphore_calls(self) -> dict:
        """Per live node, how many scripts, BLPOPs, SEM.* and COMMAND INFO it has run."""
        calls = {}
        for port in self.live_ports():
            r = self.node(port)
            stats = r.info("commandstats")
            r.close()
            calls[port] = sum(
                    value["calls"] for key, value in stats.items()
                    if key[len("cmdstat_"):].startswith(SEMAPHORE_COMMANDS)
                )
        return calls

    def redirections(self) -> int:
        """MOVED, ASK and TRYAGAIN answers the live nodes have given (INFO errorstats)."""
        total = 0
        for port in self.live_ports():
            r = self.node(port)
            stats = r.info("errorstats")
            r.close()
            total += sum(
                stats.get(f"errorstat_{code}", {}).get("count", 0)
                for code in ("MOVED", "ASK", "TRYAGAIN")
            )
        return total

    def keys(self) -> int:
        total = 0
        for port in self.primaries():
            r = self.node(port)
            total += r.dbsize()
            r.close()
        return total

    def stop(self) -> None:
        self.tool("stop")


def script_source() -> bytes:
    return importlib.resources.files("redsem").joinpath("redsem.lua").read_bytes()


class SyncApi:
    """The package's calls through redis.cluster.RedisCluster."""

    def __init__(self, port: int) -> None:
        self.client = redis.cluster.RedisCluster(host="127.0.0.1", port=port)

    def acquire(self, name, limit, **options):
        return Semaphore(self.client, name, limit, **options).acquire()

    def acquire_all(self, semaphores, **options):
        return SemaphoreSet(self.client, semaphores, **options).acquire()

    def release(self, permit):
        return permit.release()

    def refresh(self, permit):
        return permit.refresh()

    def wait_empty(self, name, timeout):
        return wait_empty(self.client, name, timeout)

    def stored_limit(self, name, **options):
        return stored_limit(self.client, name, **options)

    def set_limit(self, name, limit):
        return set_limit(self.client, name, limit)

    def clear_limit(self, name):
        return clear_limit(self.client, name)

    def reload_map(self):
        """What the client does after a MOVED or a lost node: it reads the cluster's map anew."""
        self.client.nodes_manager.initialize()

    def close(self) -> None:
        self.client.close()


class AsyncApi:
    """The same calls through redis.asyncio.cluster.RedisCluster, run on an event loop in a
    thread of its own (so threads of a test can call them, and permits refresh themselves)."""

    def __init__(self, port: int) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

        async def connect():
            client = redis.asyncio.cluster.RedisCluster(host="127.0.0.1", port=port)
            return await client.initialize()

        self.client = self.run(connect())

    def run(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def acquire(self, name, limit, **options):
        return self.run(AsyncSemaphore(self.client, name, limit, **options).acquire())

    def acquire_all(self, semaphores, **options):
        return self.run(AsyncSemaphoreSet(self.client, semaphores, **options).acquire())

    def release(self, permit):
        return self.run(permit.release())

    def refresh(self, permit):
        return self.run(permit.refresh())

    def wait_empty(self, name, timeout):
        return self.run(wait_empty_async(self.client, name, timeout))

    def stored_limit(self, name, **options):
        return self.run(stored_limit_async(self.client, name, **options))

    def set_limit(self, name, limit):
        return self.run(set_limit_async(self.client, name, limit))

    def clear_limit(self, name):
        return self.run(clear_limit_async(self.client, name))

    def reload_map(self):
        self.run(self.client.nodes_manager.initialize())

    def close(self) -> None:
        self.run(self.client.aclose())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


APIS = {"sync": SyncApi, "asyncio": AsyncApi}


@pytest.fixture(scope="module")
def cluster():
    c = Cluster()
    yield c
    c.stop()


@pytest.fixture(scope="module", params=list(APIS))
def api(request, cluster):
    a = APIS[request.param](cluster.port)
    yield a
    a.close()


@pytest.fixture
def flush(cluster):
    for port in cluster.primaries():
        r = cluster.node(port)
        r.flushall()
        r.close()


def test_the_cluster_is_as_asked(cluster):
    """The configuration under test: the module on every node or none, and with filter0 a node
    that refuses the short form."""
    r = cluster.node(cluster.owner("{t}x"))
    try:
        module = r.execute_command("COMMAND INFO", "SEM.ACQUIRE")[0] is not None
        assert module is not SCRIPTS
        if CLUSTER == "filter0":
            with pytest.raises(redis.ResponseError, match="takes the long form"):
                r.execute_command("SEM.GET", "{t}x")
    finally:
        r.close()


def test_acquire_and_release(api, cluster, flush):
    name = "{plain}jobs"
    permit = api.acquire(name, 2, lease=10)
    assert cluster.live(name) == 1
    # Every key of the semaphore sits on the primary of its slot.
    owner = cluster.node(cluster.owner(name))
    assert owner.zrange(name, 0, -1) == [permit.id.encode()]
    owner.close()
    second = api.acquire(name, 2, lease=10)
    assert cluster.live(name) == 2
    with pytest.raises(NotAcquired):
        api.acquire(name, 2, lease=10)
    assert api.refresh(permit) is True
    assert api.release(permit) is True
    assert api.release(second) is True
    assert cluster.live(name) == 0


def test_a_bound_permit_keeps_its_own_connection_to_the_node(api, cluster, flush):
    """A BOUND permit lives on its own connection to the slot's primary: the client reading the
    cluster's map anew does not close it; the connection closing gives the permit back."""
    if SCRIPTS:
        return  # ModuleRequired: test_sets_and_wait_empty
    # On the node the client started from: the one whose connections a new map touches.
    name = next(
        n for n in (f"{{bound{i}}}jobs" for i in range(100)) if cluster.owner(n) == cluster.port
    )
    permit = api.acquire(name, 1, lease=30, bound=True)
    api.reload_map()
    assert api.refresh(permit) is True
    assert cluster.live(name) == 1
    owner = cluster.node(cluster.owner(name))
    try:
        # The holder's connection is the owner's only one sending SEM.*: kill every client but
        # ours there, as a process dying would.
        owner.client_kill_filter(_type="normal", skip_me=True)
        deadline = time.monotonic() + 2
        while cluster.live(name) != 0:
            assert time.monotonic() < deadline, "the permit was not given back"
            time.sleep(0.01)
    finally:
        owner.close()
    assert api.refresh(permit) is False
    assert permit.lost
    assert api.release(permit) is False


def test_fair_tickets_grow(api, cluster, flush):
    name = "{fair}printers"
    tickets = []
    for _ in range(5):
        permit = api.acquire(name, 1, lease=10, fair=True)
        tickets.append(permit.ticket)
        assert api.release(permit) is True
    assert all(a < b for a, b in zip(tickets, tickets[1:])), tickets


def test_a_waiter_is_served_after_a_release(api, cluster, flush):
    name = "{wait}jobs"
    holder = api.acquire(name, 1, lease=10)
    got = []

    def waiter():
        started = time.monotonic()
        permit = api.acquire(name, 1, lease=10, wait=5)
        got.append((permit, time.monotonic() - started))

    thread = threading.Thread(target=waiter)
    thread.start()
    time.sleep(0.3)
    assert not got
    assert api.release(holder) is True
    thread.join(5)
    assert got, "the waiter was not served"
    permit, waited = got[0]
    assert 0.25 <= waited < 3
    assert cluster.live(name) == 1
    assert api.release(permit) is True


def in_distinct_slots(*names):
    slots = {key_slot(name.encode()) for name in names}
    assert len(slots) == len(names)
    return names


def test_limits_hold_under_threads(api, cluster, flush):
    """8 threads over 3 names in 3 slots: never more holders than the limit."""
    limits = dict(zip(in_distinct_slots("{a}jobs", "{b}jobs", "{c}jobs"), (1, 2, 3)))
    names = list(limits)
    held = {name: 0 for name in names}
    most = {name: 0 for name in names}
    granted = []
    lock = threading.Lock()
    errors = []
    stop = time.monotonic() + 2.0

    def worker(i):
        try:
            while time.monotonic() < stop:
                name = names[(i + len(granted)) % 3]
                try:
                    permit = api.acquire(name, limits[name], lease=10, wait=2)
                except NotAcquired:
                    continue
                with lock:
                    held[name] += 1
                    most[name] = max(most[name], held[name])
                    granted.append(name)
                time.sleep(0.01)
                with lock:
                    held[name] -= 1
                assert api.release(permit) is True
        except Exception as err:  # reported below
            errors.append(err)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(15)
    assert not errors, errors
    assert all(most[name] <= limits[name] for name in names), (most, limits)
    assert all(most[name] >= 1 for name in names), most
    assert len(granted) > 20
    assert [cluster.live(name) for name in names] == [0, 0, 0]


def assert_module_required(cluster, what, call):
    before = cluster.semaphore_calls()
    with pytest.raises(ModuleRequired) as raised:
        call()
    assert str(raised.value) == f"{what} needs the redsem module loaded in the server"
    calls = cluster.semaphore_calls()
    # Only the module check (COMMAND INFO, once per node and client) may have been sent.
    assert sum(calls.values()) - sum(before.values()) <= 1


def test_sets_and_wait_empty(api, cluster, flush):
    semaphores = [("{app}gpu", 1), ("{app}licence", 5, 2)]
    if SCRIPTS:
        assert_module_required(cluster, "SEM.ACQUIREALL", lambda: api.acquire_all(semaphores))
        assert_module_required(cluster, "SEM.WAITEMPTY", lambda: api.wait_empty("{app}gpu", 1))
        assert_module_required(
            cluster, "BOUND", lambda: api.acquire("{app}gpu", 1, bound=True)
        )
        assert cluster.keys() == 0
        return
    permits = api.acquire_all(semaphores, lease=10, fair=True)
    assert (cluster.live("{app}gpu"), cluster.live("{app}licence")) == (1, 2)
    assert len(permits.tickets) == 2
    with pytest.raises(NotAcquired):
        api.acquire_all([("{app}gpu", 1)], lease=10, fair=True)
    assert api.wait_empty("{app}gpu", 0.2) is False
    done = []
    thread = threading.Thread(target=lambda: done.append(api.wait_empty("{app}licence", 5)))
    thread.start()
    time.sleep(0.2)
    assert api.refresh(permits) is True
    assert api.release(permits) is True
    thread.join(5)
    assert done == [True]
    assert (cluster.live("{app}gpu"), cluster.live("{app}licence")) == (0, 0)


def test_the_stored_limit(api, cluster, flush):
    name = "{limit}jobs"
    assert api.stored_limit(name) is None
    api.set_limit(name, 1)
    assert api.stored_limit(name) == 1
    permit = api.acquire(name, 5, lease=10)
    with pytest.raises(NotAcquired):
        api.acquire(name, 5, lease=10)
    assert api.clear_limit(name) is True
    assert api.stored_limit(name) is None
    assert api.clear_limit(name) is False
    other = api.acquire(name, 5, lease=10)
    assert api.release(permit) is True and api.release(other) is True


def test_a_call_gives_up_after_retry_for(api, cluster, flush):
    """A slot left half moved answers TRYAGAIN to a call on some of its keys: the call is resent
    until ``retry_for`` has passed, then raises SemaphoreError; once the slot is stable, the same
    call answers."""
    name = "{stuck}jobs"
    api.set_limit(name, 5)  # one key of the semaphore exists, the others do not
    slot = key_slot(name.encode())
    source = cluster.owner(name)
    target = next(port for port in cluster.primaries() if port != source)
    ids = {port: cluster.node(port).execute_command("CLUSTER MYID") for port in (source, target)}
    nodes = {port: cluster.node(port) for port in (source, target)}
    try:
        nodes[target].execute_command("CLUSTER SETSLOT", slot, "IMPORTING", ids[source])
        nodes[source].execute_command("CLUSTER SETSLOT", slot, "MIGRATING", ids[target])
        started = time.monotonic()
        with pytest.raises(SemaphoreError) as raised:
            api.stored_limit(name, retry_for=0.5)
        assert 0.5 <= time.monotonic() - started < 3
        message = str(raised.value)
        assert re.match(
            rf"no answer from the primary of slot {slot} after \d+\.\d s of retries through "
            "moves and failovers: TryAgainError: ",
            message,
        ), message
    finally:
        for port in (source, target):
            nodes[port].execute_command("CLUSTER SETSLOT", slot, "STABLE")
            nodes[port].close()
    assert api.stored_limit(name) == 5


def test_names_without_a_hash_tag_or_across_slots_are_refused_before_anything_is_sent(
    api, cluster, flush
):
    before = cluster.semaphore_calls()

    def untagged(n):
        return (
            f'in Redis Cluster a semaphore\'s name needs a hash tag, e.g. "{{{n}}}" or '
            f'"app:{{{n}}}": the keys of "{n}" ({n}, {n}:owner, {n}:counter, {n}:permits, '
            f"{n}:limit) would fall in different slots"
        )

    assert untagged("jobs") == (
        'in Redis Cluster a semaphore\'s name needs a hash tag, e.g. "{jobs}" or "app:{jobs}": '
        'the keys of "jobs" (jobs, jobs:owner, jobs:counter, jobs:permits, jobs:limit) would '
        "fall in different slots"
    )
    calls = [
        ("jobs", lambda: api.acquire("jobs", 1)),
        ("{}jobs", lambda: api.acquire("{}jobs", 1, wait=1)),  # an empty tag is no tag
        ("jobs}{", lambda: api.acquire("jobs}{", 1)),
        ("jobs", lambda: api.stored_limit("jobs")),
        ("jobs", lambda: api.set_limit("jobs", 2)),
        ("jobs", lambda: api.clear_limit("jobs")),
        ("jobs", lambda: api.wait_empty("jobs", 1)),
        ("jobs", lambda: api.acquire_all([("{app}a", 1), ("jobs", 1)])),
    ]
    for name, call in calls:
        with pytest.raises(ValueError) as raised:
            call()
        assert str(raised.value) == untagged(name)
    with pytest.raises(ValueError) as raised:
        api.acquire_all([("{x}a", 1), ("{x}b", 1), ("{y}c", 1)])
    assert str(raised.value) == (
        "in Redis Cluster the semaphores of a set must share a slot: give their names one hash "
        f'tag, e.g. "{{app}}a" and "{{app}}b" ("{{x}}a" is in slot {key_slot(b"x")}, "{{y}}c" '
        f"in slot {key_slot(b'y')})"
    )
    assert cluster.semaphore_calls() == before
    assert cluster.keys() == 0


def test_a_reshard_under_load(api, cluster, flush):
    """Threads acquire (fair, waiting), hold and release while the slot of their semaphore moves
    to another primary and back: never more holders than the limit, every ticket above those of
    the permits given back before its acquire began, no permit lost."""
    name, limit = "{move}jobs", 2
    slot = key_slot(name.encode())
    home = cluster.owner(name)
    away = next(port for port in cluster.primaries() if port != home)
    lock = threading.Lock()
    state = {"held": 0, "most": 0, "grants": 0}
    permits = []  # (ticket, when its acquire began, when its release had answered)
    errors = []
    running = threading.Event()
    running.set()

    def worker():
        try:
            while running.is_set():
                began = time.monotonic()
                try:
                    permit = api.acquire(name, limit, lease=10, wait=8, fair=True)
                except NotAcquired:
                    continue
                with lock:
                    state["held"] += 1
                    state["most"] = max(state["most"], state["held"])
                    state["grants"] += 1
                time.sleep(0.02)
                with lock:
                    state["held"] -= 1
                assert api.release(permit) is True, "a permit was lost"
                permits.append((permit.ticket, began, time.monotonic()))
        except Exception as err:  # reported below
            errors.append(err)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    redirections = cluster.redirections()
    for t in threads:
        t.start()
    try:
        time.sleep(0.3)
        cluster.tool("move", slot, away, "--pause-ms", 50)
        assert cluster.owner(name) == away
        grants = state["grants"]
        time.sleep(0.5)
        cluster.tool("move", slot, home, "--pause-ms", 50)
        assert cluster.owner(name) == home
        time.sleep(0.5)
        assert state["grants"] > grants, "nothing was granted after the first move"
    finally:
        running.clear()
        for t in threads:
            t.join(20)
    assert not errors, errors
    # The clients met the moves (and followed them: every permit was released above).
    assert cluster.redirections() > redirections
    assert state["most"] <= limit, state
    tickets = [ticket for ticket, _, _ in permits]
    assert len(set(tickets)) == len(tickets)
    for ticket, began, _ in permits:
        before = [t for t, _, released in permits if released < began]
        assert all(t < ticket for t in before), (ticket, max(before))
    assert cluster.live(name) == 0


def test_a_primary_killed_under_a_waiter_and_a_holder():
    """The primary serving a semaphore dies while one client holds its permit (refreshing it)
    and another waits: after the failover the waiter gets its permit (once the holder gives it
    back) or a clear error, never a second permit beside the holder's; the holder's refresh
    either succeeds on the new primary or reports PermitLost."""
    c = Cluster(replicas=1)
    apis = {kind: make(c.port) for kind, make in APIS.items()}
    try:
        for kind, api in apis.items():
            name = "{failover-%s}jobs" % kind
            killed = c.owner(name)
            # Refreshed every 4 s: the failover (3 to 5 s) ends within the lease.
            holder = api.acquire(name, 1, lease=12)
            got = []

            def waiter(api=api, name=name):
                try:
                    got.append(api.acquire(name, 1, lease=6, wait=25))
                except (SemaphoreError, redis.RedisError) as err:
                    got.append(err)

            thread = threading.Thread(target=waiter)
            thread.start()
            time.sleep(0.3)
            c.tool("kill", killed)
            c.tool("wait")
            assert c.owner(name) != killed
            # The holder's refresh reaches the new primary: it finds the holder (the grant
            # reached the replica) or reports the permit lost.
            refreshed = api.refresh(holder)
            assert refreshed is not holder.lost
            if refreshed:
                # The new primary has the holder: the waiter waits on.
                assert not got, "the waiter was served beside a live holder"
                assert c.live(name) == 1
            else:
                # No holder there (the grant had not reached the replica, or the lease ran out
                # during the failover): the permit is reported lost.
                with pytest.raises(PermitLost):
                    holder.check()
            assert api.release(holder) is refreshed
            thread.join(30)
            assert got, "the waiter got no answer"
            outcome = got[0]
            if isinstance(outcome, Exception):
                assert str(outcome)
            else:
                assert c.live(name) == 1
                assert api.release(outcome) is True
            assert c.live(name) == 0
    finally:
        for api in apis.values():
            api.close()
        c.stop()


def test_the_readmes_cluster_example(cluster, flush, capsys):
    """The cluster example of clients/python/README.md, as written there, on the test cluster
    (without the module, its set raises ModuleRequired)."""
    readme = Path(__file__).resolve().parents[1] / "README.md"
    blocks = [
        block
        for block in re.findall(r"```python\n(.*?)```", readme.read_text(), re.S)
        if "RedisCluster" in block
    ]
    assert len(blocks) == 1
    block = blocks[0]
    assert "port=7000" in block
    code = compile(block.replace("port=7000", f"port={cluster.port}"), str(readme), "exec")
    if CLUSTER == "scripts":
        with pytest.raises(ModuleRequired):
            exec(code, {})
    else:
        exec(code, {})
    printed = capsys.readouterr().out
    assert "working as" in printed
    if CLUSTER != "scripts":
        assert "holding ('{render}gpu', '{render}licence')" in printed
    for port in cluster.primaries():
        r = cluster.node(port)
        # Given back: no holder left (a waiter's own list may linger for 6 s).
        assert not [k for k in r.keys() if b":wake:" not in k], "permits left behind"
        r.close()


@pytest.mark.parametrize("kind", list(APIS))
def test_waits_reuse_the_nodes_connections(kind, cluster, flush):
    """20 waits in a row, each blocked until a release, through a new client: the slot's primary
    receives at most 3 new connections (the holder's, the waiter's, and one for the calls beside
    a blocked wait). A client's connections that a new map of the cluster closed (redis-py does
    that on every refresh) are opened again once each: a new client starts without them."""
    name = "{reuse}jobs"
    owner = cluster.node(cluster.owner(name))
    api = APIS[kind](cluster.port)
    try:
        api.release(api.acquire(name, 1, lease=10))  # the node's first connections
        before = owner.info("stats")["total_connections_received"]
        for _ in range(20):
            holder = api.acquire(name, 1, lease=10)
            threading.Timer(0.02, api.release, args=(holder,)).start()
            started = time.monotonic()
            permit = api.acquire(name, 1, lease=10, wait=5)
            assert time.monotonic() - started >= 0.015
            assert api.release(permit) is True
        received = owner.info("stats")["total_connections_received"] - before
        assert received <= 3, received
    finally:
        api.close()
        owner.close()
    assert cluster.live(name) == 0


@pytest.mark.skipif(not SCRIPTS, reason="the module loaded into nodes without it")
def test_the_module_loaded_live_on_the_node_is_picked_up():
    """A waiter in the script's line on a node that gets the module: the release through the
    script tells it to use the module, and it is granted there at once; its client is on the
    module for that node from then on (BOUND, the module's alone, works)."""
    c = Cluster()
    apis = {kind: make(c.port) for kind, make in APIS.items()}
    try:
        primaries = c.primaries()
        for i, (kind, api) in enumerate(apis.items()):
            # Each on a node of its own, still without the module.
            name = next(
                n for n in (f"{{live-{kind}-{k}}}jobs" for k in range(100))
                if c.owner(n) == primaries[i]
            )
            node = c.node(primaries[i])
            holder = api.acquire(name, 1, lease=10)
            got = []

            def waiter(api=api, name=name):
                got.append((api.acquire(name, 1, lease=10, wait=10), time.monotonic()))

            thread = threading.Thread(target=waiter, daemon=True)
            thread.start()
            deadline = time.monotonic() + 5
            while node.zcard(f"{name}:line") != 1:
                assert time.monotonic() < deadline, "the waiter is not in line"
                time.sleep(0.01)
            node.execute_command("MODULE", "LOAD", MODULE)
            assert api.release(holder) is True
            released = time.monotonic()
            thread.join(5)
            permit, granted = got[0]
            assert granted - released < 0.2, granted - released
            assert node.execute_command("SEM.GET", name, *[name + s for s in SUFFIXES[1:5]]) == 1
            assert api.release(permit) is True
            bound = api.acquire(name, 1, lease=10, bound=True)
            assert api.release(bound) is True
            assert not node.exists(f"{name}:line")
            node.close()
    finally:
        for api in apis.values():
            api.close()
        c.stop()


def test_a_waiter_cut_by_a_failover_waits_on_the_new_primary():
    """CLUSTER FAILOVER on the replica of a semaphore's primary while one client holds its
    permit and another waits: the old primary ends the wait with UNBLOCKED, and the waiter waits
    again on the new primary, for what is left of its wait, until the holder gives its permit
    back there; never an error, never a second permit beside the holder's."""
    c = Cluster(replicas=1)
    apis = {kind: make(c.port) for kind, make in APIS.items()}
    try:
        for kind, api in apis.items():
            name = "{unblocked-%s}jobs" % kind
            primary = c.owner(name)
            node = c.node(primary)
            primary_id = node.execute_command("CLUSTER MYID").decode()
            replica = next(
                int(address.split(":")[1].split("@")[0])
                for address, entry in c.view().items()
                if entry["master_id"] == primary_id and "fail" not in entry["flags"]
            )
            # Durable: WAIT on the connection of the grant, so the replica has the holder.
            holder = api.acquire(name, 1, lease=30, durable_replicas=1)
            follower = c.node(replica)
            follower.execute_command("READONLY")
            assert follower.zrange(name, 0, -1) == [holder.id.encode()]
            follower.close()
            got = []

            def waiter(api=api, name=name):
                try:
                    got.append(api.acquire(name, 1, lease=30, wait=25))
                except Exception as err:
                    got.append(err)

            thread = threading.Thread(target=waiter)
            thread.start()
            command = "blpop" if SCRIPTS else "sem.acquire"
            deadline = time.monotonic() + 5
            while not any(
                "b" in client["flags"] and client["cmd"] == command
                for client in node.client_list()
            ):
                assert time.monotonic() < deadline, "the waiter does not wait"
                time.sleep(0.01)
            node.close()
            promoted = c.node(replica)
            assert promoted.execute_command("CLUSTER FAILOVER") in (True, b"OK")
            deadline = time.monotonic() + 10
            while c.owner(name) != replica:
                assert time.monotonic() < deadline, "the replica was not promoted"
                time.sleep(0.05)
            promoted.close()
            time.sleep(0.5)
            assert got == [], "the waiter did not wait on"
            assert c.live(name) == 1
            assert api.release(holder) is True
            thread.join(10)
            assert len(got) == 1 and not isinstance(got[0], Exception), got
            assert c.live(name) == 1
            assert api.release(got[0]) is True
            assert c.live(name) == 0
    finally:
        for api in apis.values():
            api.close()
        c.stop()


def test_a_durable_wait_cut_by_a_failover_is_answered_by_the_new_primary():
    """CLUSTER FAILOVER while a durable grant's WAIT blocks (2 replicas wanted, 1 there): the old
    primary ends WAIT with UNBLOCKED. WAIT is not resent on another connection as if it proved
    anything: the holder is refreshed on the new primary and WAIT follows there, whose one
    replica (the old primary) acknowledges it: NotDurable, 1 of 2, and the permit given back."""
    c = Cluster(replicas=1)
    apis = {kind: make(c.port) for kind, make in APIS.items()}
    try:
        for kind, api in apis.items():
            name = "{durable-%s}jobs" % kind
            primary = c.owner(name)
            node = c.node(primary)
            primary_id = node.execute_command("CLUSTER MYID").decode()
            replica = next(
                int(address.split(":")[1].split("@")[0])
                for address, entry in c.view().items()
                if entry["master_id"] == primary_id and "fail" not in entry["flags"]
            )
            got = []

            def acquire(api=api, name=name):
                try:
                    got.append(
                        api.acquire(name, 1, lease=30, durable_replicas=2, durable_timeout_ms=4000)
                    )
                except Exception as err:
                    got.append(err)

            thread = threading.Thread(target=acquire)
            thread.start()
            deadline = time.monotonic() + 5
            while not any(client["cmd"] == "wait" for client in node.client_list()):
                assert time.monotonic() < deadline, "no WAIT blocks"
                time.sleep(0.01)
            node.close()
            promoted = c.node(replica)
            assert promoted.execute_command("CLUSTER FAILOVER") in (True, b"OK")
            promoted.close()
            thread.join(20)
            assert len(got) == 1
            outcome = got[0]
            assert isinstance(outcome, NotDurable), outcome
            assert (outcome.acked, outcome.wanted) == (1, 2)
            assert c.owner(name) == replica
            assert c.live(name) == 0
    finally:
        for api in apis.values():
            api.close()
        c.stop()
