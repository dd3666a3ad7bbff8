"""The soak: each package's workers through a 3-primary, 3-replica Redis Cluster while a nemesis
moves slots, pauses primaries, fails them over and kills them; then the cluster heals, the
replicas are compared with their primaries and tests/soak/check.py reads the history.
scripts/test-soak runs it (and builds the workers); see tests/soak/README.md.
"""

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import check  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TEST_CLUSTER = str(ROOT / "scripts/test-cluster")
CLI = os.environ.get("REDIS_CLI", "redis-cli")
BACKENDS = ("module", "scripts")
PACKAGES = ("python", "node", "go", "rust", "java")


def now_us():
    return time.time_ns() // 1000


def say(*parts):
    print("soak:", *parts, file=sys.stderr, flush=True)


def tool(op, dir_, *args, check_=True):
    done = subprocess.run([TEST_CLUSTER, op, dir_, *map(str, args)], capture_output=True,
                          text=True, timeout=180)
    if check_ and done.returncode != 0:
        raise RuntimeError(f"test-cluster {op} {args}: {done.stdout}{done.stderr}")
    return json.loads(done.stdout) if done.stdout.strip().startswith("{") else None


def cli(port, *args):
    done = subprocess.run([CLI, "-p", str(port), *map(str, args)], capture_output=True,
                          text=True, timeout=30)
    return done.stdout.strip()


def cluster_nodes(ports):
    """{port: {"id", "primary", "of" (primary id), "slots", "failed"}} as a live node sees it."""
    for port in ports:
        out = cli(port, "CLUSTER", "NODES")
        if not out or out.startswith("ERR") or "Could not connect" in out:
            continue
        nodes = {}
        for line in out.splitlines():
            parts = line.split()
            if len(parts) < 8:
                continue
            flags = parts[2].split(",")
            slots = []
            for part in parts[8:]:
                if not part.startswith("["):
                    a, _, b = part.partition("-")
                    slots.append([int(a), int(b or a)])
            nodes[int(parts[1].split("@")[0].rsplit(":", 1)[1])] = {
                "id": parts[0], "primary": "master" in flags, "of": parts[3],
                "failed": "fail" in flags or "fail?" in flags, "slots": slots,
            }
        return nodes
    raise RuntimeError("no node answers CLUSTER NODES")


def owner(nodes, slot):
    for port, n in nodes.items():
        if n["primary"] and not n["failed"] and any(a <= slot <= b for a, b in n["slots"]):
            return port
    return None


