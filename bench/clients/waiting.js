"use strict";
// Waiting without the module: what waiting clients cost the server and how late a
// waiter is served, for three ways to wait on a limit-1 semaphore, side by side in one run:
//
//   scripts    redsem-client (the npm pack of clients/node) on a server WITHOUT the module:
//              the Lua script, waiting by BLPOP on <name>:wake with a re-check at most every
//              min(time left, next lease end, 1 s);
//   rs-sem     redis-semaphore's Semaphore (limit 1), polling as shipped (retryInterval 10 ms);
//   rs-mutex   redis-semaphore's Mutex (SET NX PX), polling as shipped (retryInterval 10 ms);
//   module     redsem-client on a server WITH the module: SEM.ACQUIRE ... WAIT.
//
// Every cell gets a fresh redis-server (no counts mix). Cells:
//
//   handoff N  N + 1 clients, each: acquire (waiting), hold --hold-ms, release, rest --rest-ms
//              (shorter than the hold, so N clients wait at every release), again. Lateness of
//              a hand-off: from the holder's release reply to the next grant reply (to a client
//              that was waiting then), on this process's monotonic clock.
//   idle N     one client holds for the whole cell, N clients wait: what waiting costs while
//              nothing is released.
//   lease N    --lease-waiters + 1 clients; each granted holder never releases: its lease
//              (--lease-ms) runs out; lateness from the lease's end (its grant reply + lease) to
//              the next grant reply.
//
// Server commands: INFO's total_commands_processed delta less the benchmark's own INFO, per
// second and per waiting client; server CPU: used_cpu_sys + used_cpu_user delta per second.
// Run by bench/clients/run, which installs the packages and sets NODE_PATH.

const { spawn } = require("node:child_process");
const fs = require("node:fs");
const net = require("node:net");
const os = require("node:os");
const path = require("node:path");
const { performance, monitorEventLoopDelay } = require("node:perf_hooks");
const Redis = require("ioredis");
const redsem = require("redsem-client");
const { Semaphore, Mutex } = require("redis-semaphore");

const now = () => performance.now();
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// ---------------------------------------------------------------------------------------------
// Options

const HELP = `usage: node bench/clients/waiting.js --server PATH --module PATH [options]
  --smoke               1 s cells, N = 1,10, lease-end cell of 2 s
  --seconds S           seconds per cell (default 5; smoke 1)
  --rounds R            each contender runs each cell R times, the contenders in turn, and its
                        figures are of all R together (default 3; smoke 1)
  --waiters LIST        N for the hand-off and idle cells (default 1,10,100; smoke 1,10)
  --hold-ms MS          how long a holder holds (default 20)
  --rest-ms MS          how long a client rests after its release (default: --hold-ms / 2)
  --lease-ms MS         the lease that runs out in the lease-end cell (default 300)
  --lease-waiters N     waiters in the lease-end cell (default 10)
  --lease-seconds S     seconds of the lease-end cell (default 2 x --seconds)
  --fair-clients N      clients in the fair cell (default 32)
  --fair-limit N        the fair cell's limit (default 3)
  --fair-hold-ms MS     how long a fair-cell holder holds (default 30)
  --fair-seconds S      seconds of the fair cell (default 2 x --seconds)
  --contenders LIST     scripts,rs-sem,rs-mutex,module (default: all)
  --cells LIST          handoff,idle,lease,fair (default: all)
  --out PATH            also write the Markdown here
  --command TEXT        the command line to print (bench/clients/run passes its own)`;

