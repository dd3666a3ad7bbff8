"""The checker's own test: histories made by hand with one known fault each, and the same with
the fault explained or absent. scripts/test-soak runs it before the soak:

  python3 tests/soak/test_check.py
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from check import check, key_slot  # noqa: E402

S = 1_000_000
NAME = "{t}"
SLOT = key_slot(NAME)


def acquire(p, t0, t1, lease=2, ticket=None, durable=False, wait=0, out="ok"):
    return {"w": p, "p": p, "name": NAME, "limit": 1, "lease": lease * 1000, "retry_for": 10_000,
            "op": "acquire", "fair": ticket is not None, "wait": wait, "durable": durable,
            "t0": t0, "t1": t1, "out": out, "ticket": ticket}


def call(p, op, t0, t1, out="ok", err=None):
    rec = {"w": p, "p": p, "name": NAME, "limit": 1, "lease": 2000, "retry_for": 10_000,
           "op": op, "t0": t0, "t1": t1, "out": out}
    if err:
        rec["err"] = err
    return rec


def kill(t0, t1, slots=((0, 16383),)):
    return {"kind": "kill", "t0": t0, "t1": t1, "slots": [list(s) for s in slots], "lossy": True}


def kinds(history, faults=()):
    violations, explained = check(history, list(faults))
    return sorted(v["kind"] for v in violations), explained


def test():
    # Two holders of a limit-1 name at once, no fault: over-admission.
    two = [acquire("a", 0, 10), call("a", "release", 1 * S, 1 * S + 10),
           acquire("b", S // 2, S // 2 + 10), call("b", "release", 1 * S, 1 * S + 10)]
    assert kinds(two)[0] == ["over-admission"], kinds(two)
    # The same with a kill -9 of the slot's primary between a's grant and b's: explained.
    found, explained = kinds(two, [kill(100, 200)])
    assert found == [] and explained, (found, explained)
    # A kill of another slot's primary explains nothing.
    other = ((SLOT + 1, SLOT + 1),) if SLOT < 16383 else ((0, 0),)
    assert kinds(two, [kill(100, 200, other)])[0] == ["over-admission"]
    # a durable: within its acknowledged lease it is never explained.
    durable = [dict(two[0], durable=True)] + two[1:]
    assert kinds(durable, [kill(100, 200)])[0] == ["durable-over-admission"]
    # ... unless its slot moved meanwhile (the new owner's replica acknowledged nothing).
    move = {"kind": "move", "t0": 50, "t1": 60, "slots": [[SLOT, SLOT]], "lossy": False}
    assert kinds(durable, [move, kill(100, 200)])[0] == []
    # Explained when b is granted, no longer once a refresh of a's answered after the fault.
    later = [acquire("a", 0, 10), call("a", "refresh", 300, 310),
             call("a", "release", S, S + 10),
             acquire("b", 200, 250), call("b", "release", S, S + 10)]
    assert kinds(later, [kill(20, 120)])[0] == ["over-admission"], kinds(later, [kill(20, 120)])
    # One after the other (a released before b's grant): nothing.
    apart = [acquire("a", 0, 10), call("a", "release", 100, 110),
             acquire("b", 200, 210), call("b", "release", S, S + 10)]
    assert kinds(apart)[0] == []
    # a's lease ended (2 s, no refresh) before b's grant: nothing, though a released later.
    lapsed = [acquire("a", 0, 10), call("a", "release", 3 * S, 3 * S + 10, out="lost"),
              acquire("b", 2 * S + 100, 2 * S + 110), call("b", "release", 4 * S, 4 * S + 10)]
    assert kinds(lapsed)[0] == []
    # ... unless a refresh confirmed it: over-admission again.
    refreshed = lapsed[:1] + [call("a", "refresh", S, S + 10)] + lapsed[1:]
    assert kinds(refreshed)[0] == ["over-admission"], kinds(refreshed)
    # Tickets: a later grant with a lower or equal ticket.
    back = [acquire("a", 0, 10, ticket=5), call("a", "release", 100, 110),
            acquire("b", 200, 210, ticket=4), call("b", "release", 300, 310)]
    assert kinds(back)[0] == ["ticket-back"]
    assert kinds(back, [kill(50, 60)])[0] == []
    same = [dict(back[2], ticket=5) if r is back[2] else r for r in back]
    assert kinds(same)[0] == ["ticket-repeated"]
    # A loss told while the confirmed lease runs, with and without a fault.
    early = [acquire("a", 0, 10), call("a", "release", S, S + 10, out="lost")]
    assert kinds(early)[0] == ["early-loss"]
    assert kinds(early, [kill(100, 200)])[0] == []
    told = [acquire("a", 0, 10), call("a", "check", S, S + 10, out="lost")]
    assert kinds(told)[0] == ["early-loss"]
    # An acquire giving its grant up as lost: early within a lease of its send, not after.
    assert kinds([acquire("a", 0, S, out="lost")])[0] == ["early-loss"]
    assert kinds([acquire("a", 0, 3 * S, out="lost")])[0] == []
    late = [acquire("a", 0, 10), call("a", "release", 3 * S, 3 * S + 10, out="lost")]
    assert kinds(late)[0] == []
    # A call past its budget, a waiter's error, an error within retry_for.
    slow = [acquire("a", 0, 13 * S, wait=0, out="not-acquired")]
    assert kinds(slow)[0] == ["past-budget"]
    waiter = [acquire("a", 0, 10, wait=1000, out="error")]
    assert kinds(waiter)[0] == ["waiter-error"]
    failed = [acquire("a", 0, 10, out="error")]
    assert kinds(failed)[0] == ["call-error"]
    print("test_check: all passed")


if __name__ == "__main__":
    test()
