"""Failover test: fair tickets under Sentinel failovers, restarts and partitions.

Real redis-servers with the module (AOF on) and real sentinels on this machine. Clients find the
primary through Sentinel (redis-py) and loop SEM.ACQUIREFAIR ... WITHTICKET, WAIT 1 500, a short
hold, SEM.RELEASE, recording every grant (name, ticket, node, times, WAIT's answer). Faults: a
replica promoted two terms behind (without Sentinel), SIGSTOP of the primary, kill -9 and a
restart from its AOF, SENTINEL FAILOVER, and (as root, with `ip netns`) a partition of the
primary and half the clients, without and with min-replicas-to-write.

Checked from the history: no ticket of a name repeats; grants of the surviving timeline never go
backwards; every node holds the same data at the end; no server crashed. Reported, not checked
(asynchronous replication allows them, see docs/semantics.md): grants made by a stale primary, and
moments when more holders than the limit believed they held a permit.

Usage: failover.py --module PATH [--server redis-server] [--only PHASE ...]
       failover.py client CONFIG-JSON   (a client process, started by the test)
"""

import argparse
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from bisect import bisect_right

import redis
from redis.sentinel import Sentinel

SERVICE = "fo"
NAMES = ["a", "b"]
LIMIT = 3
LEASE_S = 2
HOLD_S = 0.03
NETNS = "redsem-fo"
VETH_ROOT, VETH_NS = "redsem-fo0", "redsem-fo1"
ROOT_IP, NS_IP = "10.77.0.1", "10.77.0.2"
CRASH_MARKS = ["crashed by signal", "ASSERTION FAILED", "panicked", "Guru Meditation"]


def log(message):
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


# -------------------------------------------------------------------------------------------
# The client process
# -------------------------------------------------------------------------------------------


def client_main(config):
    """Loops acquire, WAIT, hold, release until the stop file appears; one JSON line a grant."""
    sentinels = [tuple(s) for s in config["sentinels"]]
    timeouts = {"socket_timeout": 1.0, "socket_connect_timeout": 0.5}
    sentinel = Sentinel(sentinels, sentinel_kwargs=dict(timeouts), **timeouts)
    pool = sentinel.master_for(SERVICE, **timeouts).connection_pool
    rng = random.Random(config["seed"])
    out = open(config["out"], "a", buffering=1)
    seq = 0
    while not os.path.exists(config["stop"]):
        seq += 1
        name = rng.choice(NAMES)
        holder = f"{config['id']}-{seq}"
        conn = None
        try:
            conn = pool.get_connection()
            sent = time.time()
            conn.send_command(
                "SEM.ACQUIREFAIR", name, LIMIT, LEASE_S, "ID", holder, "WITHTICKET"
            )
            reply = conn.read_response()
        except Exception:  # no primary reachable, a demoted one, a refusal (NOREPLICAS)
            if conn is not None:
                conn.disconnect()
                pool.release(conn)
            time.sleep(0.05)
            continue
        if reply is None:
            pool.release(conn)
            time.sleep(0.01)
            continue
        granted = time.time()
        node = f"{conn.host}:{conn.port}"
        try:
            conn.send_command("WAIT", 1, 500)
            acked = conn.read_response()
        except Exception:
            acked = -1
            conn.disconnect()
        time.sleep(HOLD_S)
        ended = time.time()
        try:
            conn.send_command("SEM.RELEASE", name, holder)
            released = conn.read_response()
        except Exception:
            released = None
            conn.disconnect()
        pool.release(conn)
        record = {
            "name": name,
            "ticket": int(reply[1]),
            "holder": holder,
            "node": node,
            "sent": sent,
            "granted": granted,
            "ended": ended,
            "acked": acked,
            "released": released,
        }
        out.write(json.dumps(record) + "\n")


# -------------------------------------------------------------------------------------------
# Servers, sentinels, the network namespace
# -------------------------------------------------------------------------------------------