function parseArgs(argv) {
  const o = {
    smoke: false,
    seconds: null,
    rounds: null,
    clients: null,
    holdMs: 20,
    restMs: null,
    leaseMs: 300,
    leaseWaiters: 10,
    leaseSeconds: null,
    fairClients: 32,
    fairLimit: 3,
    fairHoldMs: 30,
    fairSeconds: null,
    contenders: ["scripts", "rs-sem", "rs-mutex", "module"],
    cells: ["handoff", "idle", "lease", "fair"],
    server: "redis-server",
    module: null,
    out: null,
    command: null,
  };
  const list = (v) => v.split(",").map((s) => s.trim()).filter(Boolean);
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    const [flag, inline] = a.includes("=") ? [a.slice(0, a.indexOf("=")), a.slice(a.indexOf("=") + 1)] : [a, null];
    const value = () => (inline !== null ? inline : argv[++i]);
    switch (flag) {
      case "--smoke": o.smoke = true; break;
      case "--seconds": o.seconds = Number(value()); break;
      case "--rounds": o.rounds = Number(value()); break;
      case "--waiters": o.clients = list(value()).map(Number); break;
      case "--hold-ms": o.holdMs = Number(value()); break;
      case "--rest-ms": o.restMs = Number(value()); break;
      case "--lease-ms": o.leaseMs = Number(value()); break;
      case "--lease-waiters": o.leaseWaiters = Number(value()); break;
      case "--lease-seconds": o.leaseSeconds = Number(value()); break;
      case "--fair-clients": o.fairClients = Number(value()); break;
      case "--fair-limit": o.fairLimit = Number(value()); break;
      case "--fair-hold-ms": o.fairHoldMs = Number(value()); break;
      case "--fair-seconds": o.fairSeconds = Number(value()); break;
      case "--contenders": o.contenders = list(value()); break;
      case "--cells": o.cells = list(value()); break;
      case "--server": o.server = value(); break;
      case "--module": o.module = value(); break;
      case "--out": o.out = value(); break;
      case "--command": o.command = value(); break;
      case "-h": case "--help": console.log(HELP); process.exit(0); break;
      default: console.error(`unknown argument ${a}\n${HELP}`); process.exit(2);
    }
  }
  if (o.seconds == null) o.seconds = o.smoke ? 1 : 5;
  if (o.rounds == null) o.rounds = o.smoke ? 1 : 3;
  if (!(o.rounds >= 1)) throw new Error("--rounds must be 1 or more");
  if (o.clients == null) o.clients = o.smoke ? [1, 10] : [1, 10, 100];
  if (o.restMs == null) o.restMs = o.holdMs / 2;
  if (o.leaseSeconds == null) o.leaseSeconds = 2 * o.seconds;
  if (o.fairSeconds == null) o.fairSeconds = 2 * o.seconds;
  for (const c of o.contenders) {
    if (!CONTENDERS[c]) throw new Error(`unknown contender ${c}`);
  }
  if (o.contenders.includes("module") && !o.module) throw new Error("--module PATH is needed");
  return o;
}

// ---------------------------------------------------------------------------------------------
// Servers: a fresh redis-server per cell and round, on a free loopback port.

function freePort() {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.once("error", reject);
    srv.listen(0, "127.0.0.1", () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

async function startServer(opts, withModule) {
  const pin = (process.env.REDSEM_BENCH_SERVER_PIN || "").split(/\s+/).filter(Boolean);
  for (let attempt = 0; attempt < 5; attempt++) {
    const port = await freePort();
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "redsem-bench-clients-"));
    const args = ["--bind", "127.0.0.1", "--port", String(port), "--save", "", "--appendonly", "no",
      "--dir", dir, "--logfile", path.join(dir, "redis.log")];
    if (withModule) args.push("--loadmodule", path.resolve(opts.module));
    const cmd = [...pin, opts.server, ...args];
    const child = spawn(cmd[0], cmd.slice(1), { stdio: "ignore" });
    let exited = false;
    child.on("exit", () => { exited = true; });
    for (let i = 0; i < 50 && !exited; i++) {
      const admin = new Redis({ port, host: "127.0.0.1", lazyConnect: true, maxRetriesPerRequest: 0,
        retryStrategy: () => null });
      admin.on("error", () => {});
      try {
        await admin.connect();
        if ((await admin.ping()) === "PONG") {
          const stop = async () => {
            admin.disconnect();
            if (!exited) {
              const gone = new Promise((resolve) => child.once("exit", resolve));
              child.kill("SIGTERM");
              await gone;
            }
            fs.rmSync(dir, { recursive: true, force: true });
          };
          return { port, admin, stop };
        }
      } catch {
        admin.disconnect();
      }
      await sleep(100);
    }
    if (!exited) child.kill("SIGKILL");
    let log = "";
    try { log = fs.readFileSync(path.join(dir, "redis.log"), "utf8").split("\n").slice(-10).join("\n"); } catch {}
    fs.rmSync(dir, { recursive: true, force: true });
    if (attempt === 4) throw new Error(`redis-server did not start on ${port}:\n${log}`);
  }
  throw new Error("unreachable");
}

/** INFO stats, cpu and commandstats in one call (Redis 7 takes several sections). */
async function snapshot(admin) {
  const text = await admin.info("stats", "cpu", "commandstats");
  const s = { commands: 0, cpu: 0, calls: {} };
  for (const line of text.split("\r\n")) {
    let m;
    if ((m = /^total_commands_processed:(\d+)/.exec(line))) s.commands = Number(m[1]);
    else if ((m = /^used_cpu_(sys|user):([\d.]+)/.exec(line))) s.cpu += Number(m[2]);
    else if ((m = /^cmdstat_([^:]+):calls=(\d+)/.exec(line))) s.calls[m[1]] = Number(m[2]);
  }
  return s;
}

