"""Tests of the redsem package against a real redis-server with the module loaded, or without
it (REDSEM_BACKEND=scripts): then the servers start without the module (with
enable-module-command, so a test may MODULE LOAD it), every test runs through the script, and
the tests of what only the module does assert ModuleRequired instead.

REDSEM_MODULE names the module (default: target/debug/libredsem.so of the repository),
REDIS_SERVER the server binary (default: redis-server). Run: pip install clients/python, then python -m pytest clients/python/tests
"""

import asyncio
import hashlib
import importlib.resources
import inspect
import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path

import pytest
import redis
import redis.asyncio
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.retry import Retry

import redsem
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
    acquire_all,
    acquire_all_async,
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
MODULE = os.environ.get("REDSEM_MODULE") or str(ROOT / "target/debug/libredsem.so")
REDIS_SERVER = os.environ.get("REDIS_SERVER") or "redis-server"
BACKEND = os.environ.get("REDSEM_BACKEND") or "module"
assert BACKEND in ("module", "scripts"), f"REDSEM_BACKEND={BACKEND}: module or scripts"
# Every server of the suite runs without the module: the package goes through the script.
SCRIPTS = BACKEND == "scripts"
SUFFIXES = ("", ":owner", ":counter", ":permits", ":limit", ":wake")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A redis-server on a free loopback port, in a scratch directory: with the module loaded,
    or (``module=False``, the default with REDSEM_BACKEND=scripts) without it and with
    enable-module-command, so that a test may MODULE LOAD it."""

    def __init__(self, *extra: str, module: bool = not SCRIPTS) -> None:
        assert os.path.exists(MODULE), f"{MODULE} is missing: build the module (cargo build)"
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="redsem-py-")
        self.log = open(os.path.join(self.dir, "redis.log"), "wb")
        command = [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1"]
        command += ["--save", "", "--appendonly", "no", "--dir", self.dir]
        if module:
            command += ["--loadmodule", MODULE]
        else:
            command += ["--enable-module-command", "yes"]
        command += extra
        self.process = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT)
        probe = redis.Redis(port=self.port)
        deadline = time.monotonic() + 20
        while True:
            assert self.process.poll() is None, self.read_log()
            try:
                probe.ping()
                break
            except redis.RedisError:
                assert time.monotonic() < deadline, self.read_log()
                time.sleep(0.05)
        probe.close()

    def read_log(self) -> str:
        return Path(self.dir, "redis.log").read_text(errors="replace")

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def server():
    s = Server()
    probe = redis.Redis(port=s.port)
    assert has_module(probe) is not SCRIPTS, f"REDSEM_BACKEND={BACKEND}, and the module is not so"
    probe.close()
    yield s
    s.stop()


@pytest.fixture
def r(server):
    client = redis.Redis(port=server.port)
    client.flushall()
    yield client
    client.close()


@pytest.fixture(scope="session")
def plain_server(server):
    """A server without the module: the suite's own with REDSEM_BACKEND=scripts, else one more."""
    if SCRIPTS:
        yield server
        return
    s = Server(module=False)
    yield s
    s.stop()


@pytest.fixture
def plain(plain_server):
    client = redis.Redis(port=plain_server.port)
    client.flushall()
    yield client
    client.close()


def script_source() -> bytes:
    """The script as the installed package ships it."""
    return importlib.resources.files("redsem").joinpath("redsem.lua").read_bytes()


def has_module(r) -> bool:
    return r.execute_command("COMMAND INFO", "SEM.ACQUIRE")[0] is not None


def sem(r, op, name, *args):
    """SEM.<op> name args..., or the same through the script where the module is not loaded."""
    if has_module(r):
        return r.execute_command(f"SEM.{op}", name, *args)
    return r.eval(script_source(), 6, *[name + suffix for suffix in SUFFIXES], op, *args)


def floor(r) -> int:
    """The lowest fair ticket a fresh name may get from now on: the server's clock in
    microseconds (milliseconds x 1000), and with the module at least its fencing floor. A fresh
    name's first ticket is the clock of its grant (module and script alike), its next ones one
    up per grant with the module, each above the last through the script."""
    seconds, micros = r.time()
    clock = (seconds * 1000 + micros // 1000) * 1000
    if has_module(r):
        return max(clock, int(r.info("sem")["sem_ticket_floor"]))
    return clock


# The most a fresh name's first ticket may lie above ``floor``: the tests' grants come within a
# minute of it.
FIRST_GRANT_WITHIN = 60_000_000


def assert_tickets(tickets, f, scripts=SCRIPTS):
    """Fair tickets of one name, in grant order, after ``floor`` gave ``f``: the first is the
    clock of its grant (``f`` or later); with the module the next ones are one up each, through
    the script each is above the last (max(counter + 1, the clock in microseconds))."""
    tickets = list(tickets)
    assert f <= tickets[0] < f + FIRST_GRANT_WITHIN, (tickets, f)
    if scripts:
        assert all(a < b for a, b in zip(tickets, tickets[1:])), tickets
    else:
        assert tickets == list(range(tickets[0], tickets[0] + len(tickets)))


def live(r, name) -> int:
    """Permits in use, as the server counts them (SEM.GET, or the script's GET)."""
    return sem(r, "GET", name)


def sent_calls(r) -> dict:
    """How many times each command was run, from INFO commandstats (``evalsha``, ``sem.acquire``,
    ``command|info``, ...)."""
    stats = r.info("commandstats")
    return {key[len("cmdstat_"):]: value["calls"] for key, value in stats.items()}


def script_runs(r) -> int:
    """Script runs that did not fail (each asks COMMAND INFO SEM.ACQUIRE itself once)."""
    stats = r.info("commandstats")
    return sum(
        stats.get(f"cmdstat_{cmd}", {}).get("calls", 0)
        - stats.get(f"cmdstat_{cmd}", {}).get("failed_calls", 0)
        for cmd in ("eval", "evalsha")
    )


SEMAPHORE_COMMANDS = ("eval", "evalsha", "blpop", "sem.")


def semaphore_calls(r) -> int:
    """Scripts, BLPOPs and SEM.* commands run so far."""
    return sum(n for cmd, n in sent_calls(r).items() if cmd.startswith(SEMAPHORE_COMMANDS))


def assert_module_required(r, what, call):
    """``call()`` raises ModuleRequired for ``what``, having sent nothing for a semaphore."""
    before = semaphore_calls(r)
    with pytest.raises(ModuleRequired) as raised:
        call()
    assert str(raised.value) == f"{what} needs the redsem module loaded in the server"
    assert isinstance(raised.value, SemaphoreError)
    assert semaphore_calls(r) == before


async def assert_module_required_async(r, what, call):
    """As assert_module_required, for a coroutine function (``r`` a sync client)."""
    before = semaphore_calls(r)
    with pytest.raises(ModuleRequired) as raised:
        await call()
    assert str(raised.value) == f"{what} needs the redsem module loaded in the server"
    assert semaphore_calls(r) == before


def wait_until(what, condition, limit=5.0):
    deadline = time.monotonic() + limit
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.01)


def test_the_readme_examples(r, server, capsys):
    """The Python examples of clients/README.md, as written there, on the test server (without
    the module, the ones that use BOUND or sets raise ModuleRequired)."""
    readme = ROOT / "clients/README.md"
    blocks = re.findall(r"```python\n(.*?)```", readme.read_text(), re.S)
    assert len(blocks) == 4
    f = floor(r)
    for i, block in enumerate(blocks):
        assert "port=6379" in block
        code = compile(block.replace("port=6379", f"port={server.port}"), str(readme), "exec")
        if SCRIPTS and i in (1, 2):  # BOUND; acquire_all and wait_empty
            with pytest.raises(ModuleRequired):
                exec(code, {})
        else:
            exec(code, {})
    printed = capsys.readouterr().out
    assert "working on 2 as" in printed
    tickets = [int(t) for t in re.findall(r"has ticket (\d+)", printed)]
    assert len(tickets) == 1
    assert_tickets(tickets, f)
    if not SCRIPTS:
        assert "4 GPU slots held; lost: False" in printed
        pair = re.search(r"tickets \((\d+), (\d+)\)", printed)
        assert pair is not None, printed
        # Two fresh names granted in one step: the second ticket the next one up.
        assert int(pair.group(2)) == int(pair.group(1)) + 1
        assert_tickets([int(pair.group(1))], f)
        assert "drained: True" in printed
    assert "paused; stored limit: 0" in printed
    assert "cleared: True stored limit: None" in printed
    names = ("jobs", "printers", "gpus", "gpu", "licence", "deploys", "reports")
    assert [live(r, name) for name in names] == [0] * len(names)


def test_the_packages_readme(r, server, capsys):
    """clients/python/README.md as written: its install line names this package's folder from
    the repository's root (scripts/test-clients installs it so), and its example for one server
    runs on the test server (port 6379 replaced) and leaves no holder."""
    readme = ROOT / "clients/python/README.md"
    text = readme.read_text()
    installs = re.findall(r"```sh\n(.*?)```", text, re.S)
    assert len(installs) == 1
    command = installs[0].split("#")[0].split()
    assert command[:2] == ["pip", "install"] and len(command) == 3, command
    folder = ROOT / command[2]
    assert (folder / "src/redsem/__init__.py").is_file()
    project = (folder / "pyproject.toml").read_text()
    assert 'name = "redsem-client"' in project and 'readme = "README.md"' in project
    assert f"pip install --quiet --disable-pip-version-check {command[2]} " in (
        ROOT / "scripts/test-clients"
    ).read_text()
    blocks = [
        block
        for block in re.findall(r"```python\n(.*?)```", text, re.S)
        if "RedisCluster" not in block
    ]
    assert len(blocks) == 1
    assert "port=6379" in blocks[0]
    f = floor(r)
    exec(compile(blocks[0].replace("port=6379", f"port={server.port}"), str(readme), "exec"), {})
    printed = capsys.readouterr().out
    assert re.findall(r"working on (\d) as", printed) == ["0", "1", "2"]
    tickets = [int(t) for t in re.findall(r"has ticket (\d+)", printed)]
    assert len(tickets) == 1
    assert_tickets(tickets, f)
    assert [live(r, name) for name in ("jobs", "printers")] == [0, 0]


