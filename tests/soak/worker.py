"""The soak's Python worker: SOAK_THREADS loops, each with its own redis-py RedisCluster, take
permits of the soak's names through the redsem package and log every call as one JSON line
(tests/soak/README.md has the protocol every language's worker follows).

Environment: SOAK_NODES (host:port,...), SOAK_NAMES (name=limit=fair|plain,...), SOAK_SECONDS,
SOAK_THREADS, SOAK_WORKER (this process's label), SOAK_SEED, SOAK_OUT (the log file),
SOAK_RETRY_FOR (seconds), SOAK_DURABLE (1: some acquires ask one replica's acknowledgement).
"""

import json
import os
import random
import threading
import time

import redis.cluster

from redsem import NotAcquired, NotDurable, PermitLost, Semaphore

NODES = [
    redis.cluster.ClusterNode(host, int(port))
    for host, port in (n.rsplit(":", 1) for n in os.environ["SOAK_NODES"].split(","))
]
NAMES = [
    (name, int(limit), kind == "fair")
    for name, limit, kind in (n.rsplit("=", 2) for n in os.environ["SOAK_NAMES"].split(","))
]
SECONDS = float(os.environ["SOAK_SECONDS"])
THREADS = int(os.environ.get("SOAK_THREADS", "2"))
WORKER = os.environ["SOAK_WORKER"]
SEED = int(os.environ.get("SOAK_SEED", "1"))
RETRY_FOR = float(os.environ.get("SOAK_RETRY_FOR", "10"))
DURABLE = os.environ.get("SOAK_DURABLE") == "1"

out = open(os.environ["SOAK_OUT"], "a", buffering=1)
out_lock = threading.Lock()


def now_us() -> int:
    return time.time_ns() // 1000


def log(record: dict) -> None:
    with out_lock:
        out.write(json.dumps(record) + "\n")


def call(record: dict, fn):
    """Runs fn, filling the record's times and outcome; returns fn's value or None."""
    record["t0"] = now_us()
    try:
        value = fn()
    except NotAcquired:
        record["out"] = "not-acquired"
        value = None
    except PermitLost as err:
        record["out"] = "lost"
        record["err"] = str(err)
        value = None
    except NotDurable as err:
        record["out"] = "not-durable"
        record["err"] = str(err)
        value = None
    except Exception as err:  # every other failure is logged for the checker to judge
        record["out"] = "error"
        record["err"] = f"{type(err).__name__}: {err}"
        value = None
    record["t1"] = now_us()
    return value


def loop(index: int) -> None:
    rng = random.Random(SEED * 1000 + index)
    me = f"{WORKER}.{index}"
    rc = redis.cluster.RedisCluster(startup_nodes=NODES, socket_timeout=5)
    end = time.monotonic() + SECONDS
    seq = 0
    while time.monotonic() < end:
        seq += 1
        name, limit, fair = rng.choice(NAMES)
        lease = rng.choice((2.0, 3.0))
        wait = rng.choice((0.0, 0.0, 1.0, 3.0))
        durable = DURABLE and rng.random() < 0.2
        base = {
            "w": me, "p": f"{me}#{seq}", "name": name, "limit": limit,
            "lease": int(lease * 1000), "retry_for": int(RETRY_FOR * 1000),
        }
        sem = Semaphore(
            rc, name, limit, lease, wait=wait or None, fair=fair,
            durable_replicas=1 if durable else 0, durable_timeout_ms=500,
            auto_refresh=False, retry_for=RETRY_FOR,
        )
        rec = dict(base, op="acquire", fair=fair, wait=int(wait * 1000), durable=durable)
        permit = call(rec, sem.acquire)
        if permit is not None:
            rec["out"] = "ok"
            rec["ticket"] = permit.ticket
            rec["id"] = str(permit.id)
        log(rec)
        if permit is None:
            time.sleep(rng.uniform(0, 0.2))
            continue

        def refresh() -> bool:
            r = dict(base, op="refresh")
            held = call(r, permit.refresh)
            if "out" not in r:
                r["out"] = "ok" if held else "lost"
            log(r)
            return r["out"] == "ok"

        def check() -> bool:
            r = dict(base, op="check")
            call(r, permit.check)
            r.setdefault("out", "ok")
            log(r)
            return r["out"] == "ok"

        # A wait for the grant leaves the lease's start unknown: confirm it, as the package does.
        held = True
        if (rec["t1"] - rec["t0"]) / 1e6 > lease / 3:
            held = refresh()
        if rng.random() < 0.15:
            # Overstay: no refresh past the lease, then release (it should report the loss).
            time.sleep(lease + 0.3)
        else:
            hold_end = time.monotonic() + rng.uniform(0, lease * 1.6)
            while held and time.monotonic() < hold_end:
                time.sleep(min(lease / 3, max(hold_end - time.monotonic(), 0)))
                if time.monotonic() < hold_end:
                    held = check() and refresh()
        r = dict(base, op="release")
        released = call(r, permit.release)
        if "out" not in r:
            r["out"] = "ok" if released else "lost"
        log(r)
        time.sleep(rng.uniform(0, 0.1))
    rc.close()


threads = [threading.Thread(target=loop, args=(i,)) for i in range(THREADS)]
for t in threads:
    t.start()
for t in threads:
    t.join()