/** What the server did between two snapshots, less the first snapshot's own INFO. */
function delta(a, b) {
  const calls = {};
  for (const [name, n] of Object.entries(b.calls)) {
    const d = n - (a.calls[name] || 0) - (name === "info" ? 1 : 0);
    if (d > 0) calls[name] = d;
  }
  return { commands: b.commands - a.commands - 1, cpu: b.cpu - a.cpu, calls };
}

// ---------------------------------------------------------------------------------------------
// Contenders: make(port, events) -> { clients, acquire(client, lease ms, refresh), release(h) }.
// Grants and releases are stamped when their reply arrives.

/**
 * An ioredis client that stamps the replies redsem-client's permits get: a grant (SEM.ACQUIRE
 * or the script's ACQUIRE answering a permit) and a release (SEM.RELEASE or the script's
 * RELEASE). Its duplicates (the connection a waiting permit opens) stamp into the same slot.
 */
class StampingRedis extends Redis {
  call(...args) {
    const reply = super.call(...args);
    const slot = this.slot;
    if (slot) {
      const command = String(args[0]).toUpperCase();
      let kind = null;
      if (command === "SEM.ACQUIRE" || command === "SEM.ACQUIREFAIR") kind = "acquire";
      else if (command === "SEM.RELEASE") kind = "release";
      else if (command === "SEM.REFRESH") kind = "refresh";
      else if (command === "EVALSHA" || command === "EVAL") {
        // EVALSHA sha numkeys key... OP args...
        const op = String(args[3 + Number(args[2])]).toUpperCase();
        if (op === "ACQUIRE" || op === "ACQUIREFAIR") kind = "script-acquire";
        else if (op === "RELEASE") kind = "release";
        else if (op === "REFRESH") kind = "refresh";
        else if (op === "LEAVE") kind = "script-message";
      } else if (command === "BLPOP") {
        kind = "script-wake";
      }
      if (kind) {
        reply.then((r) => {
          const t = now();
          if (kind === "release") slot.released = t;
          else if (kind === "refresh") slot.renewed = t;
          else if (kind === "acquire" ? r != null : kind === "script-acquire" ? Array.isArray(r) && r[0] != null
            : kind === "script-wake" ? Array.isArray(r) && String(r[1]).startsWith("G")
              : r != null && String(r).startsWith("G")) slot.granted = t;
        }, () => {});
      }
    }
    return reply;
  }

  duplicate(override) {
    const copy = new StampingRedis({ ...this.options, ...override });
    copy.slot = this.slot;
    return copy;
  }
}

function redsemContender(port) {
  return {
    client() {
      const c = new StampingRedis({ port, host: "127.0.0.1" });
      c.slot = {};
      return c;
    },
    async warm(c, name) {
      // Asks the server once whether it has the module (and loads the script) before counting.
      const p = await redsem.acquire(c, `${name}:warm`, { limit: 1000, lease: 10, autoRefresh: false });
      await p.release();
    },
    async acquire(c, name, leaseMs, refresh, { fair = false, limit = 1 } = {}) {
      c.slot.granted = null;
      c.slot.renewed = null;
      const permit = await redsem.acquire(c, name, {
        limit, lease: leaseMs / 1000, wait: 120, autoRefresh: refresh, fair,
      });
      const granted = c.slot.granted ?? now();
      // After a long wait the package confirms the lease with a refresh: it starts there.
      return { permit, granted, leaseStart: c.slot.renewed ?? granted };
    },
    async release(c, h) {
      c.slot.released = null;
      await h.permit.release();
      return c.slot.released ?? now();
    },
  };
}

function redisSemaphoreContender(port, Kind) {
  return {
    client() {
      return new Redis({ port, host: "127.0.0.1" });
    },
    async warm(c, name) {
      const lock = Kind === Mutex ? new Mutex(c, `${name}:warm`) : new Semaphore(c, `${name}:warm`, 1000);
      await lock.acquire();
      await lock.release();
    },
    async acquire(c, name, leaseMs, refresh, { limit = 1 } = {}) {
      // As shipped (retryInterval 10 ms), but with room to wait: 100 waiters take seconds.
      // It has no fair kind: in the fair cell it is its Semaphore as it is.
      const options = { lockTimeout: leaseMs, acquireTimeout: 120000 };
      if (!refresh) options.refreshInterval = 0;
      const lock = Kind === Mutex ? new Mutex(c, name, options) : new Semaphore(c, name, limit, options);
      await lock.acquire();
      const granted = now();
      return { lock, granted, leaseStart: granted };
    },
    async release(c, h) {
      await h.lock.release();
      return now();
    },
  };
}

// `sent`: the commands the contender's clients send themselves (commandstats names, before any
// "|"); every other call the server counts was made inside a Lua script.
const REDSEM_SENT = ["evalsha", "eval", "blpop", "info", "quit", "command", "hello", "select",
  "client", "ping", "sem.acquire", "sem.acquirefair", "sem.release", "sem.refresh"];