class Nemesis(threading.Thread):
    """Faults one at a time, each logged with its times; after each the cluster converges."""

    def __init__(self, dir_, names, rng, log_path, kinds):
        super().__init__(daemon=True)
        self.dir, self.names, self.rng, self.kinds = dir_, names, rng, kinds
        self.log = open(log_path, "a", buffering=1)
        self.stop = threading.Event()
        self.error = None
        self.down = set()  # the ports it killed and has not restarted yet

    def pids(self):
        return {n["port"]: n["pid"] for n in tool("nodes", self.dir)["nodes"]}

    def ports(self):
        return list(self.pids())

    def record(self, fault):
        self.log.write(json.dumps(fault) + "\n")
        say("fault", json.dumps({k: v for k, v in fault.items() if k != "slots"}))

    def run(self):
        try:
            while not self.stop.wait(self.rng.uniform(2.0, 4.0)):
                self.fault()
        except Exception as err:  # the harness failed: the run is void, say why
            self.error = err
            say("nemesis failed:", err)

    def fault(self):
        kind = self.rng.choice(self.kinds)
        name = self.rng.choice(self.names)[0]
        slot = check.key_slot(name)
        nodes = cluster_nodes(self.ports())
        port = owner(nodes, slot)
        if port is None:
            return
        fault = {"kind": kind, "port": port, "slots": nodes[port]["slots"], "name": name}
        if kind == "move":
            to = self.rng.choice([p for p, n in nodes.items()
                                  if n["primary"] and not n["failed"] and p != port])
            fault.update(t0=now_us(), to=to, slots=[[slot, slot]], lossy=False)
            tool("move", self.dir, slot, to, "--pause-ms", 30)
            fault["t1"] = now_us()
        elif kind == "pause":
            # Longer than the node timeout (2 s): the replica takes over, the writes it had
            # not received are lost when the old primary comes back as its replica.
            seconds = self.rng.choice((1.0, 3.5))
            pid = self.pids()[port]
            fault.update(t0=now_us(), seconds=seconds)
            os.kill(pid, signal.SIGSTOP)
            time.sleep(seconds)
            os.kill(pid, signal.SIGCONT)
            tool("wait", self.dir)
            fault["t1"] = now_us()
            after = cluster_nodes(self.ports())
            fault["lossy"] = not after[port]["primary"]
        elif kind == "failover":
            replica = next((p for p, n in nodes.items()
                            if n["of"] == nodes[port]["id"] and not n["failed"]), None)
            if replica is None:
                return
            # Counted as losing writes (tests/soak/check.py says why).
            fault.update(t0=now_us(), replica=replica, lossy=True)
            out = cli(replica, "CLUSTER", "FAILOVER")
            deadline = time.monotonic() + 20
            while not cluster_nodes([replica])[replica]["primary"]:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"CLUSTER FAILOVER on {replica} ({out}) did not end")
                time.sleep(0.05)
            tool("wait", self.dir)
            fault["t1"] = now_us()
        elif kind == "kill":
            if not any(n["of"] == nodes[port]["id"] and not n["failed"] for n in nodes.values()):
                return
            fault.update(t0=now_us(), lossy=True)
            self.down.add(port)
            tool("kill", self.dir, port)
            tool("wait", self.dir)
            fault["killed"] = now_us()
            tool("restart", self.dir, port)
            self.down.discard(port)
            fault["t1"] = now_us()
        self.record(fault)


def node_states(dir_):
    """(port, pid, alive) of every node, from the harness's own record (no node asked)."""
    with open(os.path.join(dir_, "cluster.json")) as f:
        nodes = json.load(f)["nodes"]
    out = []
    for n in nodes:
        try:
            os.kill(n["pid"], 0)
            with open(f"/proc/{n['pid']}/stat") as stat:
                alive = stat.read().split()[2] != "Z"
        except OSError:
            alive = False
        out.append((n["port"], n["pid"], alive))
    return out


def heal(dir_, killed=()):
    """Resumes every node and restarts the dead ones. Returns the nodes that died without the
    nemesis killing them (it kills and restarts within one fault): crashes, with their log's
    end."""
    crashed = []
    for port, pid, alive in node_states(dir_):
        try:
            os.kill(pid, signal.SIGCONT)
        except OSError:
            pass
        if not alive:
            if port not in killed:
                log = Path(dir_, str(port), "server.log").read_text(errors="replace")
                crashed.append({"kind": "node-crashed", "port": port, "log": log[-3000:]})
            tool("restart", dir_, port)
    tool("wait", dir_)
    return crashed


def save_logs(dir_, out_dir, label):
    """Each node's server log, kept in out_dir/logs-<label> before the cluster goes."""
    logs = Path(out_dir, f"logs-{label}")
    logs.mkdir(exist_ok=True)
    for node in Path(dir_).glob("*/server.log"):
        (logs / f"{node.parent.name}.log").write_bytes(node.read_bytes())


def content(r, key):
    """A key's type and value, compared by content: DUMP's bytes may differ for equal values
    (a replica's full sync loads a small sorted set in the compact encoding that its primary,
    once it grew, no longer uses)."""
    kind = r.type(key).decode()
    if kind == "none":
        return None
    if kind == "string":
        return kind, r.get(key)
    if kind == "zset":
        return kind, r.zrange(key, 0, -1, withscores=True)
    if kind == "hash":
        return kind, sorted(r.hgetall(key).items())
    if kind == "list":
        return kind, r.lrange(key, 0, -1)
    if kind == "set":
        return kind, sorted(r.smembers(key))
    return kind, r.dump(key)


