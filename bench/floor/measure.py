"""The floor a minimal C module reaches on a plain acquire/release pair and a hand-off (also
doing redsem's work besides the recipe's: csem.c, WORK=1: the derived keys looked for, the
keyspace events Redis's own commands fire for each change and redsem's own, for a wait its
timer, the next lease end, the flush and swap server events, and on Redis before 7.2 other
clients' deletes followed through keyspace events with a filter of the waited names), beside
redsem, the non-fair Lua script and BLPOP, and a fair hand-off (CSEM.ACQUIREFAIR: the fair
recipe, holders, owners by ticket and a counter) beside redsem's SEM.ACQUIREFAIR, in
instructions under callgrind: one connection per role, sequential round trips, a warm-up, then
the operations between callgrind_control -z and -d; serverCron left out. Usage:
bench/floor/measure (builds csem.so, then runs this)."""
import os, socket, subprocess, sys, time, glob, re
N = 1000
def resp(*a):
    return b"*%d\r\n" % len(a) + b"".join(b"$%d\r\n%s\r\n" % (len(x), x) for x in (s if isinstance(s, bytes) else str(s).encode() for s in a))
class Conn:
    def __init__(s, port):
        s.s = socket.create_connection(("127.0.0.1", port)); s.f = s.s.makefile("rb")
    def call(s, *a):
        s.s.sendall(resp(*a)); return s.read()
    def read(s):
        line = s.f.readline()
        if line[:1] == b"$":
            n = int(line[1:]); 
            if n < 0: return None
            d = s.f.read(n + 2); return d[:-2]
        if line[:1] == b"*":
            return [s.read() for _ in range(int(line[1:]))]
        if line[:1] == b"-": raise RuntimeError(line)
        return line.strip()
def start(server, modules, label):
    """A server under callgrind with `modules`, its dump directory, and a connection to it."""
    d = f"/tmp/redsem-floor-{label}"; os.makedirs(d, exist_ok=True)
    for f in glob.glob(d + "/callgrind.out*"): os.remove(f)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
    args = ["valgrind", "--tool=callgrind", "--dump-instr=no", f"--callgrind-out-file={d}/callgrind.out", server, "--port", str(port), "--save", "", "--appendonly", "no"]
    for m in modules: args += ["--loadmodule"] + m
    p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(200):
        try:
            c = Conn(port); c.call("PING"); return p, d, port, c
        except Exception: time.sleep(0.1)
    raise RuntimeError(f"{server} did not start")
def counted(p, d, n, run):
    """Instructions per operation of `run` (n operations), serverCron left out."""
    subprocess.run(["callgrind_control", "-z", str(p.pid)], stdout=subprocess.DEVNULL)
    run()
    subprocess.run(["callgrind_control", "-d", str(p.pid)], stdout=subprocess.DEVNULL)
    time.sleep(0.5)
    p.terminate(); p.wait()
    dumps = sorted(glob.glob(d + "/callgrind.out.*"), key=os.path.getmtime)
    out = subprocess.run(["callgrind_annotate", "--inclusive=yes", dumps[-1]], capture_output=True, text=True).stdout
    total = int(re.search(r"([\d,]+) \(100.0%\)\s+PROGRAM TOTALS", out).group(1).replace(",", ""))
    m = re.search(r"^\s*([\d,]+) \([\d. ]+%\)\s+\?\?\?:serverCron ", out, re.M)
    cron = int(m.group(1).replace(",", "")) if m else 0
    return (total - cron) / n
def measure(server, modules, pair, label):
    p, d, _, c = start(server, modules, label)
    pair(c, None)
    for i in range(200): pair(c, i)
    return counted(p, d, N, lambda: [pair(c, i) for i in range(N)])
REDIS = os.environ.get("REDIS_SERVER", "redis-server")
SEM = sys.argv[1]
CSEM = sys.argv[2]
LUA = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lua", "nonfair_acquire.lua")).read()
sha = {}
def floor(c, i):
    if i is None: return
    c.call("INCR", "k"); c.call("DECR", "k")
def csem(c, i):
    if i is None: return
    assert c.call("CSEM.ACQUIRE", "s", 1000000, 60000, "i") == b"i"; c.call("CSEM.RELEASE", "s", "i")
def lua(c, i):
    if i is None:
        sha["s"] = c.call("SCRIPT", "LOAD", LUA); return
    now = int(time.time() * 1000)
    c.call("EVALSHA", sha["s"], 1, "s", 1000000, "i", 60000, now); c.call("ZREM", "s", "i")
def sem(c, i):
    if i is None: return
    assert c.call("SEM.ACQUIRE", "s", 1000000, 60, "ID", "i") == b"i"; c.call("SEM.RELEASE", "s", "i")
def sem_fair(c, i):
    if i is None: return
    assert c.call("SEM.ACQUIREFAIR", "s", 1000000, 60, "ID", "i") == b"i"; c.call("SEM.RELEASE", "s", "i")