const CONTENDERS = {
  scripts: { label: "redsem-client, scripts (no module)", module: false, make: redsemContender,
    sent: REDSEM_SENT },
  "rs-sem": { label: "redis-semaphore Semaphore, polling 10 ms", module: false,
    make: (port) => redisSemaphoreContender(port, Semaphore),
    sent: ["evalsha", "eval", "zrem", "info", "quit", "command", "hello", "select", "client", "ping"] },
  "rs-mutex": { label: "redis-semaphore Mutex, polling 10 ms", module: false,
    make: (port) => redisSemaphoreContender(port, Mutex),
    sent: ["set", "evalsha", "eval", "info", "quit", "command", "hello", "select", "client", "ping"] },
  module: { label: "redsem-client, module (SEM.* WAIT)", module: true, make: redsemContender,
    sent: REDSEM_SENT },
};

// ---------------------------------------------------------------------------------------------
// Cells

/** Starts watching this process's event-loop delay; the returned function stops: max in ms. */
function watchLag() {
  const h = monitorEventLoopDelay({ resolution: 1 });
  h.enable();
  return () => {
    h.disable();
    return h.max / 1e6;
  };
}

function quantile(sorted, q) {
  if (sorted.length === 0) return null;
  const i = Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1));
  return sorted[i];
}

async function withClients(server, contender, count, name) {
  const clients = [];
  for (let i = 0; i < count; i++) {
    const c = contender.client();
    c.on("error", () => {});
    clients.push(c);
  }
  await Promise.all(clients.map((c) => contender.warm(c, name)));
  return clients;
}

async function closeAll(clients) {
  await Promise.all(clients.map((c) => c.quit().catch(() => c.disconnect())));
}

/** N clients: acquire, hold, release, rest, again; lateness from a release to the next grant. */
async function handoffCell(opts, server, contender, n) {
  const name = "bench";
  const clients = await withClients(server, contender, n + 1, name);
  const grants = []; // { t, waitStart }, in the order the grants were seen
  const releases = []; // t
  let failures = 0;
  let stop = false;
  const lease = 10000; // redis-semaphore's default lockTimeout; no refresh falls due in a hold
  const loop = async (c) => {
    while (!stop) {
      const waitStart = now();
      let h;
      try {
        h = await contender.acquire(c, name, lease, true);
      } catch (err) {
        if (failures++ === 0) process.stderr.write(`(${err.message}) `);
        await sleep(10);
        continue;
      }
      grants.push({ t: h.granted, waitStart });
      if (!stop) await sleep(opts.holdMs);
      releases.push(await contender.release(c, h));
      if (!stop) await sleep(opts.restMs);
    }
  };
  const before = await snapshot(server.admin);
  const lagged = watchLag();
  const t0 = now();
  const running = clients.map(loop);
  await sleep(opts.seconds * 1000);
  const after = await snapshot(server.admin);
  const lag = lagged();
  const t1 = now();
  stop = true;
  await Promise.all(running);
  await closeAll(clients);
  // Limit 1: the k-th grant follows the (k-1)-th release.
  releases.sort((a, b) => a - b);
  grants.sort((a, b) => a.t - b.t);
  const late = [];
  for (let k = 1; k < grants.length && k - 1 < releases.length; k++) {
    const r = releases[k - 1];
    const g = grants[k];
    if (r >= t0 && g.t <= t1 && g.waitStart < r) late.push(g.t - r);
  }
  late.sort((a, b) => a - b);
  const seconds = (t1 - t0) / 1000;
  const granted = grants.filter((g) => g.t >= t0 && g.t <= t1).length;
  return { kind: "handoff", n, seconds, server: delta(before, after), granted, late, failures, lag };
}

/** One client holds all along, N clients wait: the cost of waiting while nothing is released. */
async function idleCell(opts, server, contender, n) {
  const name = "bench";
  const [holder, ...clients] = await withClients(server, contender, n + 1, name);
  const held = await contender.acquire(holder, name, 120000, false);
  let failures = 0;
  const waiting = clients.map(async (c) => {
    try {
      const h = await contender.acquire(c, name, 10000, true);
      await contender.release(c, h);
    } catch (err) {
      if (failures++ === 0) process.stderr.write(`(${err.message}) `);
    }
  });
  await sleep(300); // every waiter has sent its first try
  const before = await snapshot(server.admin);
  const lagged = watchLag();
  const t0 = now();
  await sleep(opts.seconds * 1000);
  const after = await snapshot(server.admin);
  const lag = lagged();
  const t1 = now();
  await contender.release(holder, held);
  await Promise.all(waiting);
  await closeAll([holder, ...clients]);
  return { kind: "idle", n, seconds: (t1 - t0) / 1000, server: delta(before, after), granted: 0, late: [], failures, lag };
}