def test_grant_and_release(r):
    with Semaphore(r, "jobs", limit=3, lease=30) as permit:
        assert live(r, "jobs") == 1
        assert r.zscore("jobs", permit.id) is not None
        assert permit.ticket is None and not permit.lost
        permit.check()
    assert live(r, "jobs") == 0
    assert not r.exists("jobs")


def test_the_limit_refuses_at_once(r):
    sem = Semaphore(r, "jobs", limit=2, lease=30)
    with sem as first, sem as second:
        assert first.id != second.id
        started = time.monotonic()
        with pytest.raises(NotAcquired):
            with sem:
                pytest.fail("a third holder of a limit of 2")
        assert time.monotonic() - started < 1
        assert live(r, "jobs") == 2
    assert live(r, "jobs") == 0


def test_wait_times_out(r):
    with Semaphore(r, "jobs", limit=1, lease=30):
        started = time.monotonic()
        with pytest.raises(NotAcquired):
            Semaphore(r, "jobs", limit=1, lease=30, wait=0.3).acquire()
        waited = time.monotonic() - started
        assert 0.25 <= waited < 5, waited
        assert live(r, "jobs") == 1


def test_wait_is_served_when_a_holder_leaves(r):
    holder = Semaphore(r, "jobs", limit=1, lease=30).acquire()
    threading.Timer(0.3, holder.release).start()
    started = time.monotonic()
    with Semaphore(r, "jobs", limit=1, lease=30, wait=10) as permit:
        assert 0.2 <= time.monotonic() - started < 5
        assert holder.release() is True
        assert r.zrange("jobs", 0, -1) == [permit.id.encode()]


@pytest.mark.skipif(
    "timeout" not in inspect.signature(redis.connection.Connection.read_response).parameters,
    reason="redis-py before 8: a socket_timeout must exceed the wait (see the redsem package)",
)
def test_a_wait_may_outlast_the_socket_timeout(server):
    # No retries: a retried acquire would wait again, and hide the timeout.
    r = redis.Redis(port=server.port, socket_timeout=0.3, retry=Retry(NoBackoff(), 0))
    holder = Semaphore(r, "jobs", limit=1, lease=30).acquire()
    threading.Timer(0.8, holder.release).start()
    with Semaphore(r, "jobs", limit=1, lease=30, wait=10) as permit:
        assert r.zrange("jobs", 0, -1) == [permit.id.encode()]
    r.close()


def test_async_wait_may_outlast_the_socket_timeout(server):
    async def main():
        r = redis.asyncio.Redis(
            port=server.port, socket_timeout=0.3, retry=AsyncRetry(NoBackoff(), 0)
        )
        holder = await AsyncSemaphore(r, "ajobs", limit=1, lease=30).acquire()

        async def leave_soon():
            await asyncio.sleep(0.8)
            await holder.release()

        leaving = asyncio.ensure_future(leave_soon())
        async with AsyncSemaphore(r, "ajobs", limit=1, lease=30, wait=10) as permit:
            assert await r.zrange("ajobs", 0, -1) == [permit.id.encode()]
        await leaving
        await r.aclose()

    asyncio.run(main())