rows = [
  ("floor INCR+DECR", [], floor),
  ("non-fair Lua script (EVALSHA) + ZREM", [], lua),
  ("C module, no ACL check", [[CSEM, "0"]], csem),
  ("C module, ACL check on 4 derived keys", [[CSEM, "1"]], csem),
  ("C module, ACL check and redsem's other work", [[CSEM, "1", "1"]], csem),
  ("redsem SEM.ACQUIRE + SEM.RELEASE", [[SEM]], sem),
  ("redsem fair SEM.ACQUIREFAIR + SEM.RELEASE", [[SEM]], sem_fair),
]
# ONLY=<word>,<word>: only the rows whose label has one of them (the ratios' bases always run).
ONLY = [w for w in os.environ.get("ONLY", "").split(",") if w]
def wanted(label, base):
    return not ONLY or label == base or any(w in label for w in ONLY)
res = {}
if os.environ.get("PAIRS", "1") == "1":
  for label, mods, fn in rows:
      if not wanted(label, "non-fair Lua script (EVALSHA) + ZREM"): continue
      res[label] = measure(REDIS, mods, fn, label.split()[0] + str(len(res)))
if res:
  script = res["non-fair Lua script (EVALSHA) + ZREM"]
  for label, v in res.items():
    print(f"| {label} | {v:,.0f} | {v/script:.2f} × script |")

# Hand-offs: limit 1, two connections; one waits, 20 ms later the other gives back.
H = 250
def measure_handoff(server, modules, first, wait, give, label):
    p, d, port, a = start(server, modules, label)
    conns = {"a": a, "b": Conn(port)}
    first(a, "a")
    holder = "a"
    def one():
        nonlocal holder
        other = "b" if holder == "a" else "a"
        w = conns[other]
        w.s.sendall(wait(other))
        time.sleep(0.02)
        give(conns[holder], holder)
        assert w.read() is not None
        holder = other
    for _ in range(30): one()
    return counted(p, d, H, lambda: [one() for _ in range(H)])
hrows = [
  ("BLPOP tok 5 / RPUSH tok x", [], lambda c, me: None, lambda me: resp("BLPOP", "tok", 5), lambda c, me: c.call("RPUSH", "tok", "x")),
  ("C module, no ACL check", [[CSEM, "0"]], lambda c, me: c.call("CSEM.ACQUIRE", "s", 1, 60000, me), lambda me: resp("CSEM.ACQUIRE", "s", 1, 60000, me, 5000), lambda c, me: c.call("CSEM.RELEASE", "s", me)),
  ("C module, ACL check on 4 derived keys", [[CSEM, "1"]], lambda c, me: c.call("CSEM.ACQUIRE", "s", 1, 60000, me), lambda me: resp("CSEM.ACQUIRE", "s", 1, 60000, me, 5000), lambda c, me: c.call("CSEM.RELEASE", "s", me)),
  ("C module, ACL check and redsem's other work", [[CSEM, "1", "1"]], lambda c, me: c.call("CSEM.ACQUIRE", "s", 1, 60000, me), lambda me: resp("CSEM.ACQUIRE", "s", 1, 60000, me, 5000), lambda c, me: c.call("CSEM.RELEASE", "s", me)),
  ("redsem SEM.ACQUIRE ... WAIT 5 / SEM.RELEASE", [[SEM]], lambda c, me: c.call("SEM.ACQUIRE", "s", 1, 60, "ID", me), lambda me: resp("SEM.ACQUIRE", "s", 1, 60, "ID", me, "WAIT", 5), lambda c, me: c.call("SEM.RELEASE", "s", me)),
  ("C module fair, ACL check and redsem's other work", [[CSEM, "1", "1"]], lambda c, me: c.call("CSEM.ACQUIREFAIR", "s", 1, 60000, me), lambda me: resp("CSEM.ACQUIREFAIR", "s", 1, 60000, me, 5000), lambda c, me: c.call("CSEM.RELEASE", "s", me)),
  ("redsem SEM.ACQUIREFAIR ... WAIT 5 / SEM.RELEASE", [[SEM]], lambda c, me: c.call("SEM.ACQUIREFAIR", "s", 1, 60, "ID", me), lambda me: resp("SEM.ACQUIREFAIR", "s", 1, 60, "ID", me, "WAIT", 5), lambda c, me: c.call("SEM.RELEASE", "s", me)),
]
hres = {}
for label, mods, first, wait, give in hrows:
    if not wanted(label, "BLPOP tok 5 / RPUSH tok x"): continue
    hres[label] = measure_handoff(REDIS, mods, first, wait, give, "h" + str(len(hres)))
blpop = hres["BLPOP tok 5 / RPUSH tok x"]
for label, v in hres.items():
    print(f"| hand-off: {label} | {v:,.0f} | {v/blpop:.2f} × BLPOP |")