/**
 * First come, first served: --fair-clients clients on a fair semaphore of --fair-limit, each:
 * acquire (waiting), hold --fair-hold-ms, release, again at once. Waits (call to grant), and
 * the grants that overtook a client which had started waiting more than 1 ms before and was
 * granted more than 2 ms after (an order violation).
 */
async function fairCell(opts, server, contender) {
  const name = "{bench}";
  const n = opts.fairClients;
  const clients = await withClients(server, contender, n, name);
  const grants = []; // { w: wait start, g: grant }
  let failures = 0;
  let stop = false;
  const loop = async (c) => {
    while (!stop) {
      const w = now();
      let h;
      try {
        h = await contender.acquire(c, name, 10000, true, { fair: true, limit: opts.fairLimit });
      } catch (err) {
        if (failures++ === 0) process.stderr.write(`(${err.message}) `);
        await sleep(10);
        continue;
      }
      grants.push({ w, g: h.granted });
      if (!stop) await sleep(opts.fairHoldMs);
      await contender.release(c, h);
    }
  };
  const before = await snapshot(server.admin);
  const lagged = watchLag();
  const t0 = now();
  const running = clients.map(loop);
  await sleep(opts.fairSeconds * 1000);
  const after = await snapshot(server.admin);
  const lag = lagged();
  const t1 = now();
  stop = true;
  await Promise.all(running);
  await closeAll(clients);
  // Waits that began after a warm-up of a second (the first arrivals all come at once).
  const counted = grants.filter((x) => x.w >= t0 + 1000 && x.g <= t1);
  const waits = counted.map((x) => x.g - x.w).sort((a, b) => a - b);
  const byStart = grants.slice().sort((a, b) => a.w - b.w);
  let violations = 0;
  let latestBefore = -Infinity; // the latest grant among waits begun > 1 ms before
  let k = 0;
  for (const x of byStart) {
    while (k < byStart.length && byStart[k].w < x.w - 1) latestBefore = Math.max(latestBefore, byStart[k++].g);
    if (x.w >= t0 + 1000 && x.g <= t1 && latestBefore > x.g + 2) violations++;
  }
  const seconds = (t1 - t0) / 1000;
  const granted = grants.filter((x) => x.g >= t0 && x.g <= t1).length;
  return { kind: "fair", n, seconds, server: delta(before, after), granted, late: [], waits, violations,
    failures, lag };
}

/** Holders never release: each lease runs out; lateness from its end to the next grant. */
async function leaseCell(opts, server, contender) {
  const name = "bench";
  const n = opts.leaseWaiters;
  const clients = await withClients(server, contender, n + 1, name);
  const grants = []; // { t, client }
  let stop = false;
  let failures = 0;
  let wakeHolders = () => {};
  let grantSeen = new Promise((resolve) => { wakeHolders = resolve; });
  const noteGrant = (g) => {
    grants.push(g);
    const wake = wakeHolders;
    grantSeen = new Promise((resolve) => { wakeHolders = resolve; });
    wake();
  };
  const loop = async (c, i) => {
    while (!stop) {
      let h;
      try {
        h = await contender.acquire(c, name, opts.leaseMs, false);
      } catch (err) {
        if (failures++ === 0) process.stderr.write(`(${err.message}) `);
        await sleep(10);
        continue;
      }
      noteGrant({ t: h.granted, leaseStart: h.leaseStart, client: i });
      if (stop) {
        await contender.release(c, h).catch(() => {});
        break;
      }
      // Never released: wait until another client is granted (the lease ran out), or the end.
      for (;;) {
        await grantSeen;
        if (stop || grants[grants.length - 1].client !== i) break;
      }
      await contender.release(c, h).catch(() => {}); // answers "not held"; closes its connection
      if (!stop) await sleep(opts.restMs);
    }
  };
  const before = await snapshot(server.admin);
  const lagged = watchLag();
  const t0 = now();
  const running = clients.map(loop);
  await sleep(opts.leaseSeconds * 1000);
  const after = await snapshot(server.admin);
  const lag = lagged();
  const t1 = now();
  stop = true;
  wakeHolders();
  await Promise.all(running);
  await closeAll(clients);
  const late = [];
  for (let k = 1; k < grants.length; k++) {
    const end = grants[k - 1].leaseStart + opts.leaseMs;
    if (end >= t0 && grants[k].t <= t1) late.push(grants[k].t - end);
  }
  late.sort((a, b) => a - b);
  const seconds = (t1 - t0) / 1000;
  const granted = grants.filter((g) => g.t >= t0 && g.t <= t1).length;
  return { kind: "lease", n, seconds, server: delta(before, after), granted, late, failures, lag };
}