class Node:
    """One redis-server with the module and AOF on, restartable from its directory."""

    def __init__(self, test, host, port, netns=None, extra=()):
        self.test, self.host, self.port, self.netns = test, host, port, netns
        self.extra = list(extra)
        self.dir = os.path.join(test.root, f"node-{port}")
        os.makedirs(self.dir, exist_ok=True)
        self.proc = None
        self.exits = []  # exit codes of earlier processes (kill -9 gives -9)

    @property
    def addr(self):
        return f"{self.host}:{self.port}"

    def start(self, replicaof=None):
        args = [
            self.test.server, "--port", str(self.port), "--bind", self.host,
            "--dir", self.dir, "--logfile", os.path.join(self.dir, "redis.log"),
            "--loadmodule", self.test.module, "--appendonly", "yes",
            "--appendfsync", "everysec", "--save", "", "--protected-mode", "no",
            "--enable-debug-command", "yes", "--repl-diskless-sync", "no",
        ] + self.extra
        if replicaof:
            args += ["--replicaof", replicaof.host, str(replicaof.port)]
        self.proc = subprocess.Popen(self.test.in_ns(self.netns, args))
        self.test.wait_until(f"{self.addr} answers", 10, lambda: self.ping())

    def client(self, timeout=1.0):
        return redis.Redis(
            self.host, self.port, socket_timeout=timeout, socket_connect_timeout=timeout
        )

    def ping(self):
        """Whether the server answers, and is this process (not another on the same port)."""
        try:
            return self.client().info("server")["process_id"] == self.proc.pid
        except Exception:
            return False

    def kill9(self):
        self.proc.send_signal(signal.SIGKILL)
        self.exits.append(self.proc.wait())

    def role(self):
        info = self.client().info("replication")
        return info["role"], info

    def log_text(self):
        with open(os.path.join(self.dir, "redis.log"), errors="replace") as f:
            return f.read()


class SentinelProc:
    def __init__(self, test, host, port, primary):
        self.test, self.host, self.port = test, host, port
        self.dir = os.path.join(test.root, f"sentinel-{port}")
        os.makedirs(self.dir, exist_ok=True)
        conf = os.path.join(self.dir, "sentinel.conf")
        with open(conf, "w") as f:
            f.write(
                f"port {port}\nbind {host}\nprotected-mode no\ndir {self.dir}\n"
                f"logfile {self.dir}/sentinel.log\n"
                f"sentinel monitor {SERVICE} {primary.host} {primary.port} 2\n"
                f"sentinel down-after-milliseconds {SERVICE} 1000\n"
                f"sentinel failover-timeout {SERVICE} 5000\n"
            )
        self.proc = subprocess.Popen([test.server, conf, "--sentinel"])
        test.wait_until(f"sentinel {port} answers", 10, lambda: self.ping())

    def ping(self):
        try:
            info = redis.Redis(self.host, self.port, socket_timeout=1).info("server")
            return info["process_id"] == self.proc.pid
        except Exception:
            return False

    def master(self):
        r = redis.Redis(self.host, self.port, socket_timeout=0.5, socket_connect_timeout=0.5,
                        decode_responses=True)
        host, port = r.sentinel_get_master_addr_by_name(SERVICE)
        return f"{host}:{port}"

    def log_text(self):
        with open(os.path.join(self.dir, "sentinel.log"), errors="replace") as f:
            return f.read()


def sh(*args, check=True):
    return subprocess.run(args, check=check, capture_output=True, text=True)


def netns_usable():
    if os.geteuid() != 0 or shutil.which("ip") is None:
        return False
    probe = "redsem-fo-probe"
    ok = sh("ip", "netns", "add", probe, check=False).returncode == 0
    sh("ip", "netns", "del", probe, check=False)
    return ok


def netns_up():
    netns_down()
    sh("ip", "netns", "add", NETNS)
    sh("ip", "link", "add", VETH_ROOT, "type", "veth", "peer", "name", VETH_NS)
    sh("ip", "link", "set", VETH_NS, "netns", NETNS)
    sh("ip", "addr", "add", f"{ROOT_IP}/24", "dev", VETH_ROOT)
    sh("ip", "link", "set", VETH_ROOT, "up")
    for cmd in (["addr", "add", f"{NS_IP}/24", "dev", VETH_NS],
                ["link", "set", VETH_NS, "up"], ["link", "set", "lo", "up"]):
        sh("ip", "netns", "exec", NETNS, "ip", *cmd)


def netns_down():
    sh("ip", "link", "del", VETH_ROOT, check=False)
    sh("ip", "netns", "del", NETNS, check=False)


def cut(on):
    """Drops every packet between the namespace and the rest, both ways, silently (blackhole
    routes more specific than the link's): the addresses and links stay as they are."""
    verb = "add" if on else "del"
    sh("ip", "route", verb, "blackhole", f"{NS_IP}/32")
    sh("ip", "netns", "exec", NETNS, "ip", "route", verb, "blackhole", f"{ROOT_IP}/32")