def test_one_semaphore_shared_by_threads_never_exceeds_its_limit(r):
    sem = Semaphore(r, "jobs", limit=2, lease=30, wait=10)
    inside, most, lock = [0], [0], threading.Lock()
    errors = []

    def work():
        try:
            with sem:
                with lock:
                    inside[0] += 1
                    most[0] = max(most[0], inside[0])
                time.sleep(0.1)
                with lock:
                    inside[0] -= 1
        except Exception as err:  # reported below
            errors.append(err)

    threads = [threading.Thread(target=work) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert most[0] == 2
    assert live(r, "jobs") == 0


def test_refresh_keeps_a_short_lease_alive(r):
    with Semaphore(r, "jobs", limit=1, lease=0.6) as permit:
        time.sleep(2.0)  # more than three leases
        assert not permit.lost
        assert r.zrange("jobs", 0, -1) == [permit.id.encode()]
        seconds, micros = r.time()
        assert r.zscore("jobs", permit.id) > seconds * 1000 + micros // 1000  # still ahead
    assert live(r, "jobs") == 0


def test_a_permit_removed_by_another_client_is_lost(r):
    with pytest.raises(PermitLost):
        with Semaphore(r, "jobs", limit=1, lease=0.6) as permit:
            r.delete("jobs")
            wait_until("the refresher reports the loss", lambda: permit.lost)
            with pytest.raises(PermitLost):
                permit.check()
            # Meanwhile another client may take it: that is why the loss is reported.
            with Semaphore(r, "jobs", limit=1, lease=30):
                pass


def test_a_lease_that_runs_out_during_the_work_raises_at_exit(r):
    with pytest.raises(PermitLost, match="SEM.RELEASE answered 0|no refresh"):
        with Semaphore(r, "jobs", limit=1, lease=0.2, auto_refresh=False) as permit:
            time.sleep(0.5)
    assert permit.lost
    assert live(r, "jobs") == 0


def test_the_bodys_own_exception_wins_over_a_lost_permit(r):
    with pytest.raises(ValueError):
        with Semaphore(r, "jobs", limit=1, lease=0.2, auto_refresh=False):
            time.sleep(0.5)
            raise ValueError("the work failed")
    with pytest.raises(KeyError):
        with Semaphore(r, "jobs", limit=1, lease=30):
            raise KeyError("x")
    assert live(r, "jobs") == 0


def test_fair_permits_carry_growing_tickets(r):
    f = floor(r)
    sem = Semaphore(r, "printers", limit=2, lease=30, fair=True)
    with sem as first:
        with sem as second:
            assert_tickets([first.ticket, second.ticket], f)
            assert r.zscore("printers:owner", second.id) == second.ticket
    with sem as third:
        assert_tickets([first.ticket, second.ticket, third.ticket], f)
    with pytest.raises(redis.ResponseError, match="fair holders"):
        with sem, Semaphore(r, "printers", limit=2, lease=30):
            pass


def test_a_fair_ticket_after_its_keys_went_is_above_the_one_before(r):
    """A name whose keys went between two fair grants (a DEL of the name, its owner set and its
    counter, or FLUSHDB), the two most often within one millisecond, still gives the second a
    ticket above the first, in every round: the script starts again from the server's clock in
    microseconds, the module above every ticket the node handed out."""
    sem = Semaphore(r, "fence", limit=1, lease=30, fair=True, auto_refresh=False)
    repeats = []
    for round in range(200):
        first = sem.acquire()
        if round % 2:
            r.flushdb()
        else:
            r.delete("fence", "fence:owner", "fence:counter")
        second = sem.acquire()
        assert first.ticket is not None and second.ticket is not None
        if second.ticket <= first.ticket:
            repeats.append((round, first.ticket, second.ticket))
        assert not first.release()  # its keys went: lost
        assert second.release()
    assert not repeats, f"{len(repeats)} of 200 rounds: (round, first, second) {repeats[:5]}"


def test_count_takes_several_permits_and_gives_some_back(r):
    with Semaphore(r, "gpus", limit=4, lease=30, count=3) as big:
        assert live(r, "gpus") == 3
        with pytest.raises(NotAcquired):
            Semaphore(r, "gpus", limit=4, lease=30, count=2).acquire()
        with Semaphore(r, "gpus", limit=4, lease=30, count=1):
            assert live(r, "gpus") == 4
        assert big.release_some(2) is True
        assert big.count == 1 and live(r, "gpus") == 1
    assert live(r, "gpus") == 0


def test_a_given_identifier_is_used(r):
    with Semaphore(r, "jobs", limit=1, lease=30, identifier="worker-7") as permit:
        assert permit.id == "worker-7"
        assert r.zrange("jobs", 0, -1) == [b"worker-7"]


def test_a_bound_permit_is_given_back_when_its_connection_closes(r):
    if SCRIPTS:
        sem = Semaphore(r, "jobs", limit=1, lease=3, bound=True)
        assert_module_required(r, "BOUND", sem.acquire)
        assert not r.exists("jobs")
        return
    with pytest.raises(PermitLost):
        with Semaphore(r, "jobs", limit=1, lease=3, bound=True) as permit:
            assert live(r, "jobs") == 1
            # As if the holder's process died: its connection closes, and the server gives the
            # permit back at once, long before the lease ends.
            r.client_kill_filter(_type="normal", skip_me=True)
            wait_until("the server gives the permit back", lambda: live(r, "jobs") == 0, 2)
            # The refresher (every second) learns it on a new connection.
            wait_until("the permit is reported lost", lambda: permit.lost, 5)


def test_a_bound_permit_is_given_back_when_its_process_dies(r, server):
    if SCRIPTS:
        sem = Semaphore(r, "jobs", limit=1, lease=30, bound=True, wait=5)
        assert_module_required(r, "BOUND", lambda: sem.__enter__())
        return
    script = (
        "import time, redis, redsem\n"
        f"r = redis.Redis(port={server.port})\n"
        "with redsem.Semaphore(r, 'jobs', limit=1, lease=30, bound=True) as permit:\n"
        "    print(permit.id, flush=True)\n"
        "    time.sleep(60)\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    try:
        holder_id = holder.stdout.readline().strip()
        assert r.zrange("jobs", 0, -1) == [holder_id]
        holder.kill()
        with Semaphore(r, "jobs", limit=1, lease=30, wait=5) as permit:
            assert r.zrange("jobs", 0, -1) == [permit.id.encode()]
    finally:
        holder.kill()
        holder.wait()


def test_durable_replicas():
    primary = Server("--repl-diskless-sync-delay", "0")
    replica = Server("--replicaof", "127.0.0.1", str(primary.port))
    try:
        r = redis.Redis(port=primary.port)
        replica_r = redis.Redis(port=replica.port)
        wait_until(
            "the replica is in sync",
            lambda: replica_r.info("replication")["master_link_status"] == "up",
            20,
        )
        with Semaphore(r, "jobs", limit=1, lease=30, durable_replicas=1) as permit:
            # WAIT answered: the replica has the grant.
            assert replica_r.zrange("jobs", 0, -1) == [permit.id.encode()]
        started = time.monotonic()
        sem = Semaphore(r, "jobs", limit=1, lease=30, durable_replicas=2, durable_timeout_ms=200)
        with pytest.raises(NotDurable) as refused:
            sem.acquire()
        assert (refused.value.acked, refused.value.wanted) == (1, 2)
        assert time.monotonic() - started >= 0.15
        assert live(r, "jobs") == 0  # the permit that was not durable was given back
        r.close()
        replica_r.close()
    finally:
        replica.stop()
        primary.stop()


def test_async_grant_limit_wait_and_release(server):
    rs = redis.Redis(port=server.port)

    async def main():
        r = redis.asyncio.Redis(port=server.port)
        await r.flushall()
        f = floor(rs)
        sem = AsyncSemaphore(r, "jobs", limit=2, lease=30, fair=True)
        async with sem as first, sem as second:
            assert_tickets([first.ticket, second.ticket], f)
            assert live(rs, "jobs") == 2
            started = time.monotonic()
            with pytest.raises(NotAcquired):
                async with AsyncSemaphore(r, "jobs", limit=2, lease=30, fair=True, wait=0.3):
                    pass
            assert time.monotonic() - started >= 0.25

            async def leave_soon():
                await asyncio.sleep(0.2)
                assert await first.release() is True

            leaving = asyncio.ensure_future(leave_soon())
            async with AsyncSemaphore(r, "jobs", limit=2, lease=30, fair=True, wait=10) as third:
                assert_tickets([first.ticket, second.ticket, third.ticket], f)
            await leaving
        assert live(rs, "jobs") == 0
        await r.aclose()

    asyncio.run(main())
    rs.close()


def test_async_refresh_keeps_the_lease_and_reports_a_loss(server):
    async def main():
        r = redis.asyncio.Redis(port=server.port)
        await r.flushall()
        async with AsyncSemaphore(r, "jobs", limit=1, lease=0.6) as permit:
            await asyncio.sleep(2.0)
            assert not permit.lost
            assert await r.zrange("jobs", 0, -1) == [permit.id.encode()]
        with pytest.raises(PermitLost):
            async with AsyncSemaphore(r, "jobs", limit=1, lease=0.6) as permit:
                await r.delete("jobs")
                deadline = time.monotonic() + 5
                while not permit.lost:
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.01)
        assert live(rs, "jobs") == 0
        await r.aclose()

    rs = redis.Redis(port=server.port)
    asyncio.run(main())
    rs.close()


def test_async_bound_and_count(server):
    rs = redis.Redis(port=server.port)

    async def main():
        r = redis.asyncio.Redis(port=server.port)
        await r.flushall()
        bound = AsyncSemaphore(r, "gpus", limit=4, lease=30, count=3, bound=True)
        if SCRIPTS:  # BOUND needs the module; the rest is tested unbound
            await assert_module_required_async(rs, "BOUND", bound.acquire)
            bound = AsyncSemaphore(r, "gpus", limit=4, lease=30, count=3)
        async with bound as permit:
            assert live(rs, "gpus") == 3
            assert await permit.release_some(1) is True
            assert live(rs, "gpus") == 2
        assert live(rs, "gpus") == 0
        await r.aclose()

    asyncio.run(main())
    rs.close()


def test_wait_without_limit(r):
    holder = Semaphore(r, "jobs", limit=1, lease=30).acquire()
    threading.Timer(0.3, holder.release).start()
    with Semaphore(r, "jobs", limit=1, lease=30, wait=math.inf) as permit:
        assert r.zrange("jobs", 0, -1) == [permit.id.encode()]


def test_bad_options_are_refused_before_any_command(r):
    with pytest.raises(ValueError):
        Semaphore(r, "jobs", limit=0)
    with pytest.raises(ValueError):
        Semaphore(r, "jobs", limit=1, lease=0)
    assert not r.exists("jobs")


BAD_NUMBERS = [math.inf, -math.inf, math.nan, "10", True, False, None, b"3"]


@pytest.mark.parametrize("bad", BAD_NUMBERS, ids=repr)
def test_non_finite_non_numeric_or_boolean_numbers_are_refused_by_name(r, bad):
    """Each is a ValueError naming the parameter, raised before anything is sent (wait and
    a wait for empty take math.inf: no limit; wait takes None: no wait)."""
    def ours():
        return {k: v for k, v in sent_calls(r).items() if k.startswith(SEMAPHORE_COMMANDS + ("command",))}

    before = ours()
    cases = [
        ("limit", lambda: Semaphore(r, "jobs", limit=bad)),
        ("lease", lambda: Semaphore(r, "jobs", limit=1, lease=bad)),
        ("count", lambda: Semaphore(r, "jobs", limit=3, count=bad)),
        ("durable_replicas", lambda: Semaphore(r, "jobs", limit=1, durable_replicas=bad)),
        ("the limit of 'gpu'", lambda: SemaphoreSet(r, [("gpu", bad)])),
        ("the count of 'gpu'", lambda: SemaphoreSet(r, [("gpu", 2, bad)])),
        ("lease", lambda: SemaphoreSet(r, [("gpu", 2)], lease=bad)),
    ]
    if bad is not math.inf and bad is not None:
        cases += [
            ("wait", lambda: Semaphore(r, "jobs", limit=1, wait=bad)),
            ("wait", lambda: SemaphoreSet(r, [("gpu", 2)], wait=bad)),
            ("timeout", lambda: wait_empty(r, "jobs", bad)),
        ]
    if bad is None:
        cases = [case for case in cases if case[0] not in ("count",)]
    for what, call in cases:
        with pytest.raises(ValueError) as refused:
            call()
        assert str(refused.value).startswith(what), (what, str(refused.value))
    assert ours() == before, "nothing was sent"
    assert not r.exists("jobs") and not r.exists("gpu")


def test_a_set_is_granted_whole_and_given_back_whole(r):
    if SCRIPTS:
        call = lambda: acquire_all(r, [("gpu", 2), ("licence", 5, 3)], lease=30)  # noqa: E731
        assert_module_required(r, "SEM.ACQUIREALL", call)
        assert not r.exists("gpu") and not r.exists("licence")
        return
    with acquire_all(r, [("gpu", 2), ("licence", 5, 3)], lease=30) as permits:
        assert permits.names == ("gpu", "licence") and permits.counts == (1, 3)
        assert permits.tickets is None and not permits.lost
        assert (live(r, "gpu"), live(r, "licence")) == (1, 3)
        assert r.zrange("gpu", 0, -1) == [permits.id.encode()]
        permits.check()
    assert (live(r, "gpu"), live(r, "licence")) == (0, 0)
    assert permits.release() is True  # the same answer again, nothing sent


def test_one_full_semaphore_refuses_the_set_and_nothing_is_held(r):
    with Semaphore(r, "licence", limit=1, lease=30):
        started = time.monotonic()
        if SCRIPTS:
            call = lambda: acquire_all(r, [("gpu", 2), ("licence", 1)], lease=30)  # noqa: E731
            assert_module_required(r, "SEM.ACQUIREALL", call)
        else:
            with pytest.raises(NotAcquired, match="licence"):
                acquire_all(r, [("gpu", 2), ("licence", 1)], lease=30)
        assert time.monotonic() - started < 1
        assert live(r, "gpu") == 0 and not r.exists("gpu")
        assert live(r, "licence") == 1
    with pytest.raises(ValueError):
        acquire_all(r, [("gpu", 2), ("gpu", 2)])
    with pytest.raises(ValueError):
        acquire_all(r, [("gpu", 2, 3)])


def test_a_fair_set_carries_one_ticket_per_semaphore(r):
    f = floor(r)
    with Semaphore(r, "licence", limit=5, lease=30, fair=True) as single:
        assert_tickets([single.ticket], f)
        sem = SemaphoreSet(r, [("gpu", 1), ("licence", 5)], lease=30, fair=True)
        if SCRIPTS:
            assert_module_required(r, "SEM.ACQUIREALL", lambda: sem.__enter__())
            return
        with sem as permits:
            # gpu is fresh (the clock of this grant), licence goes on from its counter, and
            # above gpu's ticket, handed out before it in the same step.
            assert permits.tickets is not None
            gpu = permits.tickets[0]
            assert_tickets([gpu], f)
            licence = max(single.ticket + 1, gpu + 1)
            assert permits.tickets == (gpu, licence)
            assert r.zscore("licence:owner", permits.id) == licence
        with sem as permits:
            # Each above every ticket handed out before, in the order named.
            assert permits.tickets == (licence + 1, licence + 2)


def test_a_waiting_set_is_granted_when_a_member_is_freed(r):
    holder = Semaphore(r, "licence", limit=1, lease=30).acquire()
    if SCRIPTS:
        call = lambda: acquire_all(r, [("gpu", 1), ("licence", 1)], wait=10)  # noqa: E731
        assert_module_required(r, "SEM.ACQUIREALL", call)
        assert holder.release() is True
        return
    with pytest.raises(NotAcquired):
        acquire_all(r, [("gpu", 1), ("licence", 1)], wait=0.2)
    assert live(r, "gpu") == 0
    threading.Timer(0.3, holder.release).start()
    started = time.monotonic()
    with acquire_all(r, [("gpu", 1), ("licence", 1)], lease=30, wait=10) as permits:
        assert 0.2 <= time.monotonic() - started < 5
        assert r.zrange("licence", 0, -1) == [permits.id.encode()]
        assert r.zrange("gpu", 0, -1) == [permits.id.encode()]
    assert (live(r, "gpu"), live(r, "licence")) == (0, 0)


def test_refresh_keeps_a_set_alive(r):
    if SCRIPTS:
        call = lambda: acquire_all(r, [("gpu", 1), ("licence", 2)], lease=0.6)  # noqa: E731
        assert_module_required(r, "SEM.ACQUIREALL", call)
        return
    with acquire_all(r, [("gpu", 1), ("licence", 2)], lease=0.6) as permits:
        time.sleep(2.0)  # more than three leases
        assert not permits.lost
        for name in permits.names:
            assert r.zrange(name, 0, -1) == [permits.id.encode()]


def test_a_set_is_lost_when_one_member_is_removed(r):
    if SCRIPTS:
        sem = SemaphoreSet(r, [("gpu", 1), ("licence", 2)], lease=0.6)
        assert_module_required(r, "SEM.ACQUIREALL", sem.acquire)
        return
    with pytest.raises(PermitLost, match="SEM.REFRESHALL answered 1 of 2"):
        with acquire_all(r, [("gpu", 1), ("licence", 2)], lease=0.6) as permits:
            r.delete("licence")
            wait_until("the refresher reports the loss", lambda: permits.lost)
            with pytest.raises(PermitLost):
                permits.check()
    assert (live(r, "gpu"), live(r, "licence")) == (0, 0)


def test_a_bound_set_is_given_back_when_its_connection_closes(r):
    if SCRIPTS:
        call = lambda: acquire_all(r, [("gpu", 1), ("licence", 2)], bound=True)  # noqa: E731
        assert_module_required(r, "SEM.ACQUIREALL", call)
        return
    with pytest.raises(PermitLost):
        with acquire_all(r, [("gpu", 1), ("licence", 2)], lease=3, bound=True) as permits:
            assert (live(r, "gpu"), live(r, "licence")) == (1, 1)
            r.client_kill_filter(_type="normal", skip_me=True)
            wait_until("the server gives the set back", lambda: live(r, "licence") == 0, 2)
            wait_until("the set is reported lost", lambda: permits.lost, 5)


def test_wait_empty(r):
    if SCRIPTS:
        with Semaphore(r, "jobs", limit=3, lease=30):
            assert_module_required(r, "SEM.WAITEMPTY", lambda: wait_empty(r, "jobs", 10))
            assert_module_required(r, "SEM.WAITEMPTY", lambda: wait_empty(r, "jobs", 0))
        assert_module_required(r, "SEM.WAITEMPTY", lambda: wait_empty(r, "jobs", math.inf))
        with pytest.raises(ValueError):  # bad arguments first, as with the module
            wait_empty(r, "jobs", -1)
        return
    assert wait_empty(r, "jobs", 10) is True  # no holder: at once
    holder = Semaphore(r, "jobs", limit=3, lease=30).acquire()
    started = time.monotonic()
    assert wait_empty(r, "jobs", 0.3) is False
    assert 0.25 <= time.monotonic() - started < 5
    assert wait_empty(r, "jobs", 0) is False  # looks once
    threading.Timer(0.3, holder.release).start()
    started = time.monotonic()
    assert wait_empty(r, "jobs", math.inf) is True
    assert 0.2 <= time.monotonic() - started < 5
    assert live(r, "jobs") == 0


def test_async_sets_and_wait_empty(server):
    async def without_the_module():
        r = redis.asyncio.Redis(port=server.port)
        rs = redis.Redis(port=server.port)
        await r.flushall()
        spec = [("gpu", 1), ("licence", 5, 2)]
        acquire = AsyncSemaphoreSet(r, spec).acquire
        await assert_module_required_async(rs, "SEM.ACQUIREALL", acquire)
        call = lambda: acquire_all_async(r, spec, fair=True, wait=10)  # noqa: E731
        await assert_module_required_async(rs, "SEM.ACQUIREALL", call)
        call = lambda: wait_empty_async(r, "gpu", 10)  # noqa: E731
        await assert_module_required_async(rs, "SEM.WAITEMPTY", call)
        assert await r.dbsize() == 0
        rs.close()
        await r.aclose()

    if SCRIPTS:
        asyncio.run(without_the_module())
        return

    async def main():
        r = redis.asyncio.Redis(port=server.port)
        await r.flushall()
        seconds, micros = await r.time()
        f = (seconds * 1000 + micros // 1000) * 1000
        spec = [("gpu", 1), ("licence", 5, 2)]
        async with AsyncSemaphoreSet(r, spec, lease=0.6, fair=True) as permits:
            # Two fresh names granted in one step: the clock of that step, then one up.
            assert permits.tickets is not None
            assert permits.tickets[1] == permits.tickets[0] + 1
            assert_tickets(permits.tickets[:1], f)
            f = permits.tickets[0]
            with pytest.raises(NotAcquired):
                await acquire_all_async(r, spec, fair=True)
            assert await r.execute_command("SEM.GET", "licence") == 2
            assert await wait_empty_async(r, "gpu", 0.2) is False
            await asyncio.sleep(1.0)  # refreshed
            assert not permits.lost

        assert await r.execute_command("SEM.GET", "licence") == 0
        holder = await acquire_all_async(r, spec, lease=30, fair=True)

        async def leave_soon():
            await asyncio.sleep(0.3)
            assert await holder.release() is True

        leaving = asyncio.ensure_future(leave_soon())
        waiting = asyncio.ensure_future(acquire_all_async(r, spec, lease=30, fair=True, wait=10))
        assert await wait_empty_async(r, "gpu", 10) is True
        async with await waiting as permits:
            assert permits.tickets == (f + 4, f + 5)
        await leaving
        with pytest.raises(PermitLost):
            async with AsyncSemaphoreSet(r, spec, lease=0.6) as permits:
                await r.delete("gpu")
                deadline = time.monotonic() + 5
                while not permits.lost:
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.01)
        await r.aclose()

    asyncio.run(main())


def test_an_operators_limit_is_stored_used_by_acquires_and_cleared(r):
    assert stored_limit(r, "jobs") is None
    assert clear_limit(r, "jobs") is False
    jobs = Semaphore(r, "jobs", limit=10, lease=30)
    set_limit(r, "jobs", 0)  # pauses
    assert stored_limit(r, "jobs") == 0
    with pytest.raises(NotAcquired):
        jobs.acquire()
    assert live(r, "jobs") == 0
    set_limit(r, "jobs", 2)
    assert stored_limit(r, "jobs") == 2
    first, second = jobs.acquire(), jobs.acquire()
    with pytest.raises(NotAcquired):  # the stored 2, not the caller's 10
        jobs.acquire()
    set_limit(r, "jobs", 4294967295)
    assert stored_limit(r, "jobs") == 4294967295
    assert clear_limit(r, "jobs") is True
    assert stored_limit(r, "jobs") is None
    assert clear_limit(r, "jobs") is False
    with jobs as third:  # the caller's own limit again
        assert live(r, "jobs") == 3
    assert third.lost is False
    assert first.release() and second.release()
    for bad in (-1, 4294967296, 1.5, True, "3"):
        with pytest.raises(ValueError):
            set_limit(r, "jobs", bad)
    with pytest.raises(ValueError):
        stored_limit(r, "")
    assert not r.exists("jobs:limit")


def test_async_operators_limit(server):
    async def main():
        r = redis.asyncio.Redis(port=server.port)
        await r.flushall()
        assert await stored_limit_async(r, "jobs") is None
        await set_limit_async(r, "jobs", 0)
        assert await stored_limit_async(r, "jobs") == 0
        with pytest.raises(NotAcquired):
            await AsyncSemaphore(r, "jobs", limit=5).acquire()
        await set_limit_async(r, "jobs", 1)
        async with AsyncSemaphore(r, "jobs", limit=5) as permit:
            assert permit.count == 1
            with pytest.raises(NotAcquired):
                await AsyncSemaphore(r, "jobs", limit=5).acquire()
        with pytest.raises(ValueError):
            await set_limit_async(r, "jobs", -1)
        assert await clear_limit_async(r, "jobs") is True
        assert await stored_limit_async(r, "jobs") is None
        assert await clear_limit_async(r, "jobs") is False
        await r.aclose()

    asyncio.run(main())


# Without the module: the script, its wake-ups, and the move to the module.


def test_the_package_ships_the_one_script():
    """The installed redsem.lua is the repository's clients/scripts/redsem.lua, byte for byte."""
    assert script_source() == (ROOT / "clients/scripts/redsem.lua").read_bytes()


@pytest.mark.parametrize("kind", ["server", "plain_server"])
def test_the_backend_is_asked_once_per_pool(kind, request):
    where = request.getfixturevalue(kind)
    admin = redis.Redis(port=where.port)
    admin.flushall()
    module = has_module(admin)
    admin.config_resetstat()
    r = redis.Redis(port=where.port)
    for _ in range(3):
        with Semaphore(r, "jobs", limit=2, lease=30) as permit:
            assert permit.refresh()
    with Semaphore(r, "printers", limit=1, lease=30, fair=True, wait=1) as permit:
        assert permit.ticket is not None
    set_limit(r, "jobs", 3)
    assert stored_limit(r, "jobs") == 3
    assert clear_limit(r, "jobs") is True

    async def with_asyncio():
        ar = redis.asyncio.Redis(port=where.port)
        async with AsyncSemaphore(ar, "jobs", limit=2, lease=30):
            assert await stored_limit_async(ar, "jobs") is None
        await ar.aclose()

    asyncio.run(with_asyncio())
    calls = sent_calls(admin)
    # One for each pool: r's, and ar's (the script asks it too, inside the server).
    assert calls.get("command|info") - script_runs(admin) == 2, calls
    if module:  # nothing else changes on the wire
        assert not any(cmd.startswith("eval") or cmd == "blpop" for cmd in calls), calls
        assert calls["sem.acquire"] == 4 and calls["sem.acquirefair"] == 1, calls
    else:
        assert not any(cmd.startswith("sem.") for cmd in calls), calls
        assert calls.get("evalsha", 0) + calls.get("eval", 0) >= 14, calls
    r.close()
    admin.close()


def test_without_the_module_the_script_is_loaded_when_missing(plain):
    source = script_source()
    sha = hashlib.sha1(source).hexdigest()
    with Semaphore(plain, "jobs", limit=1, lease=30):
        assert plain.script_exists(sha) == [True]
    plain.script_flush()
    with Semaphore(plain, "jobs", limit=1, lease=30) as permit:  # EVALSHA, NOSCRIPT, EVAL
        assert plain.zrange("jobs", 0, -1) == [permit.id.encode()]
        plain.script_flush()
        assert permit.refresh() is True
    assert live(plain, "jobs") == 0


@pytest.mark.parametrize("fair", [False, True])
def test_without_the_module_a_release_serves_a_waiter_at_once(plain, fair):
    holder = Semaphore(plain, "jobs", limit=1, lease=30, fair=fair).acquire()
    granted = []

    def wait_for_it():
        with Semaphore(plain, "jobs", limit=1, lease=30, fair=fair, wait=10) as permit:
            granted.append((time.monotonic(), permit.ticket))

    waiter = threading.Thread(target=wait_for_it)
    waiter.start()
    time.sleep(0.3)  # in line, blocked in BLPOP on its own jobs:wake:<id>
    assert granted == []
    released = time.monotonic()
    assert holder.release() is True
    waiter.join()
    # Granted by the release itself, and told on its list: well before its next attempt.
    assert granted[0][0] - released < 0.3, granted[0][0] - released
    if fair:
        assert granted[0][1] > holder.ticket
    assert live(plain, "jobs") == 0
    # The waiter's own list and the line are gone with the grant.
    assert plain.keys("jobs:wake*") == [] and plain.keys("jobs:line") == []


def test_without_the_module_an_async_release_serves_a_waiter_at_once(plain_server):
    async def main():
        r = redis.asyncio.Redis(port=plain_server.port)
        await r.flushall()
        holder = await AsyncSemaphore(r, "jobs", limit=1, lease=30).acquire()
        released = []

        async def leave_soon():
            await asyncio.sleep(0.3)
            released.append(time.monotonic())
            assert await holder.release() is True

        leaving = asyncio.ensure_future(leave_soon())
        async with AsyncSemaphore(r, "jobs", limit=1, lease=30, wait=10):
            assert time.monotonic() - released[0] < 0.3
        await leaving
        await r.aclose()

    asyncio.run(main())


def test_without_the_module_a_lease_that_runs_out_serves_a_waiter(plain):
    holder = Semaphore(plain, "jobs", limit=1, lease=0.5, auto_refresh=False).acquire()
    started = time.monotonic()
    with Semaphore(plain, "jobs", limit=1, lease=30, wait=5) as permit:
        # The refused attempt said when the holder's lease ends: the waiter tried again then.
        waited = time.monotonic() - started
        assert 0.3 <= waited < 1.5, waited
        assert plain.zrange("jobs", 0, -1) == [permit.id.encode()]
    assert holder.release() is False and holder.lost

    # A holder removed by hand serves nobody: the waiter's next attempt (at most 2.5 s after its
    # last) finds the room.
    holder = Semaphore(plain, "jobs", limit=1, lease=30).acquire()
    granted = []

    def wait_for_it():
        with Semaphore(plain, "jobs", limit=1, lease=30, wait=5):
            granted.append(time.monotonic())

    waiter = threading.Thread(target=wait_for_it)
    waiter.start()
    time.sleep(0.2)
    removed = time.monotonic()
    assert plain.zrem("jobs", holder.id) == 1
    waiter.join()
    assert granted and granted[0] - removed < 3, granted[0] - removed
    assert holder.release() is False


def test_without_the_module_bad_arguments_are_the_modules_errors(plain):
    with pytest.raises(redis.ResponseError, match="fair holders"):
        with Semaphore(plain, "printers", limit=2, lease=30, fair=True):
            Semaphore(plain, "printers", limit=2, lease=30).acquire()
    with pytest.raises(redis.ResponseError):  # COUNT above the limit
        Semaphore(plain, "gpus", limit=2, lease=30, count=3).acquire()
    assert live(plain, "printers") == 0 and live(plain, "gpus") == 0


@pytest.mark.parametrize("kind", ["server", "plain_server"])
@pytest.mark.parametrize("options", [{"decode_responses": True}, {"protocol": 3}])
def test_clients_that_decode_or_speak_resp3(kind, options, request):
    where = request.getfixturevalue(kind)
    r = redis.Redis(port=where.port, **options)
    r.flushall()
    plain = redis.Redis(port=where.port)
    f, scripts = floor(plain), not has_module(plain)
    with Semaphore(r, "printers", limit=2, lease=30, fair=True, count=2) as permit:
        assert isinstance(permit.ticket, int)
        assert_tickets([permit.ticket], f, scripts)
        assert permit.refresh() is True
        assert permit.release_some(1) is True and permit.count == 1
        with Semaphore(r, "printers", limit=2, lease=30, fair=True, wait=0.2) as other:
            assert_tickets([permit.ticket, other.ticket], f, scripts)
    set_limit(r, "printers", 1)
    assert stored_limit(r, "printers") == 1
    assert clear_limit(r, "printers") is True
    assert live(plain, "printers") == 0
    plain.close()
    r.close()


def test_the_same_code_goes_on_after_module_load(tmp_path):
    """A semaphore used through the script, then the module loaded into the live server: the
    holders keep their permits, leases and tickets; clients made since use the module, and
    clients made before go on through the script, on the very same keys, until the script
    answers an acquire that the module is loaded: from then on they use it too."""
    s = Server(module=False)
    try:
        before = redis.Redis(port=s.port)
        jobs = Semaphore(before, "jobs", limit=2, lease=0.9)  # refreshed every 0.3 s
        kept = jobs.acquire()
        printers = Semaphore(before, "printers", limit=2, lease=30, fair=True)
        first = printers.acquire()
        gpus = Semaphore(before, "gpus", limit=4, lease=30, count=3).acquire()
        set_limit(before, "reports", 1)

        before.execute_command("MODULE", "LOAD", MODULE)
        after = redis.Redis(port=s.port)
        assert has_module(after)
        assert after.execute_command("SEM.GET", "jobs") == 1
        assert after.execute_command("SEM.GET", "gpus") == 3
        second = Semaphore(after, "printers", limit=2, lease=30, fair=True).acquire()
        assert second.ticket > first.ticket
        assert first.refresh() is True and first.release() is True
        third = printers.acquire()  # through the script, which answers as the module
        assert third.ticket > second.ticket
        assert after.zscore("printers:owner", third.id) == third.ticket
        assert gpus.release_some(1) is True
        assert after.execute_command("SEM.GET", "gpus") == 2
        assert stored_limit(after, "reports") == 1
        with Semaphore(after, "reports", limit=5):
            with pytest.raises(NotAcquired):
                Semaphore(before, "reports", limit=5).acquire()

        # The module's waiter is served when the script's client releases ...
        other = Semaphore(after, "jobs", limit=2, lease=30).acquire()
        granted = []

        def wait_for_it(client, ids):
            with Semaphore(client, "jobs", limit=2, lease=30, wait=5) as permit:
                granted.append(time.monotonic())
                ids.append(permit.id)

        ids = []
        waiter = threading.Thread(target=wait_for_it, args=(after, ids))
        waiter.start()
        time.sleep(0.3)
        assert not kept.lost  # refreshed through the script all along
        released = time.monotonic()
        assert kept.release() is True
        waiter.join()
        assert granted[0] - released < 1, granted[0] - released
        # ... and the waiter of the client made before, on the module since its last acquire.
        holder = Semaphore(after, "jobs", limit=2, lease=30).acquire()
        waiter = threading.Thread(target=wait_for_it, args=(before, ids))
        waiter.start()
        time.sleep(0.2)
        released = time.monotonic()
        assert holder.release() is True
        waiter.join()
        assert granted[1] - released < 1.5, granted[1] - released
        assert other.release() is True

        # BOUND works for the clients made since, and for the ones made before (the script's
        # acquire said the module is loaded).
        with Semaphore(after, "jobs", limit=2, lease=30, bound=True):
            pass
        with Semaphore(before, "jobs", limit=2, lease=30, bound=True):
            pass
        for permit in (second, third, gpus):
            assert permit.release() is True
        for name in ("jobs", "printers", "gpus", "reports"):
            assert after.execute_command("SEM.GET", name) == 0
        before.close()
        after.close()
    finally:
        s.stop()


# The line: first come, first served, leases that end on time, a full memory, the module picked
# up live, the connections a wait reuses, a waiter that dies.


def waiting(r, name) -> int:
    """Waiters in the semaphore's line: the module's count, or the script's line."""
    if has_module(r):
        return json.loads(r.execute_command("SEM.GET", name, "JSON"))["waiters"]
    return r.zcard(f"{name}:line")


@pytest.mark.parametrize("fair", [False, True], ids=["plain", "fair"])
def test_waiters_are_granted_first_come_first_served(r, fair):
    """A limit-1 semaphore held; 6 waiters arrive 30 ms apart, each giving its permit back at
    once: they are granted in the order they arrived, exactly."""
    holder = Semaphore(r, "fcfs", limit=1, lease=30, fair=fair).acquire()
    order, errors = [], []

    def wait_for_it(i):
        try:
            with Semaphore(r, "fcfs", limit=1, lease=30, fair=fair, wait=20):
                order.append(i)
        except Exception as err:  # reported below
            errors.append(err)

    threads = []
    for i in range(6):
        thread = threading.Thread(target=wait_for_it, args=(i,))
        thread.start()
        threads.append(thread)
        wait_until(f"waiter {i} is in line", lambda: waiting(r, "fcfs") == i + 1)
        time.sleep(0.03)
    assert holder.release() is True
    for thread in threads:
        thread.join(20)
    assert errors == []
    assert order == list(range(6))
    assert live(r, "fcfs") == 0 and waiting(r, "fcfs") == 0


def test_a_waiter_told_when_a_lease_ends_ticks_then_without_another_try(plain):
    """Without the module: a waiter that becomes first in line while a holder's lease ends
    within 2.5 s is told when ("H<ms>"), and sends TICK then rather than trying again first."""
    port = plain.connection_pool.connection_kwargs["port"]
    monitor = socket.create_connection(("127.0.0.1", port))
    monitor.sendall(b"MONITOR\r\n")
    holder = Semaphore(plain, "told", limit=1, lease=30).acquire()
    granted = []

    def wait_for(identifier, lease):
        permit = Semaphore(
            plain, "told", limit=1, lease=lease, wait=5, identifier=identifier, auto_refresh=False
        ).acquire()
        granted.append((identifier, time.monotonic(), permit))

    first = threading.Thread(target=wait_for, args=("w1", 0.6))
    first.start()
    wait_until("w1 is in line", lambda: waiting(plain, "told") == 1)
    second = threading.Thread(target=wait_for, args=("w2", 30))
    second.start()
    wait_until("w2 is in line", lambda: waiting(plain, "told") == 2)
    assert holder.release() is True  # w1 holds for 0.6 s; w2 is told when that ends
    first.join(5)
    second.join(5)
    assert [g[0] for g in granted] == ["w1", "w2"], granted
    assert 0.5 < granted[1][1] - granted[0][1] < 0.8, granted
    monitor.settimeout(0.2)
    seen = b""
    try:
        while True:
            chunk = monitor.recv(65536)
            if not chunk:
                break
            seen += chunk
    except socket.timeout:
        pass
    monitor.close()
    tries = [line for line in seen.split(b"\r\n") if b'"ACQUIRE"' in line and b'"w2"' in line]
    ticks = [line for line in seen.split(b"\r\n") if b'"TICK"' in line]
    assert len(tries) == 1, tries  # the try that took its place, and no other
    assert len(ticks) == 1, ticks
    for _, _, permit in granted:
        permit.release()


def test_a_lease_end_and_a_release_serve_the_first_waiter_on_time(r):
    """At hz 1 (the server's timers run once a second): a holder whose 0.3 s lease ends without
    a release is followed by the waiter within 150 ms of the lease's end, by the server's clock;
    a release serves a waiter within 50 ms of the release's reply."""
    hz = r.config_get("hz")["hz"]
    r.config_set("hz", 1)
    try:
        late = []
        for _ in range(3):
            r.delete("ends")
            holder = Semaphore(r, "ends", limit=1, lease=0.3, auto_refresh=False).acquire()
            ends = r.zscore("ends", holder.id)
            with Semaphore(r, "ends", limit=1, lease=30, wait=5) as permit:
                granted = r.zscore("ends", permit.id) - 30_000  # the lease began at the grant
            late.append(granted - ends)
            assert holder.release() is False
        print(f"grant after a lease's end, ms late: {late}")
        assert all(0 <= ms < 150 for ms in late), late

        lateness = []
        for _ in range(3):
            holder = Semaphore(r, "ends", limit=1, lease=30).acquire()
            granted = []

            def wait_for_it():
                with Semaphore(r, "ends", limit=1, lease=30, wait=5):
                    granted.append(time.monotonic())

            waiter = threading.Thread(target=wait_for_it)
            waiter.start()
            wait_until("the waiter is in line", lambda: waiting(r, "ends") == 1)
            time.sleep(0.05)
            assert holder.release() is True
            released = time.monotonic()
            waiter.join(5)
            lateness.append(round((granted[0] - released) * 1000, 1))
        print(f"grant after a release's reply, ms: {lateness}")
        assert all(ms < 50 for ms in lateness), lateness
    finally:
        r.config_set("hz", hz)


def test_when_memory_is_full_refresh_and_release_work_and_acquire_is_refused(r):
    """maxmemory reached (noeviction): a refresh and a release go on, a new acquire (waiting or
    not) raises the server's OOM error and changes nothing."""
    holder = Semaphore(r, "full", limit=3, lease=30, auto_refresh=False).acquire()
    fair = Semaphore(r, "fullfair", limit=3, lease=30, fair=True, auto_refresh=False).acquire()
    config = r.config_get("maxmemory*")

    def contents():
        return {key: (r.type(key), r.dump(key)) for key in sorted(r.keys())}

    try:
        r.config_set("maxmemory-policy", "noeviction")
        r.config_set("maxmemory", 1)
        assert holder.refresh() is True and fair.refresh() is True
        before = contents()
        for options in ({}, {"wait": 0.5}, {"fair": True}):
            name = "fullfair" if options.get("fair") else "full"
            # The server's "OOM command not allowed when used memory > 'maxmemory'.", which
            # redis-py raises as an OutOfMemoryError without its code.
            match = "command not allowed when used memory"
            with pytest.raises(redis.exceptions.OutOfMemoryError, match=match):
                Semaphore(r, name, limit=3, lease=30, **options).acquire()
        assert contents() == before
        assert holder.release() is True and fair.release() is True
    finally:
        r.config_set("maxmemory", config["maxmemory"])
        r.config_set("maxmemory-policy", config["maxmemory-policy"])
    assert live(r, "full") == 0 and live(r, "fullfair") == 0


@pytest.mark.skipif(not SCRIPTS, reason="the module loaded into a server without it")
def test_the_module_loaded_live_is_picked_up():
    """A client (A) on the script, with a holder and a waiter; the module loaded. A client made
    since (B) waits with the module, and A's release, through the script, serves it at once;
    A's waiter is told to use the module, and waits on there; A is on the module."""
    s = Server(module=False)
    try:
        a = redis.Redis(port=s.port)
        admin = redis.Redis(port=s.port)
        holder = Semaphore(a, "live", limit=1, lease=30).acquire()
        granted = {}

        def wait_for_it(client, who):
            with Semaphore(client, "live", limit=1, lease=30, wait=20) as permit:
                granted[who] = time.monotonic()
                time.sleep(0.2)
                assert permit.release() is True

        waiter_a = threading.Thread(target=wait_for_it, args=(a, "a"))
        waiter_a.start()
        wait_until("A's waiter is in the script's line", lambda: admin.zcard("live:line") == 1)
        admin.execute_command("MODULE", "LOAD", MODULE)
        b = redis.Redis(port=s.port)
        waiter_b = threading.Thread(target=wait_for_it, args=(b, "b"))
        waiter_b.start()
        wait_until("B waits with the module", lambda: waiting(admin, "live") == 1)
        assert redsem._known_backend(a) is False  # A still sends the script
        assert holder.release() is True
        released = time.monotonic()
        waiter_b.join(5)
        waiter_a.join(5)
        assert granted["b"] - released < 0.1, granted["b"] - released
        # A's waiter was told "M" by that release, and waited with the module behind B.
        assert 0.2 <= granted["a"] - granted["b"] < 0.4, granted["a"] - granted["b"]
        assert redsem._known_backend(a) is True
        with Semaphore(a, "live", limit=1, lease=30, bound=True):  # the module's alone
            pass
        assert not admin.exists("live:line")
        for client in (a, b, admin):
            client.close()
    finally:
        s.stop()


@pytest.mark.skipif(not SCRIPTS, reason="the module loaded into a server without it")
def test_a_no_module_answer_is_asked_again_after_its_time(monkeypatch):
    """A pool on the script asks COMMAND INFO again once its answer is older than
    _BACKEND_TTL (10 s; shortened here): a module loaded since is used from its next call."""
    monkeypatch.setattr(redsem._core, "_BACKEND_TTL", 0.3)
    s = Server(module=False)
    try:
        a = redis.Redis(port=s.port)
        assert stored_limit(a, "again") is None
        assert redsem._known_backend(a) is False
        a.execute_command("MODULE", "LOAD", MODULE)
        assert stored_limit(a, "again") is None  # within the time: still the script
        assert redsem._known_backend(a) is False
        time.sleep(0.35)
        a.config_resetstat()
        assert stored_limit(a, "again") is None
        calls = sent_calls(a)
        assert calls.get("sem.limit") == 1 and "evalsha" not in calls, calls
        assert redsem._known_backend(a) is True
        a.close()
    finally:
        s.stop()


def connections_received(r) -> int:
    return r.info("stats")["total_connections_received"]


def test_waits_reuse_the_pools_connections(r, server):
    """50 waits in a row, each blocked until a release: the server receives a few new
    connections, not one per wait (the holder's, the waiter's, one for the calls beside a
    blocked wait; the count is the server's, so another test's client reconnecting meanwhile
    may add one or two)."""
    client = redis.Redis(port=server.port)
    sem = Semaphore(client, "reuse", limit=1, lease=30, wait=5)
    before = connections_received(r)
    blocked = 0
    for _ in range(50):
        holder = sem.acquire()
        threading.Timer(0.02, holder.release).start()
        started = time.monotonic()
        with sem:
            blocked += time.monotonic() - started >= 0.015
    assert blocked == 50
    received = connections_received(r) - before
    assert received <= 5, received

    async def main():
        ar = redis.asyncio.Redis(port=server.port)
        asem = AsyncSemaphore(ar, "areuse", limit=1, lease=30, wait=5)
        start = connections_received(r)
        for _ in range(50):
            holder = await asem.acquire()

            async def leave_soon(holder=holder):
                await asyncio.sleep(0.02)
                await holder.release()

            leaving = asyncio.ensure_future(leave_soon())
            async with asem:
                pass
            await leaving
        await ar.aclose()
        return connections_received(r) - start

    received = asyncio.run(main())
    assert received <= 5, received
    client.close()


@pytest.mark.skipif(not SCRIPTS, reason="the script's line")
def test_a_waiter_that_dies_leaves_the_line(r):
    """A waiter that takes its place and never comes back (a raw ACQUIRE ... LINE, as a process
    that died) is dropped once its place runs out (6 s after its attempt): the waiter behind it
    is granted by its own next attempt (at most 2.5 s later)."""
    holder = Semaphore(r, "dead", limit=2, lease=30).acquire()
    keys = [f"dead{suffix}" for suffix in SUFFIXES]
    # Two permits wanted, one free: it waits at the head, and nobody behind it passes it.
    reply = r.eval(script_source(), 6, *keys, "ACQUIRE", 2, 30, "ID", "ghost", "COUNT", 2, "LINE")
    died = time.monotonic()
    assert reply[0] is None and reply[2] == 0
    with Semaphore(r, "dead", limit=2, lease=30, wait=15) as permit:
        waited = time.monotonic() - died
        assert r.zrange("dead", 0, -1, withscores=False).count(permit.id.encode()) == 1
    print(f"granted {waited:.2f} s after the dead waiter's attempt")
    assert 6 <= waited < 6 + 2.5 + 0.5, waited
    assert not r.exists("dead:line") and not r.exists("dead:wake:ghost")
    assert holder.release() is True


def test_a_cancelled_wait_leaves_the_line(server):
    """An asyncio wait cancelled in line leaves it at once (a grant made to it meanwhile would
    be given back)."""
    rs = redis.Redis(port=server.port)

    async def main():
        r = redis.asyncio.Redis(port=server.port)
        await r.flushall()
        holder = await AsyncSemaphore(r, "gone", limit=1, lease=30).acquire()
        waiter = AsyncSemaphore(r, "gone", limit=1, lease=30, wait=20)
        task = asyncio.ensure_future(waiter.acquire())
        while waiting(rs, "gone") != 1:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert waiting(rs, "gone") == 0
        assert await holder.release() is True
        assert live(rs, "gone") == 0
        await r.aclose()

    asyncio.run(main())
    rs.close()


@pytest.mark.skipif(not SCRIPTS, reason="an interrupt reaches Python between the script's BLPOPs")
def test_an_interrupted_wait_leaves_the_line(r):
    """A KeyboardInterrupt in a waiting thread (delivered when its BLPOP returns, within 2.5 s)
    leaves the line: the holder's release then finds nobody to grant."""
    import ctypes

    holder = Semaphore(r, "gone", limit=1, lease=30).acquire()
    caught = []

    def wait_for_it():
        try:
            Semaphore(r, "gone", limit=1, lease=30, wait=20).acquire()
        except KeyboardInterrupt:
            caught.append("interrupted")

    waiter = threading.Thread(target=wait_for_it)
    waiter.start()
    wait_until("the waiter is in line", lambda: waiting(r, "gone") == 1)
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(waiter.ident), ctypes.py_object(KeyboardInterrupt)
    )
    waiter.join(5)
    assert caught == ["interrupted"]
    assert waiting(r, "gone") == 0 and r.keys("gone:wake*") == []
    assert holder.release() is True
    assert live(r, "gone") == 0