/** One contender's runs of a cell as one: counts and times summed, samples pooled. */
function together(runs) {
  const sorted = (xs) => xs.flat().sort((a, b) => a - b);
  const sum = (f) => runs.reduce((t, r) => t + f(r), 0);
  const calls = {};
  for (const r of runs) for (const [name, k] of Object.entries(r.server.calls)) calls[name] = (calls[name] || 0) + k;
  const one = {
    ...runs[0],
    seconds: sum((r) => r.seconds),
    server: { commands: sum((r) => r.server.commands), cpu: sum((r) => r.server.cpu), calls },
    granted: sum((r) => r.granted),
    late: sorted(runs.map((r) => r.late)),
    failures: sum((r) => r.failures),
    lag: Math.max(...runs.map((r) => r.lag)),
  };
  if (one.kind === "fair") {
    one.waits = sorted(runs.map((r) => r.waits));
    one.violations = sum((r) => r.violations);
  }
  return one;
}

async function runCell(opts, key, kind, n) {
  const spec = CONTENDERS[key];
  const server = await startServer(opts, spec.module);
  try {
    const contender = spec.make(server.port);
    if (kind === "handoff") return await handoffCell(opts, server, contender, n);
    if (kind === "idle") return await idleCell(opts, server, contender, n);
    if (kind === "fair") return await fairCell(opts, server, contender);
    return await leaseCell(opts, server, contender);
  } finally {
    await server.stop();
  }
}

// ---------------------------------------------------------------------------------------------
// Report

const fmt = (x, digits = 2) => (x == null || !Number.isFinite(x) ? "—" : x.toFixed(digits));
const fmtN = (x) => (x >= 100 ? x.toFixed(0) : x >= 10 ? x.toFixed(1) : x.toFixed(2));
const ratio = (x, base) => (base > 0 && x != null ? `${fmtN(x / base)}×` : "—");

function figures(r, key) {
  const sentSet = new Set(CONTENDERS[key].sent);
  let sent = 0;
  const sentCalls = [];
  // Every run of redsem's script asks COMMAND INFO SEM.ACQUIRE itself (is the module loaded
  // now?): those are calls in scripts, not sent.
  const scriptRuns = (r.server.calls.evalsha || 0) + (r.server.calls.eval || 0);
  for (const [name, count] of Object.entries(r.server.calls)) {
    const calls = key === "scripts" && name === "command|info" ? Math.max(count - scriptRuns, 0) : count;
    if (calls > 0 && sentSet.has(name.split("|")[0])) {
      sent += calls;
      sentCalls.push([name, calls]);
    }
  }
  const inScripts = r.server.commands - sent;
  // Calls per grant (idle cells: per waiter per second).
  const unit = r.kind === "idle" ? r.seconds * r.n : r.granted;
  sentCalls.sort((a, b) => b[1] - a[1]);
  let breakdown = "";
  if (unit > 0) {
    breakdown = sentCalls.map(([c, k]) => `${c} ${fmtN(k / unit)}`).join(", ");
    if (inScripts > 0) breakdown += `; in scripts ${fmtN(inScripts / unit)}`;
  }
  const perGrant = (x) => (r.granted > 0 ? x / r.granted : null);
  return {
    grantsPerSec: r.granted / r.seconds,
    median: quantile(r.late, 0.5),
    p99: quantile(r.late, 0.99),
    samples: r.late.length,
    sentPerWaiter: sent / r.seconds / r.n,
    allPerWaiter: r.server.commands / r.seconds / r.n,
    sentPerGrant: perGrant(sent),
    allPerGrant: perGrant(r.server.commands),
    cpu: (100 * r.server.cpu) / r.seconds,
    cpuPerGrant: perGrant(r.server.cpu * 1e6),
    lag: r.lag,
    breakdown,
  };
}