def replicas_differ(dir_, prefix):
    """The keys of the run (prefix) whose content differs between a primary and its replica, once
    the replica has every write (offsets equal); asked again a few times so that a key
    expiring between two reads is not taken for a difference."""
    import redis

    ports = [n["port"] for n in tool("nodes", dir_)["nodes"]]
    diffs = []
    for attempt in range(6):
        nodes = cluster_nodes(ports)
        diffs = []
        for port, n in nodes.items():
            if not n["primary"] or n["failed"]:
                continue
            replicas = [p for p, m in nodes.items() if m["of"] == n["id"]]
            if not replicas:
                diffs.append({"primary": port, "why": "no replica"})
            primary = redis.Redis(port=port, single_connection_client=True)
            for rport in replicas:
                replica = redis.Redis(port=rport, single_connection_client=True)
                replica.execute_command("READONLY")
                deadline = time.monotonic() + 20
                while True:
                    offset = primary.info("replication")["master_repl_offset"]
                    if replica.info("replication").get("slave_repl_offset", -1) >= offset:
                        break
                    if time.monotonic() > deadline:
                        diffs.append({"primary": port, "replica": rport, "why": "behind"})
                        break
                    time.sleep(0.1)
                keys = set(primary.scan_iter(match=f"*{prefix}*", count=1000))
                keys |= set(replica.scan_iter(match=f"*{prefix}*", count=1000))
                for key in sorted(keys):
                    a, b = content(primary, key), content(replica, key)
                    if a != b:
                        diffs.append({"primary": port, "replica": rport, "key": key.decode(),
                                      "on_primary": a is not None, "on_replica": b is not None})
                replica.close()
            primary.close()
        if not diffs:
            return []
        time.sleep(1)
    return diffs


def start_cluster(dir_, backend, server, module):
    options = ["--primaries", 3, "--replicas", 1]
    if server:
        options += ["--server", server]
    if backend == "module":
        options += ["--module", module]
    subprocess.run([TEST_CLUSTER, "stop", dir_], capture_output=True)
    return tool("start", dir_, *options)