# Waits cut by the server, acquires interrupted, releases without an answer, durable grants
# whose WAIT is cut.


def the_blocked_waiter(r) -> int:
    """The id of the one client blocked in a wait (SEM.ACQUIRE with the module, BLPOP without)."""
    command = "sem.acquire" if has_module(r) else "blpop"
    found = []

    def blocked():
        found[:] = [c["id"] for c in r.client_list() if "b" in c["flags"] and c["cmd"] == command]
        return found

    wait_until("the waiter blocks", blocked)
    assert len(found) == 1, found
    return int(found[0])


@pytest.mark.parametrize("kind", ["sync", "asyncio"])
def test_a_wait_cut_by_unblocked_waits_again(r, server, kind):
    """A waiter whose blocked command the server ends with UNBLOCKED (what a failover gives its
    waiters; here CLIENT UNBLOCK ... ERROR, twice) waits on: granted when the holder gives its
    permit back, never an error."""
    holder = Semaphore(r, "cut", limit=1, lease=30).acquire()
    got = []

    def wait_for_it():
        try:
            if kind == "sync":
                permit = Semaphore(r, "cut", limit=1, lease=30, wait=20).acquire()
                got.append(permit.id)
                got.append(permit.release())
                return

            async def main():
                ar = redis.asyncio.Redis(port=server.port)
                permit = await AsyncSemaphore(ar, "cut", limit=1, lease=30, wait=20).acquire()
                got.append(permit.id)
                got.append(await permit.release())
                await ar.aclose()

            asyncio.run(main())
        except Exception as err:
            got.append(err)

    waiter = threading.Thread(target=wait_for_it)
    waiter.start()
    for _ in range(2):
        assert r.execute_command("CLIENT UNBLOCK", the_blocked_waiter(r), "ERROR") == 1
        time.sleep(0.2)
        assert got == [], got
    wait_until("the waiter is in line", lambda: waiting(r, "cut") == 1)
    assert holder.release() is True
    waiter.join(10)
    assert len(got) == 2 and got[1] is True, got
    assert live(r, "cut") == 0