# -------------------------------------------------------------------------------------------
# One test run: phases over fresh servers, each checked from its history
# -------------------------------------------------------------------------------------------


class Failed(Exception):
    pass


class Test:
    def __init__(self, args):
        self.module = os.path.abspath(args.module)
        self.server = args.server
        self.root = tempfile.mkdtemp(prefix="redsem-failover-")
        self.port = 23000 + (os.getpid() % 200) * 20
        self.nodes, self.sentinels, self.clients = [], [], []
        self.client_serial = 0
        self.failures = []
        self.reports = []

    def next_port(self):
        """A port nothing on this machine listens on, whatever the address."""
        while True:
            self.port += 1
            with socket.socket() as probe:
                try:
                    probe.bind(("0.0.0.0", self.port))
                    return self.port
                except OSError:
                    continue

    @staticmethod
    def in_ns(netns, args):
        return (["ip", "netns", "exec", netns] + args) if netns else args

    @staticmethod
    def wait_until(what, seconds, condition):
        deadline = time.time() + seconds
        while time.time() < deadline:
            try:
                if condition():
                    return
            except Exception:
                pass
            time.sleep(0.05)
        raise Failed(f"timed out waiting until {what}")

    def check(self, ok, message):
        if not ok:
            self.failures.append(message)
            log(f"FAIL: {message}")
        return ok

    # -- processes --------------------------------------------------------------------------

    def start_clients(self, count, sentinels, netns_for=lambda i: None):
        self.stop_file = os.path.join(self.root, f"stop-{time.time()}")
        for i in range(count):
            self.client_serial += 1
            out = os.path.join(self.root, f"client-{self.client_serial}.jsonl")
            config = {
                "id": f"c{self.client_serial}", "sentinels": sentinels, "out": out,
                "stop": self.stop_file, "seed": self.client_serial,
            }
            args = [sys.executable, os.path.abspath(__file__), "client", json.dumps(config)]
            proc = subprocess.Popen(self.in_ns(netns_for(i), args))
            self.clients.append((proc, out))

    def clients_granted(self, count=3):
        """Waits until every client has been granted `count` times (they start slowly)."""

        def lines(out):
            if not os.path.exists(out):
                return 0
            with open(out) as f:
                return sum(1 for _ in f)

        self.wait_until(
            f"every client has {count} grants", 30,
            lambda: all(lines(out) >= count for _, out in self.clients),
        )

    def stop_clients(self):
        open(self.stop_file, "w").close()
        grants = []
        for proc, out in self.clients:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if os.path.exists(out):
                with open(out) as f:
                    grants += [json.loads(line) for line in f if line.strip()]
        self.clients = []
        return grants

    def teardown(self):
        for proc, _ in self.clients:
            proc.kill()
        for p in [s.proc for s in self.sentinels] + [n.proc for n in self.nodes]:
            if p and p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.kill()
                p.wait()
        self.nodes, self.sentinels, self.clients = [], [], []

    def crash_check(self, what):
        for node in self.nodes:
            self.check(node.proc.poll() is None, f"{what}: {node.addr} exited ({node.proc.poll()})")
            text = node.log_text()
            for mark in CRASH_MARKS:
                self.check(mark not in text, f"{what}: {node.addr}'s log says {mark!r}")
        for s in self.sentinels:
            self.check(s.proc.poll() is None, f"{what}: sentinel {s.port} exited")

    # -- Sentinel ---------------------------------------------------------------------------

    def sentinel_cluster(self, host, primary_ns=None, extra=()):
        primary = Node(self, NS_IP if primary_ns else host, self.next_port(), primary_ns, extra)
        primary.start()
        replicas = [Node(self, host, self.next_port(), None, extra) for _ in range(2)]
        for replica in replicas:
            replica.start(replicaof=primary)
        self.nodes = [primary] + replicas
        self.wait_until("both replicas are in sync", 20, lambda: self.in_sync(primary))
        self.sentinels = [SentinelProc(self, host, self.next_port(), primary) for _ in range(3)]
        self.wait_until(
            "the sentinels know both replicas and each other", 20,
            lambda: all(self.sentinel_sees_all(s) for s in self.sentinels),
        )
        self.views = [(time.time(), primary.addr)]
        self.watching = True
        self.watcher = threading.Thread(target=self.watch, daemon=True)
        self.watcher.start()
        return primary

    def sentinel_sees_all(self, s):
        r = redis.Redis(s.host, s.port, socket_timeout=1)
        master = r.sentinel_master(SERVICE)
        return int(master["num-slaves"]) == 2 and int(master["num-other-sentinels"]) == 2

    def watch(self):
        """Records when Sentinel's answer to "where is the primary?" changes."""
        while self.watching:
            for s in self.sentinels:
                try:
                    view = s.master()
                    break
                except Exception:
                    continue
            else:
                time.sleep(0.02)
                continue
            if view != self.views[-1][1]:
                self.views.append((time.time(), view))
                log(f"sentinel: the primary is now {view}")
            time.sleep(0.02)

    def view_at(self, t):
        times = [v[0] for v in self.views]
        return self.views[max(0, bisect_right(times, t) - 1)][1]

    def node_at(self, addr):
        return next(n for n in self.nodes if n.addr == addr)

    def in_sync(self, primary):
        info = primary.client().info("replication")
        offset = info["master_repl_offset"]
        slaves = [info.get(f"slave{i}") for i in range(info["connected_slaves"])]
        others = [n for n in self.nodes if n is not primary]
        return len(slaves) == len(others) and all(
            s["state"] == "online" and s["offset"] == offset for s in slaves
        )

    def settled(self, seconds=90):
        """One primary (Sentinel's), both others its replicas with their links up. Sentinel takes
        8 to 10 s to demote a returning old primary, and stops acting for 30 s when its timer
        ran late (TILT, on a loaded machine)."""

        def ok():
            addr = self.views[-1][1]
            role, _ = self.node_at(addr).role()
            if role != "master":
                return False
            for node in self.nodes:
                if node.addr == addr:
                    continue
                role, info = node.role()
                if role != "slave" or info["master_link_status"] != "up":
                    return False
                if f"{info['master_host']}:{info['master_port']}" != addr:
                    return False
            return True

        self.wait_until("one primary and two replicas in sync with it", seconds, ok)
        return self.node_at(self.views[-1][1])

    # -- checks -----------------------------------------------------------------------------

    def check_history(self, phase, grants, faults, cut_at=None):
        """faults: (time, primary then) of each fault; a grant by that primary after the fault,
        once Sentinel named another, may have been lost with the primary's unreplicated writes."""
        by_name = {}
        for g in grants:
            by_name.setdefault(g["name"], []).append(g)
        switches = self.views[1:]

        # A fault's primary may lose what it granted from the fault until Sentinel names
        # another primary, if it does so before the next fault.
        doubtful = []
        for k, (at, primary) in enumerate(faults):
            end = faults[k + 1][0] if k + 1 < len(faults) else float("inf")
            moved = [t for t, v in switches if at < t < end and v != primary]
            if moved:
                doubtful.append((primary, at, moved[0]))

        def stale(g):
            if self.view_at(g["sent"]) != g["node"] or self.view_at(g["granted"]) != g["node"]:
                return True
            return any(g["node"] == p and a <= g["sent"] <= m for p, a, m in doubtful)

        report = {"phase": phase, "grants": len(grants), "stale_grants": 0, "stale_by_node": {}}
        for name, gs in sorted(by_name.items()):
            tickets = [g["ticket"] for g in gs]
            repeats = sorted({t for t in tickets if tickets.count(t) > 1})
            self.check(not repeats, f"{phase}: {name}: tickets granted twice: {repeats[:5]}")
            current = [g for g in gs if not stale(g)]
            stale_gs = [g for g in gs if stale(g)]
            report["stale_grants"] += len(stale_gs)
            for g in stale_gs:
                n, first, last = report["stale_by_node"].get(g["node"], (0, None, None))
                clock = time.strftime("%H:%M:%S", time.localtime(g["granted"]))
                report["stale_by_node"][g["node"]] = (
                    n + 1, min(first or clock, clock), max(last or clock, clock))
            if stale_gs and cut_at:
                report[f"{name}_last_stale_after_cut_s"] = round(
                    max(g["granted"] for g in stale_gs) - cut_at, 2
                )
            # A grant whose reply came before another's request was sent is earlier for sure:
            # its ticket must be lower.
            by_reply = sorted(current, key=lambda g: g["granted"])
            highest, i = 0, 0
            backwards = []
            for g in sorted(current, key=lambda g: g["sent"]):
                while i < len(by_reply) and by_reply[i]["granted"] < g["sent"]:
                    highest = max(highest, by_reply[i]["ticket"])
                    i += 1
                if g["ticket"] <= highest:
                    backwards.append((g["ticket"], highest, g["node"]))
            self.check(
                not backwards,
                f"{phase}: {name}: the surviving timeline went backwards: {backwards[:5]}",
            )
            final = self.settled().client().get(f"{name}:counter")
            top = max((g["ticket"] for g in current), default=0)
            self.check(
                final is not None and int(final) >= top,
                f"{phase}: {name}: the counter is {final}, below ticket {top}",
            )
            over = over_limit(gs)
            report[f"{name}_over_limit"] = len(over)
            report[f"{name}_over_limit_acked"] = len(over_limit([g for g in gs if g["acked"] >= 1]))
            if over and cut_at:
                report[f"{name}_over_limit_last_after_cut_s"] = round(max(over) - cut_at, 2)
        report["by_node"] = {}
        for g in grants:
            report["by_node"][g["node"]] = report["by_node"].get(g["node"], 0) + 1
        return report

    def check_agreement(self, phase):
        primary = self.settled()
        # Past every lease, so no key expires between the reads below.
        time.sleep(LEASE_S + 0.5)
        primary.client().execute_command("WAIT", 2, 5000)

        def digests():
            return {n.addr: n.client().execute_command("DEBUG", "DIGEST") for n in self.nodes}

        try:
            self.wait_until("every node holds the same data", 10, lambda: len(set(digests().values())) == 1)
        except Failed:
            self.check(False, f"{phase}: the nodes differ: {digests()}")
        counters = {
            n.addr: [n.client().get(f"{name}:counter") for name in NAMES] for n in self.nodes
        }
        log(f"{phase}: counters by node: {counters}")

    # -- phases -----------------------------------------------------------------------------

    def phase_stale_replica(self):
        """P hands out five tickets (from its floor); R2 paused; R1 promoted hands out 5 more; P and R1 die; R2 resumes
        and is promoted: its tickets must be past R1's. Then a server restarted from R2's AOF as
        it was while paused (two terms old) must go past R2's. Without Sentinel."""
        phase = "stale replica promoted"
        p = Node(self, "127.0.0.1", self.next_port())
        p.start()
        r1, r2 = (Node(self, "127.0.0.1", self.next_port()) for _ in range(2))
        r1.start(replicaof=p)
        r2.start(replicaof=p)
        self.nodes = [p, r1, r2]
        self.wait_until("both replicas are in sync", 20, lambda: self.in_sync(p))

        def grant(node):
            return int(node.client().execute_command(
                "SEM.ACQUIREFAIR", "job", 100, 60, "WITHTICKET")[1])

        first = [grant(p) for _ in range(5)]
        p.client().execute_command("WAIT", 2, 5000)
        time.sleep(0.2)  # R2 writes its AOF in the event-loop turn after it applied them
        r2.proc.send_signal(signal.SIGSTOP)
        old = Node(self, "127.0.0.1", self.next_port())
        shutil.copytree(os.path.join(r2.dir, "appendonlydir"), os.path.join(old.dir, "appendonlydir"))
        r1.client().execute_command("REPLICAOF", "NO", "ONE")
        second = [grant(r1) for _ in range(5)]
        p.kill9()
        r1.kill9()
        r2.proc.send_signal(signal.SIGCONT)
        r2.client().execute_command("REPLICAOF", "NO", "ONE")
        third = [grant(r2) for _ in range(5)]
        r2.kill9()
        old.start()
        self.nodes.append(old)
        counter = old.client().get("job:counter")
        self.check(counter == str(first[-1]).encode(),
                   f"{phase}: the old AOF's counter is {counter}, not P's fifth ticket {first[-1]}")
        fourth = [grant(old) for _ in range(5)]
        log(f"{phase}: P {first}, R1 {second}, R2 {third}, R2's old AOF {fourth}")
        tickets = first + second + third + fourth
        repeats = sorted({t for t in tickets if tickets.count(t) > 1})
        self.check(not repeats, f"{phase}: tickets granted twice: {repeats}")
        self.check(min(third) > max(second), f"{phase}: R2's {third} not past R1's {second}")
        self.check(min(fourth) > max(third),
                   f"{phase}: the old AOF's {fourth} not past R2's {third}")
        for node in (r2, old):
            self.check(all(m not in node.log_text() for m in CRASH_MARKS),
                       f"{phase}: {node.addr} crashed")
        self.teardown()

    def phase_sentinel_faults(self):
        phase = "sentinel faults"
        host = "127.0.0.1"
        primary = self.sentinel_cluster(host)
        self.start_clients(6, [[s.host, s.port] for s in self.sentinels])
        self.clients_granted()
        faults = []

        log(f"{phase}: SIGSTOP of the primary {primary.addr} for 3 s")
        faults.append((time.time(), primary.addr))
        primary.proc.send_signal(signal.SIGSTOP)
        time.sleep(3)
        primary.proc.send_signal(signal.SIGCONT)
        stopped, primary = primary, self.settled()
        if primary is stopped:
            log(f"{phase}: Sentinel did not fail over during the SIGSTOP")
        time.sleep(1)

        log(f"{phase}: kill -9 of the primary {primary.addr}, restart from its AOF")
        faults.append((time.time(), primary.addr))
        primary.kill9()
        time.sleep(0.5)
        primary.start()
        primary = self.settled()
        time.sleep(1)

        log(f"{phase}: SENTINEL FAILOVER (the primary is {primary.addr})")
        faults.append((time.time(), primary.addr))
        s = self.sentinels[0]
        redis.Redis(s.host, s.port).execute_command("SENTINEL", "FAILOVER", SERVICE)
        self.wait_until("Sentinel names a new primary", 20, lambda: self.views[-1][1] != primary.addr)
        self.settled()
        time.sleep(2)

        grants = self.stop_clients()
        self.watching = False
        report = self.check_history(phase, grants, faults)
        self.check_agreement(phase)
        self.crash_check(phase)
        self.reports.append(report)
        self.teardown()

    def phase_partition(self, min_replicas):
        phase = "partition" + (f", min-replicas-to-write 1, max-lag {min_replicas}"
                               if min_replicas else ", no min-replicas-to-write")
        extra = ["--min-replicas-to-write", "1", "--min-replicas-max-lag", str(min_replicas)] \
            if min_replicas else []
        netns_up()
        try:
            primary = self.sentinel_cluster(ROOT_IP, primary_ns=NETNS, extra=extra)
            # Half the clients beside the primary, half with the replicas and sentinels.
            self.start_clients(6, [[s.host, s.port] for s in self.sentinels],
                               netns_for=lambda i: NETNS if i % 2 else None)
            self.clients_granted()
            log(f"{phase}: cutting {primary.addr} and half the clients off for 8 s")
            cut_at = time.time()
            cut(True)
            time.sleep(8)
            cut(False)
            log(f"{phase}: link restored")
            self.settled()
            time.sleep(2)
            grants = self.stop_clients()
            self.watching = False
            report = self.check_history(phase, grants, [(cut_at, primary.addr)], cut_at)
            self.check_agreement(phase)
            self.crash_check(phase)
            self.reports.append(report)
        finally:
            self.teardown()
            netns_down()