def run_one(args, package, backend, dir_, out_dir, command, rng):
    tag = f"{package[:2]}{backend[0]}"
    # Names of limit 1 and 2 on different hash tags, so on different primaries mostly.
    # One kind per name (a name's holders are all fair or all plain).
    names = [(f"{{soak-{tag}-a}}", 1, "fair"), (f"{{soak-{tag}-b}}", 1, "plain"),
             (f"{{soak-{tag}-c}}", 2, "fair"), (f"{{soak-{tag}-d}}", 2, "plain")]
    history = out_dir / f"{package}-{backend}.history.jsonl"
    faults = out_dir / f"{package}-{backend}.faults.jsonl"
    for path in (history, faults):
        if path.exists():
            path.unlink()
    ports = [n["port"] for n in tool("nodes", dir_)["nodes"]]
    env = dict(os.environ,
               SOAK_NODES=",".join(f"127.0.0.1:{p}" for p in ports),
               SOAK_NAMES=",".join(f"{n}={limit}={kind}" for n, limit, kind in names),
               SOAK_SECONDS=str(args.seconds), SOAK_THREADS=str(args.threads),
               SOAK_OUT=str(history), SOAK_RETRY_FOR=str(args.retry_for),
               SOAK_DURABLE="1")
    say(f"{package}, {backend}: {args.workers} workers x {args.threads} for {args.seconds} s")
    workers = []
    for i in range(args.workers):
        workers.append(subprocess.Popen(
            command, env=dict(env, SOAK_WORKER=f"w{i}", SOAK_SEED=str(rng.randrange(1 << 30))),
            stdout=subprocess.DEVNULL, stderr=open(out_dir / f"{package}-{backend}.w{i}.log", "w"),
        ))
    nemesis = Nemesis(dir_, names, random.Random(rng.randrange(1 << 30)), faults, args.faults)
    nemesis.start()
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline and all(w.poll() is None for w in workers):
        time.sleep(0.5)
    nemesis.stop.set()
    nemesis.join()
    failed = []
    for i, w in enumerate(workers):
        try:
            code = w.wait(timeout=args.seconds + 120)
        except subprocess.TimeoutExpired:
            w.kill()
            code = "hung"
        if code != 0:
            failed.append((i, code))
    broken = None
    crashed = []
    try:
        crashed = heal(dir_, nemesis.down)
    except RuntimeError as err:  # the cluster did not come back: the next package gets a new one
        broken = str(err)
        for port, _, alive in node_states(dir_):
            if not alive and port not in nemesis.down:
                log = Path(dir_, str(port), "server.log").read_text(errors="replace")
                crashed.append({"kind": "node-crashed", "port": port, "log": log[-3000:]})
    save_logs(dir_, out_dir, f"{package}-{backend}")
    if broken is not None:
        violations = crashed + [{"kind": "heal-failed", "error": broken}]
        if nemesis.error is not None:
            violations.append({"kind": "nemesis-failed", "error": str(nemesis.error)})
        result = {"violations": {v["kind"]: 1 for v in violations}}
        with open(out_dir / f"{package}-{backend}.violations.jsonl", "w") as f:
            for v in violations:
                f.write(json.dumps(v) + "\n")
        return result, violations, True
    # Leases end (3 s at most), the script's line expires (6 s): then compare.
    time.sleep(4)
    diffs = replicas_differ(dir_, f"soak-{tag}-")
    faults_list = check.load(faults) if faults.exists() else []
    history_list = check.load(history) if history.exists() else []
    violations, explained = check.check(history_list, faults_list)
    for d in diffs:
        violations.append(dict(d, kind="replica-differs"))
    violations.extend(crashed)
    for i, code in failed:
        err = (out_dir / f"{package}-{backend}.w{i}.log").read_text()[-2000:]
        violations.append({"kind": "worker-failed", "worker": i, "code": code, "stderr": err})
    if nemesis.error is not None:
        violations.append({"kind": "nemesis-failed", "error": str(nemesis.error)})
    if not history_list:
        violations.append({"kind": "no-history"})
    result = check.summary(history_list, violations, explained)
    result["faults"] = {}
    for f in faults_list:
        key = f["kind"] + (" (lossy)" if f.get("lossy") else "")
        result["faults"][key] = result["faults"].get(key, 0) + 1
    with open(out_dir / f"{package}-{backend}.violations.jsonl", "w") as f:
        for v in violations:
            f.write(json.dumps(v) + "\n")
    return result, violations, False


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--packages", default=",".join(PACKAGES))
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--seconds", type=float, default=40)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--retry-for", type=float, default=10)
    parser.add_argument("--faults", default="move,move,pause,failover,kill")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--out", default=str(ROOT / "target/soak/run"))
    parser.add_argument("--keep", action="store_true", help="leave the clusters running")
    parser.add_argument("--command", action="append", default=[],
                        help="PACKAGE=JSON argv of its worker (scripts/test-soak passes these)")
    parser.add_argument("--server", default=os.environ.get("REDIS_SERVER"))
    parser.add_argument("--module", default=os.environ.get("REDSEM_MODULE"))
    args = parser.parse_args()
    args.faults = args.faults.split(",")
    commands = {}
    for c in args.command:
        package, _, argv = c.partition("=")
        commands[package] = json.loads(argv)
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    say(f"seed {seed}")
    rng = random.Random(seed)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    results = {}
    bad = False
    for backend in args.backends.split(","):
        dir_ = str(out_dir / f"cluster-{backend}")
        start_cluster(dir_, backend, args.server, args.module)
        try:
            for package in args.packages.split(","):
                result, violations, broken = run_one(args, package, backend, dir_, out_dir,
                                                     commands[package], rng)
                if broken:
                    start_cluster(dir_, backend, args.server, args.module)
                results[f"{package}, {backend}"] = result
                for v in violations[:20]:
                    say("VIOLATION", package, backend, json.dumps(v)[:1500])
                if len(violations) > 20:
                    say(f"... {len(violations) - 20} more in {out_dir}/{package}-{backend}"
                        ".violations.jsonl")
                say(f"{package}, {backend}:", json.dumps(result))
                bad = bad or bool(violations)
        finally:
            if not args.keep:
                subprocess.run([TEST_CLUSTER, "stop", dir_], capture_output=True)
    print(json.dumps(results, indent=1))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