class Interrupted(Exception):
    """Raised in the main thread by a signal handler, as KeyboardInterrupt is."""


def test_a_cancelled_wait_gives_back_a_grant_that_came_after(server):
    """An asyncio wait granted by the server, then cancelled before its task read the grant (the
    holder's release sent by a blocking call from the event loop's own thread, so the task runs
    only after both): the grant nobody will see is given back, no permit is left without a
    holder."""
    rs = redis.Redis(port=server.port)
    rs.flushall()

    async def main():
        r = redis.asyncio.Redis(port=server.port)
        holder = await AsyncSemaphore(r, "late", limit=1, lease=30, auto_refresh=False).acquire()
        waiter = AsyncSemaphore(r, "late", limit=1, lease=30, wait=20)
        task = asyncio.ensure_future(waiter.acquire())
        while waiting(rs, "late") != 1:
            await asyncio.sleep(0.01)
        assert sem(rs, "RELEASE", "late", holder.id) == 1  # granted to the waiter
        assert live(rs, "late") == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await r.aclose()

    asyncio.run(main())
    assert live(rs, "late") == 0
    assert waiting(rs, "late") == 0
    rs.close()


@pytest.mark.skipif(SCRIPTS, reason="sets need the module")
def test_a_cancelled_set_wait_gives_back_a_grant_that_came_after(server):
    """As above, for a set: the whole set granted to a wait cancelled before it read the grant
    is given back."""
    rs = redis.Redis(port=server.port)
    rs.flushall()

    async def main():
        r = redis.asyncio.Redis(port=server.port)
        holder = await AsyncSemaphore(r, "b", limit=1, lease=30, auto_refresh=False).acquire()
        wanted = [("a", 1), ("b", 1)]
        task = asyncio.ensure_future(acquire_all_async(r, wanted, lease=30, wait=20))
        while waiting(rs, "b") != 1:
            await asyncio.sleep(0.01)
        assert sem(rs, "RELEASE", "b", holder.id) == 1  # the set granted to the waiter
        assert [live(rs, name) for name in ("a", "b")] == [1, 1]
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await r.aclose()

    asyncio.run(main())
    assert [live(rs, name) for name in ("a", "b")] == [0, 0]
    rs.close()