def over_limit(grants):
    """When grants began while `LIMIT` others were held (by the clients' own clocks: from the
    grant's reply to the release being sent)."""
    times = []
    ordered = sorted(grants, key=lambda g: g["granted"])
    for i, g in enumerate(ordered):
        held = sum(1 for h in ordered[max(0, i - 200):i] if h["ended"] > g["granted"])
        if held >= LIMIT:
            times.append(g["granted"])
    return times


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "client":
        client_main(json.loads(sys.argv[2]))
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--module", required=True)
    parser.add_argument("--server", default=os.environ.get("REDIS_SERVER", "redis-server"))
    parser.add_argument("--only", nargs="*", help="stale, sentinel, partition")
    args = parser.parse_args()
    test = Test(args)
    started = time.time()
    phases = args.only or ["stale", "sentinel", "partition"]
    try:
        if "stale" in phases:
            test.phase_stale_replica()
        if "sentinel" in phases:
            test.phase_sentinel_faults()
        if "partition" in phases:
            if netns_usable():
                test.phase_partition(None)
                test.phase_partition(1)
            else:
                log("partition: skipped (needs root and a working `ip netns`)")
    except Failed as error:
        test.failures.append(str(error))
        log(f"FAIL: {error}")
    finally:
        test.teardown()
    for report in test.reports:
        log("report: " + json.dumps(report))
    log(f"took {time.time() - started:.0f} s; files in {test.root}")
    if test.failures:
        log(f"{len(test.failures)} failure(s):")
        for failure in test.failures:
            print(f"  - {failure}")
        sys.exit(1)
    shutil.rmtree(test.root, ignore_errors=True)
    log("ok")


if __name__ == "__main__":
    main()