function report(opts, results, command) {
  const lines = [];
  const cellTitle = {
    handoff: (n) => `hand-off, N = ${n}`,
    idle: (n) => `N = ${n}`,
    lease: (n) => `lease runs out, N = ${n}`,
  };
  lines.push("# Waiting without the module: server cost and lateness");
  lines.push("");
  lines.push("```sh");
  lines.push(command);
  lines.push("```");
  lines.push("");
  lines.push(`Limit-1 semaphore; a fresh Debian redis-server ${results.version} per cell and ` +
    `round, the contenders of a cell in turn, ${opts.rounds} round${opts.rounds > 1 ? "s" : ""} ` +
    "(each contender's figures are of its rounds together). " +
    `**hand-off**: N + 1 clients (N wait at each release), each acquire (waiting) → hold ` +
    `${opts.holdMs} ms → release → rest ${opts.restMs} ms → again, for ${opts.seconds} s; ` +
    `**lease runs out**: N + 1 clients, each holder lets its ${opts.leaseMs} ms lease run out ` +
    `(no refresh, no release), ${opts.leaseSeconds} s; **idle**: one client holds all along, ` +
    `N wait, ${opts.seconds} s. Leases of 10 s but in the lease cell. redis-semaphore ` +
    `${results.rsVersion} as shipped: retryInterval 10 ms (its default); redsem-client from ` +
    "`npm pack clients/node`, over ioredis (defaults).");
  lines.push("");
  lines.push("- **late**: ms from the holder's release reply (lease runs out: its grant reply, " +
    "or the reply of the refresh that confirmed it, + the lease) to the next grant reply, to a " +
    "client that was waiting then, on this process's monotonic clock: median and p99 over `n` " +
    "hand-offs (negative: the grant's reply was read first; both left in one server event).");
  lines.push("- **sent**: commands the clients sent; **all**: INFO total_commands_processed " +
    "(less the benchmark's own INFO), which also counts each call a Lua script makes; " +
    "**/s/waiter**: per second / N; **CPU**: the server's used_cpu_sys + used_cpu_user (µs per " +
    "grant, or % of a core). (×) = ratio to the module's WAIT in the same cell (— where WAIT's " +
    "is 0).");
  lines.push("- **by command**: calls per grant (idle: per waiter per second) of the commands " +
    "sent, and of the calls made inside scripts. **lag max**: this process's longest " +
    "event-loop stall (ms) in the cell: a large one means the machine's load stalled the " +
    "client, and a p99 or a grants/s then says more about the load than the contender.");
  lines.push("");
  const ratioOf = (row, bf, v, b) => (row.key === "module" || !bf ? "" : ` (${ratio(v, b)})`);
  lines.push("| cell | contender | grants/s | late median | late p99 | n | sent/s/waiter | all/s/waiter | sent/grant | all/grant | CPU µs/grant | by command | lag max |");
  lines.push("|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|--:|");
  for (const cell of results.cells.filter((c) => c.kind !== "idle" && c.kind !== "fair")) {
    const base = cell.rows.find((row) => row.key === "module");
    const bf = base ? figures(base.result, "module") : null;
    for (const row of cell.rows) {
      const f = figures(row.result, row.key);
      const x = (v, b) => ratioOf(row, bf, v, b);
      const fail = row.result.failures ? ` (${row.result.failures} acquires failed)` : "";
      lines.push(`| ${cellTitle[cell.kind](cell.n)} | ${CONTENDERS[row.key].label}${fail} | ` +
        `${fmt(f.grantsPerSec, 1)} | ${fmt(f.median)} | ${fmt(f.p99)} | ${f.samples} | ` +
        `${fmt(f.sentPerWaiter, 1)}${x(f.sentPerWaiter, bf && bf.sentPerWaiter)} | ` +
        `${fmt(f.allPerWaiter, 1)}${x(f.allPerWaiter, bf && bf.allPerWaiter)} | ` +
        `${fmt(f.sentPerGrant, 1)}${x(f.sentPerGrant, bf && bf.sentPerGrant)} | ` +
        `${fmt(f.allPerGrant, 1)}${x(f.allPerGrant, bf && bf.allPerGrant)} | ` +
        `${fmt(f.cpuPerGrant, 0)}${x(f.cpuPerGrant, bf && bf.cpuPerGrant)} | ` +
        `${f.breakdown} | ${fmt(f.lag, 0)} |`);
    }
  }
  const idle = results.cells.filter((c) => c.kind === "idle");
  if (idle.length) {
    lines.push("");
    lines.push("While nothing is released (idle: one client holds all along):");
    lines.push("");
    lines.push("| waiting | contender | sent/s/waiter | all/s/waiter | server CPU % | by command | lag max |");
    lines.push("|---|---|--:|--:|--:|---|--:|");
    for (const cell of idle) {
      const base = cell.rows.find((row) => row.key === "module");
      const bf = base ? figures(base.result, "module") : null;
      for (const row of cell.rows) {
        const f = figures(row.result, row.key);
        const x = (v, b) => ratioOf(row, bf, v, b);
        const fail = row.result.failures ? ` (${row.result.failures} acquires failed)` : "";
        lines.push(`| ${cellTitle.idle(cell.n)} | ${CONTENDERS[row.key].label}${fail} | ` +
          `${fmt(f.sentPerWaiter)}${x(f.sentPerWaiter, bf && bf.sentPerWaiter)} | ` +
          `${fmt(f.allPerWaiter)}${x(f.allPerWaiter, bf && bf.allPerWaiter)} | ` +
          `${fmt(f.cpu, 1)}${x(f.cpu, bf && bf.cpu)} | ${f.breakdown} | ${fmt(f.lag, 0)} |`);
      }
    }
  }
  const fair = results.cells.filter((c) => c.kind === "fair");
  if (fair.length) {
    lines.push("");
    lines.push(`First come, first served: ${opts.fairClients} clients on a fair semaphore of limit ` +
      `${opts.fairLimit} (redis-semaphore: its Semaphore, which has no fair kind), each acquire ` +
      `(waiting) → hold ${opts.fairHoldMs} ms → release → again, ${opts.fairSeconds} s; **wait**: ` +
      "from the call to the grant reply, over the waits begun after the first second; " +
      "**overtaken**: grants to a client that began waiting more than 1 ms after another client " +
      "still waiting, which was granted more than 2 ms later.");
    lines.push("");
    lines.push("| contender | grants/s | wait p50 | wait p99 | wait max | n | overtaken | sent/grant | all/grant | CPU µs/grant | by command | lag max |");
    lines.push("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|--:|");
    for (const cell of fair) {
      const base = cell.rows.find((row) => row.key === "module");
      const bf = base ? figures(base.result, "module") : null;
      const bw = base ? base.result.waits : [];
      for (const row of cell.rows) {
        const f = figures(row.result, row.key);
        const w = row.result.waits;
        const x = (v, b) => ratioOf(row, bf, v, b);
        const fail = row.result.failures ? ` (${row.result.failures} acquires failed)` : "";
        lines.push(`| ${CONTENDERS[row.key].label}${fail} | ${fmt(f.grantsPerSec, 1)} | ` +
          `${fmt(quantile(w, 0.5), 0)}${x(quantile(w, 0.5), quantile(bw, 0.5))} | ` +
          `${fmt(quantile(w, 0.99), 0)}${x(quantile(w, 0.99), quantile(bw, 0.99))} | ` +
          `${fmt(w[w.length - 1], 0)}${x(w[w.length - 1], bw[bw.length - 1])} | ${w.length} | ` +
          `${row.result.violations} | ` +
          `${fmt(f.sentPerGrant, 1)}${x(f.sentPerGrant, bf && bf.sentPerGrant)} | ` +
          `${fmt(f.allPerGrant, 1)}${x(f.allPerGrant, bf && bf.allPerGrant)} | ` +
          `${fmt(f.cpuPerGrant, 0)}${x(f.cpuPerGrant, bf && bf.cpuPerGrant)} | ` +
          `${f.breakdown} | ${fmt(f.lag, 0)} |`);
      }
    }
  }
  lines.push("");
  return lines.join("\n");
}