def test_an_interrupted_wait_gives_back_a_grant_that_came_after(r):
    """The same for the sync API: a signal's handler in the waiting thread (as SIGINT's raises
    KeyboardInterrupt) sends the holder's release, which grants the wait, then raises before the
    grant is read."""
    import signal

    holder = Semaphore(r, "late", limit=1, lease=30, auto_refresh=False).acquire()
    other = redis.Redis(port=r.connection_pool.connection_kwargs["port"])
    main = threading.get_ident()

    def interrupt(signum, frame):
        assert sem(other, "RELEASE", "late", holder.id) == 1  # granted to the waiter
        raise Interrupted()

    def signal_the_waiter():
        wait_until("the waiter waits", lambda: waiting(other, "late") == 1)
        the_blocked_waiter(other)
        signal.pthread_kill(main, signal.SIGUSR1)

    previous = signal.signal(signal.SIGUSR1, interrupt)
    helper = threading.Thread(target=signal_the_waiter)
    try:
        helper.start()
        with pytest.raises(Interrupted):
            Semaphore(r, "late", limit=1, lease=30, wait=20).acquire()
    finally:
        helper.join()
        signal.signal(signal.SIGUSR1, previous)
    assert live(r, "late") == 0
    assert waiting(r, "late") == 0
    other.close()


