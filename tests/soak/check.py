"""The soak's checker: reads the calls the workers logged (one JSON line each, times in µs of
CLOCK_REALTIME on this one machine) and the nemesis's faults, and finds what the packages
promise not to do. See tests/soak/README.md for each rule and why it cannot fire falsely.

  python3 tests/soak/check.py HISTORY.jsonl FAULTS.jsonl

A fault "loses writes" on a slot (lossy) when it can drop what the slot's primary acknowledged:
a kill -9 of that primary, a pause long enough that its replica took over, or CLUSTER
FAILOVER (counted as losing writes, though Redis hands over only once the replica has caught up,
since the old primary's timers and unblocked clients may still write during the hand-over). A holder's belief
is "explained" at an instant t when such a fault on its name's slot overlaps the span from the
send of the call that last confirmed the belief (the acquire or a refresh) to t.
"""

import json
import sys
from collections import defaultdict

# The server's clock and rounding (leases in ms): a deadline may fall this much earlier.
CLOCK_SLACK_US = 10_000
# A call may end this much after its budget (the wait, then retry_for through a failover).
BUDGET_SLACK_US = 2_000_000


def crc16(data: bytes) -> int:
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc


def key_slot(name: str) -> int:
    key = name.encode()
    start = key.find(b"{")
    if start >= 0:
        end = key.find(b"}", start + 1)
        if end > start + 1:
            key = key[start + 1 : end]
    return crc16(key) % 16384


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


class Faults:
    def __init__(self, faults):
        self.lossy = [f for f in faults if f.get("lossy")]
        self.moves = [f for f in faults if f["kind"] == "move"]

    def moved(self, name, since, until):
        """A move of name's slot overlapping [since, until]: the keys then live on a primary
        whose replica acknowledged nothing of them."""
        slot = key_slot(name)
        return any(f["t0"] <= until and f["t1"] >= since and any(a <= slot <= b for a, b in f["slots"])
                   for f in self.moves)

    def explains(self, name, since, until):
        """A lossy fault on name's slot overlapping [since, until]."""
        slot = key_slot(name)
        for f in self.lossy:
            if f["t0"] <= until and f["t1"] >= since:
                if any(a <= slot <= b for a, b in f["slots"]):
                    return f
        return None


class Permit:
    def __init__(self, acquire):
        self.acquire = acquire
        self.name = acquire["name"]
        self.lease = acquire["lease"] * 1000
        self.start = acquire["t1"]
        self.end = None  # the first of: release sent, loss told
        # Confirms: (sent, answered) of the acquire and each refresh that answered held.
        self.confirms = [(acquire["t0"], acquire["t1"])]
        self.durable = acquire.get("durable", False)

    def covering(self, t):
        """The confirm the belief at t rests on (latest sent among those answered by t whose
        lease still runs at t), or None."""
        best = None
        for sent, answered in self.confirms:
            if answered <= t < sent + self.lease - CLOCK_SLACK_US and (best is None or sent > best[0]):
                best = (sent, answered)
        return best

    def segments(self):
        """The spans when the holder believed it held: [answered, sent + lease) of each
        confirm (less the server's rounding), cut at the end; overlapping spans merged."""
        spans = []
        for sent, answered in self.confirms:
            a, b = answered, sent + self.lease - CLOCK_SLACK_US
            if self.end is not None:
                b = min(b, self.end)
            a = max(a, self.start)
            if b > a:
                spans.append([a, b])
        spans.sort()
        merged = []
        for a, b in spans:
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        return merged


def permits_of(history):
    permits = {}
    for rec in sorted(history, key=lambda r: r["t0"]):
        op = rec["op"]
        if op == "acquire":
            if rec["out"] == "ok":
                permits[rec["p"]] = Permit(rec)
            continue
        permit = permits.get(rec["p"])
        if permit is None:
            continue
        if op in ("refresh", "check"):
            if op == "refresh" and rec["out"] == "ok":
                permit.confirms.append((rec["t0"], rec["t1"]))
            elif rec["out"] == "lost" and permit.end is None:
                permit.end = rec["t1"]
        elif op == "release" and permit.end is None:
            permit.end = rec["t0"]
    return permits