// ---------------------------------------------------------------------------------------------

async function main() {
  const opts = parseArgs(process.argv.slice(2));
  const command = opts.command || ["node", ...process.argv.slice(1).map((a) => path.relative(process.cwd(), a) || a)].join(" ");
  const plan = [];
  if (opts.cells.includes("handoff")) for (const n of opts.clients) plan.push({ kind: "handoff", n });
  if (opts.cells.includes("idle")) for (const n of opts.clients) plan.push({ kind: "idle", n });
  if (opts.cells.includes("lease")) plan.push({ kind: "lease", n: opts.leaseWaiters });
  if (opts.cells.includes("fair")) plan.push({ kind: "fair", n: opts.fairClients });
  const results = { cells: [], version: "", rsVersion: require("redis-semaphore/package.json").version };
  for (const cell of plan) {
    const runs = new Map(opts.contenders.map((key) => [key, []]));
    // The contenders of a cell in turn, round after round, so that a spell of load on the shared
    // machine falls on each of them alike, and their ratios come from the same minutes.
    for (let round = 1; round <= opts.rounds; round++) {
      for (const key of opts.contenders) {
        process.stderr.write(`${cell.kind} N=${cell.n} ${key} (round ${round}) ... `);
        const result = await runCell(opts, key, cell.kind, cell.n);
        const f = figures(result, key);
        process.stderr.write(`${fmt(f.grantsPerSec, 1)} grants/s, late ${fmt(f.median)}/${fmt(f.p99)} ms, ` +
          `${fmt(f.sentPerWaiter)} sent/s/waiter, ${fmt(f.allPerWaiter)} all/s/waiter, CPU ${fmt(f.cpu, 1)}%\n`);
        runs.get(key).push(result);
      }
    }
    results.cells.push({ ...cell, rows: opts.contenders.map((key) => ({ key, result: together(runs.get(key)) })) });
  }
  const version = /v=([\d.]+)/.exec(require("node:child_process").execFileSync(opts.server, ["--version"]).toString());
  results.version = version ? version[1] : "";
  const text = report(opts, results, command);
  process.stdout.write(text);
  if (opts.out) {
    fs.mkdirSync(path.dirname(opts.out), { recursive: true });
    fs.writeFileSync(opts.out, text);
  }
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