@pytest.mark.parametrize("kind", ["sync", "asyncio"])
def test_a_release_without_an_answer_can_be_sent_again(server, kind):
    """A release that gets no answer (the server paused past the client's socket_timeout: the
    client gives up and closes the connection, and the server never runs it) fails with a
    timeout and leaves the permit held and releasable: a second release() gives it back and
    answers True."""
    rs = redis.Redis(port=server.port)
    rs.flushall()
    pause = ["CLIENT", "PAUSE", 800, "WRITE"]
    if kind == "sync":
        client = redis.Redis(port=server.port, socket_timeout=0.3, retry=Retry(NoBackoff(), 0))
        permit = Semaphore(client, "again", limit=1, lease=30, auto_refresh=False).acquire()
        rs.execute_command(*pause)
        with pytest.raises((redis.ConnectionError, redis.TimeoutError)):
            permit.release()
        rs.execute_command("CLIENT", "UNPAUSE")
        assert live(rs, "again") == 1
        assert permit.release() is True
        assert permit.release() is True  # repeated, not sent again
        client.close()
    else:

        async def main():
            client = redis.asyncio.Redis(
                port=server.port, socket_timeout=0.3, retry=AsyncRetry(NoBackoff(), 0)
            )
            permit = await AsyncSemaphore(
                client, "again", limit=1, lease=30, auto_refresh=False
            ).acquire()
            rs.execute_command(*pause)
            with pytest.raises((redis.ConnectionError, redis.TimeoutError)):
                await permit.release()
            # redis.asyncio leaves the connection of a read that timed out open: closed here, as
            # a connection lost, so the server never runs the release.
            await client.connection_pool.disconnect()
            rs.execute_command("CLIENT", "UNPAUSE")
            assert live(rs, "again") == 1
            assert await permit.release() is True
            assert await permit.release() is True
            await client.aclose()

        asyncio.run(main())
    assert live(rs, "again") == 0
    rs.close()