def check(history, faults_list):
    faults = Faults(faults_list)
    violations = []
    explained = defaultdict(int)
    permits = permits_of(history)
    by_name = defaultdict(list)
    for p in permits.values():
        by_name[p.name].append(p)

    # Over-admission: more believed holders than the limit at one instant, counting only the
    # holders whose belief no lossy fault explains (a durable holder within its acknowledged
    # grant's lease is never explained, unless its slot moved since: the new owner's replica
    # acknowledged nothing).
    for name, group in by_name.items():
        limit = group[0].acquire["limit"]
        edges = []
        for p in group:
            for a, b in p.segments():
                edges.append((a, 1, p))
                edges.append((b, -1, p))
            # A refresh answered while held rests the belief on a later send: look again.
            for _, answered in p.confirms[1:]:
                edges.append((answered, 0, p))
        edges.sort(key=lambda e: (e[0], e[1]))
        held = set()
        reported, counted = set(), set()
        for t, delta, p in edges:
            if delta < 0:
                held.discard(p)
                continue
            if delta > 0:
                held.add(p)
            if len(held) <= limit or p not in held:
                continue
            firm = []
            for q in held:
                c = q.covering(t)
                if c is None:
                    continue
                # Within the acquire's own lease a replica has the grant, lost refresh or not.
                acked = (q.durable and t < q.acquire["t0"] + q.lease - CLOCK_SLACK_US
                         and not faults.moved(name, q.acquire["t0"], t))
                if acked or not faults.explains(name, c[0], t):
                    firm.append((q, acked))
            key = frozenset(q.acquire["p"] for q in held)
            if len(firm) > limit:
                if key in reported:
                    continue
                reported.add(key)
                kind = "durable-over-admission" if any(a for _, a in firm) else "over-admission"
                violations.append({
                    "kind": kind, "name": name, "limit": limit, "at": t,
                    "holders": [
                        {"p": q.acquire["p"], "acquire": [q.acquire["t0"], q.acquire["t1"]],
                         "durable": acked, "fair": q.acquire.get("fair"),
                         "wait": q.acquire.get("wait"),
                         "confirms": q.confirms, "end": q.end}
                        for q, acked in firm
                    ],
                })
            elif key not in counted:
                counted.add(key)
                explained["over-admission explained by a lost write"] += 1

    # Tickets: a fair grant answered before another was sent has the lower ticket, and no
    # two grants share one, unless a lossy fault falls between them.
    for name, group in by_name.items():
        fair = sorted((p.acquire for p in group if p.acquire.get("ticket") is not None),
                      key=lambda r: r["t1"])
        seen = {}
        for g in fair:
            other = seen.get(g["ticket"])
            if other is not None:
                if faults.explains(name, min(other["t0"], g["t0"]), max(other["t1"], g["t1"])):
                    explained["ticket repeated across a lost write"] += 1
                else:
                    violations.append({"kind": "ticket-repeated", "name": name,
                                       "ticket": g["ticket"], "grants": [other, g]})
            seen[g["ticket"]] = g
        for i, g2 in enumerate(fair):
            for g1 in fair[:i]:
                if g1["t1"] < g2["t0"] and g2["ticket"] < g1["ticket"]:
                    if faults.explains(name, g1["t0"], g2["t1"]):
                        explained["ticket back across a lost write"] += 1
                    else:
                        violations.append({"kind": "ticket-back", "name": name,
                                           "grants": [g1, g2]})
                    break

    # Early loss: a refresh, release or check told of a loss while the confirmed lease still
    # ran, with no lossy fault since that confirm; an acquire that gave up its grant as lost
    # within a lease of its first send (the grant, later, cannot have lapsed yet).
    for rec in history:
        if rec["op"] == "acquire" and rec["out"] == "lost":
            lease = rec["lease"] * 1000
            if rec["t1"] >= rec["t0"] + lease - CLOCK_SLACK_US:
                continue
            if faults.explains(rec["name"], rec["t0"], rec["t1"]):
                explained["loss before the lease end after a lost write"] += 1
            else:
                violations.append({"kind": "early-loss", "name": rec["name"], "call": rec,
                                   "lease_end": rec["t0"] + lease})
        if rec["op"] not in ("refresh", "release", "check") or rec["out"] != "lost":
            continue
        p = permits.get(rec["p"])
        if p is None:
            continue
        c = None
        for sent, answered in p.confirms:
            if answered <= rec["t0"] and (c is None or sent > c[0]):
                c = (sent, answered)
        if c is None or c[0] + p.lease - CLOCK_SLACK_US <= rec["t1"]:
            continue
        if faults.explains(p.name, c[0], rec["t1"]):
            explained["loss before the lease end after a lost write"] += 1
            continue
        violations.append({"kind": "early-loss", "name": p.name, "call": rec,
                           "lease_end": c[0] + p.lease})

    # Budgets and errors.
    for rec in history:
        took = rec["t1"] - rec["t0"]
        retry_for = rec.get("retry_for", 30_000) * 1000
        budget = rec.get("wait", 0) * 1000 + retry_for + BUDGET_SLACK_US
        if took > budget:
            violations.append({"kind": "past-budget", "name": rec["name"], "call": rec,
                               "took_ms": took // 1000, "budget_ms": budget // 1000})
        if rec["out"] != "error":
            continue
        if rec["op"] == "acquire" and rec.get("wait"):
            # A waiter interrupted by a move or a failover waits again (docs/clients.md).
            violations.append({"kind": "waiter-error", "name": rec["name"], "call": rec})
        elif rec["op"] == "refresh":
            p = permits.get(rec["p"])
            c = p and p.covering(rec["t0"])
            # A refresh is resent only while the confirmed lease runs: an error after its end
            # is the package's way of saying the permit is lost.
            if c and rec["t1"] < c[0] + p.lease - CLOCK_SLACK_US and took < retry_for:
                violations.append({"kind": "call-error", "name": rec["name"], "call": rec})
        elif took < retry_for:
            violations.append({"kind": "call-error", "name": rec["name"], "call": rec})
    return violations, dict(explained)


def summary(history, violations, explained):
    counts = defaultdict(int)
    for v in violations:
        counts[v["kind"]] += 1
    ops = defaultdict(int)
    for rec in history:
        ops[f"{rec['op']} {rec['out']}"] += 1
    return {"calls": dict(sorted(ops.items())), "violations": dict(sorted(counts.items())),
            "explained": explained}


def main():
    history = load(sys.argv[1])
    faults = load(sys.argv[2])
    violations, explained = check(history, faults)
    for v in violations:
        print(json.dumps(v))
    print(json.dumps(summary(history, violations, explained)))
    sys.exit(1 if violations else 0)


if __name__ == "__main__":
    main()