class Proxy:
    """A TCP proxy on a free loopback port to a server's port, as a client's address that moves
    to a new primary: ``hold()`` makes new connections wait, ``point(port)`` sends them on;
    ``freeze()`` drops what comes from then on, both ways (a network that lost it)."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.frozen = False
        self.ready = threading.Event()
        self.ready.set()
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._link, args=(client,), daemon=True).start()

    def _link(self, client) -> None:
        self.ready.wait(30)
        try:
            upstream = socket.create_connection(("127.0.0.1", self.target))
        except OSError:
            client.close()
            return
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, a, b) -> None:
        try:
            while True:
                data = a.recv(65536)
                if not data:
                    break
                if not self.frozen:
                    b.sendall(data)
        except OSError:
            pass
        for s in (a, b):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def freeze(self) -> None:
        self.frozen = True

    def hold(self) -> None:
        self.ready.clear()

    def point(self, target: int) -> None:
        self.target = target
        self.ready.set()

    def close(self) -> None:
        self.listener.close()


def link_up(port) -> bool:
    client = redis.Redis(port=port)
    try:
        return client.info("replication")["master_link_status"] == "up"
    finally:
        client.close()


@pytest.mark.parametrize("kind", ["sync", "asyncio"])
def test_a_durable_grant_whose_wait_is_cut_is_looked_for_on_the_new_primary(kind):
    """The primary dies while WAIT blocks for the grant's replica (the replication stream cut, so
    the grant reaches neither replica); a replica is promoted, the other follows it, and the
    client's address now leads there (a proxy). redis-py resends WAIT on its new connection,
    where it counts nothing written and answers 1 at once: the acquire must not report a
    durable permit. It finds no holder on the new primary and raises NotDurable, and the name
    is free there."""
    primary = Server("--repl-diskless-sync-delay", "0")
    feed = Proxy(primary.port)  # the replication stream
    replicas = [Server("--replicaof", "127.0.0.1", str(feed.port)) for _ in range(2)]
    proxy = Proxy(primary.port)  # the client's address
    try:
        for replica in replicas:
            wait_until("the replica is in sync", lambda: link_up(replica.port), 10)
        feed.freeze()
        outcome = []

        def acquire():
            # socket_timeout None, as redis-py before 8: commands are retried on a new connection.
            options = dict(port=proxy.port, socket_timeout=None)
            durable = dict(limit=1, lease=30, durable_replicas=1, durable_timeout_ms=30000)
            try:
                if kind == "sync":
                    outcome.append(Semaphore(redis.Redis(**options), "jobs", **durable).acquire())
                else:

                    async def main():
                        client = redis.asyncio.Redis(**options)
                        return await AsyncSemaphore(client, "jobs", **durable).acquire()

                    outcome.append(asyncio.run(main()))
            except Exception as err:
                outcome.append(err)

        thread = threading.Thread(target=acquire)
        thread.start()
        p = redis.Redis(port=primary.port)
        wait_until(
            "the grant waits for a replica",
            lambda: any(c["cmd"] == "wait" for c in p.client_list()),
        )
        assert p.zcard("jobs") == 1
        p.close()
        proxy.hold()
        primary.process.kill()
        primary.process.wait()
        new = redis.Redis(port=replicas[0].port)
        new.replicaof("NO", "ONE")
        redis.Redis(port=replicas[1].port).replicaof("127.0.0.1", replicas[0].port)
        wait_until("the other replica follows", lambda: link_up(replicas[1].port), 10)
        assert new.zcard("jobs") == 0  # the grant reached no replica
        proxy.point(replicas[0].port)
        thread.join(30)
        assert len(outcome) == 1
        assert isinstance(outcome[0], NotDurable), outcome
        assert outcome[0].acked == 0 and outcome[0].wanted == 1
        assert live(new, "jobs") == 0
        with Semaphore(new, "jobs", limit=1, lease=30) as permit:
            assert new.zrange("jobs", 0, -1) == [permit.id.encode()]
        new.close()
    finally:
        for replica in replicas:
            replica.stop()
        primary.stop()
        proxy.close()
        feed.close()


# --- At application scale: a held permit costs no connection and no thread ---------------------


def connected(rs) -> int:
    return rs.info("clients")["connected_clients"]


def app_calls_answer(get, set_, n=100) -> int:
    """The application's own SET and GET on the client the permits use: how many of ``n``
    answered right, each within a second."""
    answered = 0
    for i in range(n):
        started = time.monotonic()
        set_(f"app:{i}", i)
        if int(get(f"app:{i}")) == i and time.monotonic() - started < 1:
            answered += 1
    return answered


SCALE = 10_000


def test_ten_thousand_permits_held_with_the_clients_defaults(server):
    """10,000 permits of 10,000 names (limit 5, lease 30 s) held at once through one
    redis.Redis() with its default pool: a handful of connections and one thread over the
    baseline, the application's own calls on the same client answering meanwhile, and at most
    4 KB of memory per held permit."""
    rs = redis.Redis(port=server.port)
    rs.flushall()
    r = redis.Redis(port=server.port)
    r.ping()
    base_connections, base_threads = connected(rs), threading.active_count()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    permits = [Semaphore(r, f"scale:{i}", limit=5, lease=30).acquire() for i in range(SCALE)]
    per_permit = (tracemalloc.get_traced_memory()[0] - before) / SCALE
    tracemalloc.stop()
    print(
        f"{SCALE} permits held: {per_permit:.0f} bytes each, "
        f"{connected(rs) - base_connections} connections and "
        f"{threading.active_count() - base_threads} threads over the baseline"
    )
    assert per_permit <= 4096, per_permit
    assert live(rs, "scale:0") == 1 and live(rs, f"scale:{SCALE - 1}") == 1
    assert connected(rs) - base_connections <= 3, connected(rs) - base_connections
    assert threading.active_count() - base_threads <= 1
    assert app_calls_answer(r.get, r.set) == 100
    assert not any(permit.lost for permit in permits)
    assert all(permit.release() for permit in permits)
    assert live(rs, "scale:0") == 0
    r.close()
    rs.close()


def test_ten_thousand_async_permits_held_with_the_clients_defaults(server):
    """As above, through one redis.asyncio.Redis(): one task over the baseline."""
    rs = redis.Redis(port=server.port)
    rs.flushall()

    async def main():
        r = redis.asyncio.Redis(port=server.port)
        await r.ping()
        base_connections, base_tasks = connected(rs), len(asyncio.all_tasks())
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        permits = [
            await AsyncSemaphore(r, f"ascale:{i}", limit=5, lease=30).acquire()
            for i in range(SCALE)
        ]
        per_permit = (tracemalloc.get_traced_memory()[0] - before) / SCALE
        tracemalloc.stop()
        print(
            f"{SCALE} asyncio permits held: {per_permit:.0f} bytes each, "
            f"{connected(rs) - base_connections} connections and "
            f"{len(asyncio.all_tasks()) - base_tasks} tasks over the baseline"
        )
        assert per_permit <= 4096, per_permit
        assert connected(rs) - base_connections <= 3, connected(rs) - base_connections
        assert len(asyncio.all_tasks()) - base_tasks <= 1
        answered = 0
        for i in range(100):
            started = time.monotonic()
            await r.set(f"app:{i}", i)
            if int(await r.get(f"app:{i}")) == i and time.monotonic() - started < 1:
                answered += 1
        assert answered == 100
        assert not any(permit.lost for permit in permits)
        assert all([await permit.release() for permit in permits])
        await r.aclose()

    asyncio.run(main())
    assert live(rs, "ascale:0") == 0
    rs.close()


def refreshes(rs) -> int:
    calls = sent_calls(rs)
    return calls.get("sem.refresh", 0) + calls.get("evalsha", 0) + calls.get("eval", 0)


@pytest.mark.parametrize("kind", ["sync", "asyncio"])
def test_a_thousand_short_leases_are_all_refreshed(server, kind):
    """1,000 permits with a 3 s lease held for 4 s: the one renewal refreshes every one of them
    (at least 3 rounds: without it all would have run out), none is lost, each release finds it
    held, while connections and threads (or tasks) stay a handful."""
    n, lease = 1000, 3
    rs = redis.Redis(port=server.port)
    rs.flushall()
    rs.config_resetstat()

    def check_held(permits, base_connections):
        assert connected(rs) - base_connections <= 3, connected(rs) - base_connections
        assert not any(permit.lost for permit in permits)
        assert sum(live(rs, f"short:{i}") for i in range(0, n, 97)) == len(range(0, n, 97))

    if kind == "sync":
        r = redis.Redis(port=server.port)
        r.ping()
        base_connections, base_threads = connected(rs), threading.active_count()
        permits = [Semaphore(r, f"short:{i}", limit=5, lease=lease).acquire() for i in range(n)]
        time.sleep(lease + 1)
        assert threading.active_count() - base_threads <= 1
        check_held(permits, base_connections)
        assert all(permit.release() for permit in permits)
        r.close()
    else:

        async def main():
            r = redis.asyncio.Redis(port=server.port)
            await r.ping()
            base_connections, base_tasks = connected(rs), len(asyncio.all_tasks())
            permits = [
                await AsyncSemaphore(r, f"short:{i}", limit=5, lease=lease).acquire()
                for i in range(n)
            ]
            await asyncio.sleep(lease + 1)
            assert len(asyncio.all_tasks()) - base_tasks <= 1
            check_held(permits, base_connections)
            assert all([await permit.release() for permit in permits])
            await r.aclose()

        asyncio.run(main())
    sent = refreshes(rs) - (n if SCRIPTS else 0) * 2  # the script's acquires and releases
    assert sent >= 3 * n, sent
    rs.close()


WAITERS = 200


@pytest.mark.parametrize("kind", ["sync", "asyncio"])
def test_two_hundred_waiters_are_served_in_order_with_the_clients_defaults(server, kind):
    """200 acquires waiting (wait=10) on one limit-1 name through one client with its default
    pool (redis-py 8: 100 connections), each holder giving its permit back 20 ms after its
    grant: all 200 are served, in the order they came, and the application's calls on the same
    client answer meanwhile (a wait holds a connection of its own, outside the pool)."""
    rs = redis.Redis(port=server.port)
    rs.flushall()
    name = "crowd"
    granted, errors = [], []

    if kind == "sync":
        r = redis.Redis(port=server.port)
        holder = Semaphore(r, name, limit=1, lease=30).acquire()

        def wait_for_it(i):
            try:
                with Semaphore(r, name, limit=1, lease=30, wait=10):
                    granted.append(i)
                    time.sleep(0.02)
            except Exception as err:  # reported below
                errors.append(repr(err))

        threads = []
        for i in range(WAITERS):
            thread = threading.Thread(target=wait_for_it, args=(i,))
            thread.start()
            threads.append(thread)
            wait_until(f"waiter {i} is in line", lambda i=i: waiting(rs, name) == i + 1, 5)
        assert app_calls_answer(r.get, r.set) == 100
        assert holder.release() is True
        answered = app_calls_answer(r.get, r.set)
        for thread in threads:
            thread.join(30)
        r.close()
    else:

        async def main():
            r = redis.asyncio.Redis(port=server.port)
            holder = await AsyncSemaphore(r, name, limit=1, lease=30).acquire()

            async def wait_for_it(i):
                try:
                    async with AsyncSemaphore(r, name, limit=1, lease=30, wait=10):
                        granted.append(i)
                        await asyncio.sleep(0.02)
                except Exception as err:
                    errors.append(repr(err))

            async def calls_answer():
                answered = 0
                for i in range(100):
                    started = time.monotonic()
                    await r.set(f"app:{i}", i)
                    if int(await r.get(f"app:{i}")) == i and time.monotonic() - started < 1:
                        answered += 1
                return answered

            tasks = []
            for i in range(WAITERS):
                tasks.append(asyncio.ensure_future(wait_for_it(i)))
                while waiting(rs, name) != i + 1:
                    await asyncio.sleep(0.002)
            assert await calls_answer() == 100
            assert await holder.release() is True
            answered = await calls_answer()
            await asyncio.gather(*tasks)
            await r.aclose()
            return answered

        answered = asyncio.run(main())
    assert errors == []
    assert answered == 100
    assert granted == list(range(WAITERS))
    assert live(rs, name) == 0
    rs.close()


def test_cancelling_every_task_stops_no_refresh(server):
    """An application that cancels every task of its loop (as at its shutdown) and goes on:
    the client's renewal, a timer of the loop between its rounds, still refreshes the permits
    held before and the ones taken after."""
    rs = redis.Redis(port=server.port)
    rs.flushall()

    async def main():
        r = redis.asyncio.Redis(port=server.port)
        first = await AsyncSemaphore(r, "cancelled:1", limit=1, lease=1.5).acquire()
        for task in asyncio.all_tasks():
            if task is not asyncio.current_task():
                task.cancel()
        await asyncio.sleep(0.01)
        second = await AsyncSemaphore(r, "cancelled:2", limit=1, lease=1.5).acquire()
        await asyncio.sleep(2.5)  # past both leases: held only if refreshed
        assert not first.lost and not second.lost
        assert await first.release() is True
        assert await second.release() is True
        await r.aclose()

    asyncio.run(main())
    rs.close()
