"use strict";
// Permits of a redsem semaphore (the Redis module `sem`) for ioredis 5 or node-redis 4 and 5
// (the `redis` package), plain or Redis Cluster clients (ioredis's Cluster, node-redis 5's
// createCluster), CommonJS, Node 18+. The package redsem-client; types in redsem.d.ts.
//
//   const { withPermit } = require("redsem-client");
//   await withPermit(redis, "jobs", { limit: 3, lease: 30, wait: 10 }, async (permit) => {
//     // at most 3 holders here; permit.signal aborts if the permit is lost
//   });
//
// The identifier is made here (a UUID v4) unless `id` gives one, so when the client resends an
// acquire after a reconnection it renews the same holder rather than taking a second permit.
//
// Without the module (a managed Redis that loads none), the same operations run as the Lua
// script redsem.lua (a copy shipped beside this file) over the very keys the module keeps: each
// client object asks the server (COMMAND INFO SEM.ACQUIRE) and remembers, asking again every 10 s
// while the answer is no; the script itself says when the module has been loaded. BOUND, sets
// and waitEmpty need the module and reject with ModuleRequired before anything is sent.
//
// A call that blocks (a wait, waitEmpty) takes a connection from a small pool per client (per
// node in Cluster) and gives it back after, so waiting opens no connection per wait.
//
// Through a cluster client every call goes to the primary serving the name's slot, in the long
// form, and is resent through moves and failovers (see "Redis Cluster" below).

const { createHash, randomUUID } = require("node:crypto");
const fs = require("node:fs");
const path = require("node:path");
const { performance } = require("node:perf_hooks");

class SemaphoreError extends Error {
  get name() {
    return this.constructor.name;
  }
}

/** No permit was granted: the semaphore was full (for `wait` seconds, when waiting). */
class NotAcquired extends SemaphoreError {}

/**
 * The permit ran out before it was given back (its lease ended, or another client removed it):
 * from then on another holder may have held it, so the work it guarded may have overlapped.
 */
class PermitLost extends SemaphoreError {}

/** Fewer replicas than `durableReplicas` acknowledged the grant in time; it was given back. */
class NotDurable extends SemaphoreError {
  constructor(message, acked, wanted) {
    super(message);
    this.acked = acked;
    this.wanted = wanted;
  }
}

/**
 * The server has no redsem module, and what was asked needs it (BOUND, a set of semaphores,
 * waitEmpty, any call through an ioredis client with a keyPrefix): nothing was sent.
 */
class ModuleRequired extends SemaphoreError {}

function moduleRequired(what) {
  return new ModuleRequired(`${what} needs the redsem module loaded in the server`);
}

/** Seconds as the module reads them: digits and up to 3 decimals. */
function seconds(value) {
  let ms = Math.round(value * 1000);
  if (ms === 0 && value > 0) ms = 1; // a positive time never rounds down to "no time"
  return `${Math.floor(ms / 1000)}.${String(ms % 1000).padStart(3, "0")}`;
}

/**
 * How long a call through a cluster client keeps trying through moves and failovers, in
 * seconds, unless its retryFor says otherwise.
 */
const RETRY_BUDGET = 30;

/**
 * `value` is a number of seconds (a number, not a string or a boolean): finite (`infinite`:
 * or Infinity), above 0 (`positive`) or at least 0; otherwise a TypeError naming `what`,
 * before anything is sent.
 */
function checkSeconds(what, value, { positive, infinite }) {
  const ok =
    typeof value === "number" &&
    !Number.isNaN(value) &&
    (infinite || Number.isFinite(value)) &&
    (positive ? value > 0 : value >= 0);
  if (!ok) {
    const kind = positive ? "greater than 0" : "of at least 0";
    const more = infinite ? " (Infinity: no limit)" : "";
    throw new TypeError(
      `${what} must be a finite number of seconds ${kind}${more}, not ${String(value)}`,
    );
  }
}

/** `value` is an integer (a number) of at least `least`; otherwise a TypeError naming `what`. */
function checkInteger(what, value, least) {
  if (!Number.isInteger(value) || value < least) {
    throw new TypeError(`${what} must be an integer of at least ${least}, not ${String(value)}`);
  }
}

/**
 * `signal` is an AbortSignal (or null); otherwise a TypeError. It cancels a waiting acquire:
 * the promise rejects with its reason, as fetch does, and a grant made meanwhile is given back.
 */
function checkSignal(signal) {
  if (signal == null) return;
  if (typeof signal.aborted !== "boolean" || typeof signal.addEventListener !== "function") {
    throw new TypeError(`signal must be an AbortSignal, not ${String(signal)}`);
  }
}

/**
 * `promise` of a call under way, or the signal's reason as soon as `signal` aborts, after
 * `cancel()` ended the call (closed its connection: a blocked command ends in the server).
 */
function abortable(promise, signal, cancel) {
  if (!signal) return promise;
  return new Promise((resolve, reject) => {
    const onAbort = () => {
      cancel();
      reject(signal.reason);
    };
    if (signal.aborted) {
      onAbort();
      promise.catch(() => {});
      return;
    }
    signal.addEventListener("abort", onAbort, { once: true });
    promise.then(
      (value) => {
        signal.removeEventListener("abort", onAbort);
        resolve(value);
      },
      (err) => {
        signal.removeEventListener("abort", onAbort);
        reject(err);
      },
    );
  });
}

function checkRetryBudget(budget) {
  checkSeconds("retryFor", budget, { positive: false, infinite: false });
}

/** The options of the calls that take no permit: only retryFor (Redis Cluster). */
function callOptions(options) {
  const opts = { retryFor: RETRY_BUDGET, ...options };
  checkRetryBudget(opts.retryFor);
  return opts;
}

function checkOptions(name, options) {
  const opts = {
    lease: 30,
    wait: null,
    fair: false,
    count: null,
    bound: false,
    id: null,
    durableReplicas: 0,
    durableTimeoutMs: 1000,
    autoRefresh: true,
    retryFor: RETRY_BUDGET,
    signal: null,
    ...options,
  };
  if (!name) throw new TypeError("the semaphore name must not be empty");
  checkInteger("limit", opts.limit, 1);
  checkSeconds("lease", opts.lease, { positive: true, infinite: false });
  if (opts.wait != null) checkSeconds("wait", opts.wait, { positive: false, infinite: true });
  if (opts.count != null) checkInteger("count", opts.count, 1);
  checkInteger("durableReplicas", opts.durableReplicas, 0);
  checkInteger("durableTimeoutMs", opts.durableTimeoutMs, 0);
  if (opts.id != null && opts.id.length === 0) {
    throw new TypeError("the identifier must not be empty");
  }
  checkRetryBudget(opts.retryFor);
  checkSignal(opts.signal);
  return opts;
}

function acquireArgs(name, opts, id) {
  const args = [name, opts.limit, seconds(opts.lease), "ID", id];
  if (opts.count != null) args.push("COUNT", opts.count);
  if (opts.fair) args.push("WITHTICKET");
  if (opts.wait) args.push("WAIT", opts.wait === Infinity ? "0" : seconds(opts.wait));
  if (opts.bound) args.push("BOUND");
  return [opts.fair ? "SEM.ACQUIREFAIR" : "SEM.ACQUIRE", ...args];
}

/**
 * What a permit does with a connection (send a command, open a connection of its own, close
 * it, drop it) and what the pool asks of one (is it open, hold the process for it, its end),
 * over either client library.
 */
function adapt(redis) {
  if (redis && typeof redis.call === "function" && typeof redis.duplicate === "function") {
    return {
      raw: redis,
      call: (...args) => redis.call(...args),
      // ioredis connects a duplicate by itself, and queues commands until it has.
      duplicate: async (override) => adapt(redis.duplicate(override)),
      close: () => redis.quit().catch(() => redis.disconnect()),
      destroy: () => redis.disconnect(),
      alive: () => redis.status !== "end",
      // An idle pooled connection does not keep the process alive.
      hold: (on) => {
        const stream = redis.stream;
        if (!stream || typeof stream.ref !== "function") return;
        if (on) stream.ref();
        else stream.unref();
      },
      quiet: () => redis.on("error", () => {}), // its commands report what goes wrong
      onEnd: (fn) => typeof redis.once === "function" && redis.once("end", fn),
      // The connection closed (ioredis reconnects, and resends what had no answer).
      onLost: (fn) => {
        redis.on("close", fn);
        return () => redis.removeListener("close", fn);
      },
      commandTimeout: redis.options && redis.options.commandTimeout,
      // ioredis prefixes the keys of the commands it knows (EVALSHA's, BLPOP's), not the names
      // passed to the module's commands.
      keyPrefix: redis.options && redis.options.keyPrefix,
    };
  }
  if (redis && typeof redis.sendCommand === "function" && typeof redis.duplicate === "function") {
    const destroy = () => {
      try {
        const ended = typeof redis.destroy === "function" ? redis.destroy() : redis.disconnect();
        Promise.resolve(ended).catch(() => {});
      } catch {
        // node-redis 5 throws when the socket has closed already: nothing is left to end.
      }
    };
    return {
      raw: redis,
      // node-redis sends strings and buffers only.
      call: (...args) =>
        redis.sendCommand(args.map((arg) => (Buffer.isBuffer(arg) ? arg : String(arg)))),
      duplicate: async () => {
        const own = redis.duplicate();
        // An 'error' event without a listener would end the process; the permit learns of
        // errors from its commands, and node-redis reconnects by itself.
        own.on("error", () => {});
        await own.connect();
        return adapt(own);
      },
      // node-redis 5 has close() and destroy(); 4 has quit() and disconnect().
      close: async () => {
        try {
          await (typeof redis.close === "function" ? redis.close() : redis.quit());
        } catch {
          destroy();
        }
      },
      destroy,
      alive: () => redis.isOpen !== false,
      hold: (on) => {
        try {
          if (on) redis.ref();
          else redis.unref();
        } catch {
          // node-redis 4 without a socket yet: nothing to hold.
        }
      },
      quiet: () => {},
      onEnd: (fn) => typeof redis.once === "function" && redis.once("end", fn),
      // The socket closed (node-redis rejects what had no answer, and reconnects).
      onLost: (fn) => {
        redis.on("reconnecting", fn);
        return () => redis.removeListener("reconnecting", fn);
      },
      commandTimeout: undefined,
    };
  }
  throw new TypeError("redis must be an ioredis client or a connected node-redis client");
}

/**
 * The script's two texts and their SHA-1s, from redsem.lua beside this file (a copy of the
 * repository's clients/scripts/redsem.lua, the one source): `oom`, the file as it is (its first
 * line `#!lua flags=allow-oom`: it runs when memory is full, for refreshes, releases and waiters
 * already in line), and `acq`, the same with that line `#!lua` (the server refuses it at
 * maxmemory with its own OOM error, as SEM.ACQUIRE), for an acquire's first attempt. Read once.
 */
let script = null;

const OOM_LINE = "#!lua flags=allow-oom";

function loadScript() {
  if (script) return script;
  const place = path.join(__dirname, "redsem.lua");
  let source;
  try {
    source = fs.readFileSync(place);
  } catch (err) {
    if (err.code === "ENOENT") throw new Error(`redsem-client: its script ${place} is missing`);
    throw err;
  }
  if (!source.subarray(0, OOM_LINE.length).equals(Buffer.from(OOM_LINE))) {
    throw new Error(`redsem-client: ${place} does not start with ${OOM_LINE}`);
  }
  const acq = Buffer.concat([Buffer.from("#!lua"), source.subarray(OOM_LINE.length)]);
  const text = (body) => ({ source: body, sha: createHash("sha1").update(body).digest("hex") });
  script = { oom: text(source), acq: text(acq) };
  return script;
}

/** How old a "no module" answer may be before it is asked again: the module may be loaded. */
const RECHECK_MODULE_MS = 10000;

/**
 * The server's answer to "is the module loaded?", per client object: { known: a promise of a
 * boolean, at: when asked }.
 */
const backends = new WeakMap();

/** COMMAND INFO SEM.ACQUIRE answers [nil] for a command the server does not know. */
function askModule(conn) {
  return Promise.resolve(conn.call("COMMAND", "INFO", "SEM.ACQUIRE")).then(
    (reply) => Array.isArray(reply) && reply.length > 0 && reply[0] != null,
  );
}

/**
 * An answer remembered in `map` under `key`: asked again when it failed, or when it was "no"
 * and is older than RECHECK_MODULE_MS (the module may have been loaded since).
 */
function remembered(map, key, ask) {
  const entry = map.get(key);
  if (entry && !(entry.no && performance.now() - entry.at > RECHECK_MODULE_MS)) return entry.known;
  const fresh = { known: ask(), at: performance.now(), no: false };
  map.set(key, fresh);
  fresh.known.then(
    (yes) => (fresh.no = !yes),
    () => {
      if (map.get(key) === fresh) map.delete(key);
    },
  );
  return fresh.known;
}

/** The module is loaded (the script said so): `key` of `map` uses it from now on. */
function rememberModule(map, key) {
  map.set(key, { known: Promise.resolve(true), at: performance.now(), no: false });
}

/**
 * Finds out whether the client's server has the module (asked once per client object, again
 * after RECHECK_MODULE_MS while the answer is no) and marks the adapter: `module` true or false.
 */
async function detect(conn) {
  if (conn.module !== undefined) return conn;
  conn.module = await remembered(backends, conn.raw, () => askModule(conn));
  if (!conn.module && conn.keyPrefix) {
    // The script's keys would be prefixed where the module's names are not: other keys.
    throw moduleRequired("an ioredis keyPrefix");
  }
  return conn;
}

/** The module's commands the script runs (as its OP, without the SEM. prefix). */
const SCRIPTED = new Set([
  "SEM.ACQUIRE",
  "SEM.ACQUIREFAIR",
  "SEM.REFRESH",
  "SEM.RELEASE",
  "SEM.GET",
  "SEM.LIMIT",
]);

/**
 * Sends a command of the module, `[SEM.X, name, ...args]`, on a detected connection: as it is
 * with the module, else as the script's op X over the semaphore's keys (the allow-oom text:
 * acquires go through scriptAcquire).
 */
function semCall(conn, args) {
  if (conn.cluster) return conn.sem(args);
  if (conn.module) return conn.call(...args);
  const command = String(args[0]).toUpperCase();
  if (!SCRIPTED.has(command)) return Promise.reject(moduleRequired(command));
  return runScript(conn, args[1], [command.slice("SEM.".length), ...args.slice(2)]);
}

/** The keys of a semaphore besides its name, in the order the script takes them. */
const KEY_SUFFIXES = ["owner", "counter", "permits", "limit", "wake"];

/**
 * EVALSHA of the script over the six keys of `name` (`first`: the text refused at maxmemory,
 * for an acquire's first attempt; else the allow-oom one); EVAL of that text on NOSCRIPT.
 */
async function runScript(conn, name, opArgs, first = false) {
  const { source, sha } = loadScript()[first ? "acq" : "oom"];
  const keys = [name, ...KEY_SUFFIXES.map((suffix) => `${name}:${suffix}`)];
  try {
    return await conn.call("EVALSHA", sha, keys.length, ...keys, ...opArgs);
  } catch (err) {
    if (!(err && typeof err.message === "string" && err.message.startsWith("NOSCRIPT"))) throw err;
  }
  return conn.call("EVAL", source, keys.length, ...keys, ...opArgs);
}

/** The longest a waiter without the module blocks before it tries again (renewing its place). */
const NUDGE_MS = 2500;

/** How much later than a lease's end a first waiter asks the server to serve the line (TICK). */
const TICK_AFTER_MS = 2;

/** A grant the script told a waiter (`G`, `G<ticket>`), or its error (`E<error>`). */
function granted(message, opts, id) {
  if (message.startsWith("E")) throw new Error(message.slice(1)); // the server's error
  return opts.fair ? [id, message.slice(1)] : id;
}

/**
 * SEM.ACQUIRE / SEM.ACQUIREFAIR through the script, waiting as the module would. A waiter
 * takes a place in the script's line (LINE) and blocks on its own list `<name>:wake:<id>` on a
 * pooled connection, where the script tells it of its grant (G), of the grant's error (E), that
 * a lease ends soon (H<ms>: TICK then) or that the module is loaded (M); it tries again at least
 * every NUDGE_MS (which renews its place), and leaves the line when its time is up. The first in
 * line asks the server to serve the line (TICK) right after the next lease ends, as the
 * server's own timer at hz 10 would be late. `way` says where each call goes: script(opArgs,
 * first), tick(), blpop(key, ms), clear(key). Resolves with { reply, sent } (reply null: not
 * granted; sent: when the last try before the grant was sent, before the lease started), or
 * with { module: true, reply, sent, left } when the server has the module now (left: seconds
 * of the wait left, null when none).
 */
async function scriptAcquire(way, name, opts, id) {
  const args = [opts.fair ? "ACQUIREFAIR" : "ACQUIRE", opts.limit, seconds(opts.lease), "ID", id];
  if (opts.count != null) args.push("COUNT", opts.count);
  if (opts.fair) args.push("WITHTICKET");
  const waiting = Boolean(opts.wait);
  if (waiting) args.push("LINE");
  const end = waiting ? performance.now() + opts.wait * 1000 : 0; // Infinity: no end
  const leftSeconds = () => {
    const left = (end - performance.now()) / 1000;
    return left > 0 ? left : null;
  };
  const key = `${name}:wake:${id}`;
  let first = true;
  let inLine = false;
  let sent;
  try {
    for (;;) {
      sent = performance.now();
      const [reply, retry, ahead] = await way.script(args, first);
      first = false;
      if (Number(ahead) === -1) {
        inLine = false; // the script gave up its line for the module
        return { module: true, reply, sent, left: waiting ? leftSeconds() : null };
      }
      if (reply != null && inLine) {
        // Granted by this try while in line: a grant told on the list meanwhile (the try only
        // renewed it) would be taken by a later wait with this id as its own.
        inLine = false;
        await way.clear(key).catch(() => {}); // best effort: the grant is held
      }
      if (reply != null || !waiting) return { reply, sent };
      inLine = true;
      let retryMs = Number(retry);
      let atHead = Number(ahead) === 0;
      let message;
      // Block; told H<ms> (first in line, a lease ends in ms), block again with a TICK then,
      // while the last try keeps the place (held 6 s from it: the next comes within NUDGE_MS).
      for (;;) {
        const left = end - performance.now();
        if (!(left > 0)) {
          inLine = false;
          const kept = await way.script(["LEAVE", id], false);
          // A grant made before it left is held: it is the caller's.
          return { reply: kept == null ? null : granted(String(kept), opts, id), sent };
        }
        const blockMs = Math.min(left, NUDGE_MS);
        const tickMs = atHead && retryMs > 0 && retryMs < blockMs ? retryMs : 0;
        message = await blockFor(way, key, blockMs, tickMs);
        const nudge = message != null && /^H\d+$/.test(message) ? Number(message.slice(1)) : 0;
        if (!(nudge > 0 && performance.now() - sent < NUDGE_MS)) break;
        retryMs = nudge;
        atHead = true;
      }
      if (message == null || message.startsWith("H")) continue; // try again now
      if (message === "M") {
        inLine = false;
        return { module: true, reply: null, sent, left: leftSeconds() };
      }
      if (message.startsWith("G") || message.startsWith("E")) {
        inLine = false;
        return { reply: granted(message, opts, id), sent };
      }
    }
  } catch (err) {
    if (inLine) await leaveLine(way, id);
    throw err;
  }
}

/**
 * BLPOP on the waiter's list for `blockMs`; meanwhile, when `tickMs`, TICK on another
 * connection at that lease end (and again at the next one it answers) while it blocks.
 */
async function blockFor(way, key, blockMs, tickMs) {
  let pending = true;
  let timer = null;
  const arm = (ms) => {
    timer = setTimeout(() => {
      timer = null;
      if (!pending) return;
      Promise.resolve(way.tick()).then(
        (next) => {
          if (pending && Number(next) > 0) arm(Number(next));
        },
        () => {}, // the next try learns of it
      );
    }, ms + TICK_AFTER_MS);
  };
  if (tickMs) arm(tickMs);
  try {
    return await way.blpop(key, blockMs);
  } finally {
    pending = false;
    clearTimeout(timer);
  }
}

/**
 * A waiter that will not come back leaves the line, best effort; a grant made to it meanwhile
 * is given back, as its caller never sees it.
 */
async function leaveLine(way, id) {
  try {
    const message = await way.script(["LEAVE", id], false);
    if (message != null && String(message).startsWith("G")) {
      await way.script(["RELEASE", id], false);
    }
  } catch {
    // Its place runs out by itself (PLACE_MS) and its grant's lease ends.
  }
}

/** A BLPOP's message (the list's element), or null at its timeout. */
function popped(reply) {
  return reply == null ? null : String(reply[1]);
}

/**
 * How much longer than the server's block a blocking call may take before its connection is
 * taken for dead (and closed).
 */
const BLOCK_GRACE_MS = 5000;

/** `promise` of a call on `conn`, or its connection closed and a rejection after `ms`. */
function guarded(promise, ms, conn) {
  if (!Number.isFinite(ms)) return promise;
  let timer;
  const late = new Promise((resolve, reject) => {
    timer = setTimeout(() => {
      conn.destroy();
      const err = new Error(`Command timed out: no answer within ${Math.round(ms)} ms`);
      err.redsemNodeGone = true; // through a cluster: try again
      reject(err);
    }, ms);
  });
  return Promise.race([promise, late]).finally(() => clearTimeout(timer));
}

/**
 * Where the calls of a plain (not cluster) client's waiting acquire go: the script on `conn`
 * (the client's connection, or the permit's own), TICK on the client's, BLPOP on a pooled one.
 */
function standaloneWay(client, conn, name, signal) {
  return {
    script: (opArgs, first) => runScript(conn, name, opArgs, first),
    tick: () => runScript(client, name, ["TICK"]),
    clear: (key) => client.call("DEL", key),
    blpop: async (key, ms) => {
      const pool = poolOf(client);
      const blocking = await pool.take();
      let reply;
      try {
        const call = blocking.call("BLPOP", key, seconds(ms / 1000));
        const guard = guarded(call, ms + BLOCK_GRACE_MS, blocking);
        reply = await abortable(guard, signal, () => blocking.destroy());
      } catch (err) {
        blocking.destroy(); // interrupted mid-block: never reused
        // Another client ended the block (CLIENT UNBLOCK <id> ERROR): try again now.
        if (isUnblocked(err)) return null;
        throw err;
      }
      pool.give(blocking);
      return popped(reply);
    },
  };
}

// ---------------------------------------------------------------------------------------------
// The pool: connections that block (a waiting acquire's WAIT, a waiter's BLPOP, SEM.WAITEMPTY),
// taken for one wait and given back after it, so waiting opens no connection per wait. A
// connection whose call did not finish (interrupted mid-block) is closed instead. Idle ones
// do not keep the process alive, and close with their client.

/** The idle connections a pool keeps, unless setPoolSize says otherwise. */
const POOL_SIZE = 8;

/** The pool size set for a client object (setPoolSize). */
const poolSizes = new WeakMap();

class Pool {
  /** `open()` makes a connection; `serving()` is false once the client has closed. */
  constructor(raw, open, serving = () => true) {
    this.raw = raw;
    this.open = open;
    this.serving = serving;
    this.idle = [];
  }

  get size() {
    const size = poolSizes.get(this.raw);
    return size == null ? POOL_SIZE : size;
  }

  /** An idle connection that is still open, else a new one. */
  async take() {
    while (this.idle.length > 0) {
      const conn = this.idle.pop();
      if (conn.alive()) {
        conn.hold(true);
        return conn;
      }
      conn.destroy();
    }
    return this.open();
  }

  /** A connection back after a finished call: kept idle, or closed when the pool is full. */
  give(conn) {
    if (this.idle.length >= this.size || !conn.alive() || !this.serving()) {
      Promise.resolve(conn.close()).catch(() => {});
      return;
    }
    conn.hold(false);
    this.idle.push(conn);
  }

  /** The client closed: so do the idle connections. */
  drain() {
    for (const conn of this.idle.splice(0)) Promise.resolve(conn.close()).catch(() => {});
  }
}

/** The pool of a plain client object (made at its first wait). */
const pools = new WeakMap();

function poolOf(client) {
  let pool = pools.get(client.raw);
  if (!pool) {
    const open = async () => {
      const conn = await ownConnection(client, Infinity);
      conn.quiet();
      return conn;
    };
    pool = new Pool(client.raw, open, () => client.alive());
    pools.set(client.raw, pool);
    client.onEnd(() => pool.drain());
  }
  return pool;
}

/**
 * Sets how many idle blocking connections the package keeps for `redis` (a client, or a
 * cluster client: per node), reused by waiting acquires; 0 keeps none. Default POOL_SIZE.
 */
function setPoolSize(redis, size) {
  if (!Number.isInteger(size) || size < 0) {
    throw new TypeError(`the pool size must be an integer of at least 0, not ${String(size)}`);
  }
  if (!redis || typeof redis !== "object") throw new TypeError("redis must be a client object");
  poolSizes.set(redis, size);
  const pool = pools.get(redis);
  if (pool) {
    for (const conn of pool.idle.splice(size)) Promise.resolve(conn.close()).catch(() => {});
  }
  const cluster = clusters.get(redis);
  if (cluster) {
    for (const nodePool of cluster.pools.values()) {
      for (const conn of nodePool.idle.splice(size)) Promise.resolve(conn.close()).catch(() => {});
    }
  }
}

/**
 * A module command that may wait `wait` seconds in the server (`build(wait)` makes it) on a
 * plain client: on a pooled connection (given back after), or on `conn` when it is the
 * permit's own. Resolves with its reply and when it was sent.
 */
async function standaloneWaiting(client, conn, own, wait, build, blocks, signal) {
  const end = wait ? performance.now() + wait * 1000 : null; // Infinity: no end
  let left = wait;
  for (;;) {
    try {
      return await standaloneOnce(client, conn, own, left, build, blocks, signal);
    } catch (err) {
      // Another client ended the wait (CLIENT UNBLOCK <id> ERROR, as a failover does): wait
      // again for what is left of it, or try once more when nothing is.
      if (!(blocks && end !== null && isUnblocked(err))) throw err;
      if (signal && signal.aborted) throw signal.reason;
      if (end !== Infinity) {
        const seconds = (end - performance.now()) / 1000;
        left = seconds > 0 ? seconds : null;
      }
    }
  }
}

function isUnblocked(err) {
  return isReply(err) && /^UNBLOCKED/.test(err.message);
}

/** One send of standaloneWaiting's command, for the seconds of `wait`; `signal` ends it. */
async function standaloneOnce(client, conn, own, wait, build, blocks, signal) {
  const args = build(wait);
  const sent = performance.now();
  if (own || !blocks) {
    return { reply: await abortable(conn.call(...args), signal, () => conn.destroy()), sent };
  }
  const pool = poolOf(client);
  const blocking = await pool.take();
  const timeout = client.commandTimeout;
  const limitMs = timeout && Number.isFinite(wait) ? wait * 1000 + timeout : Infinity;
  let reply;
  try {
    const call = guarded(blocking.call(...args), limitMs, blocking);
    reply = await abortable(call, signal, () => blocking.destroy());
  } catch (err) {
    // An error reply leaves the connection as it was; anything else ends it.
    if (keepsConnection(err)) pool.give(blocking);
    else blocking.destroy();
    throw err;
  }
  pool.give(blocking);
  return { reply, sent };
}

/**
 * An error the server answered before blocking (the connection is as it was), not a lost,
 * timed-out or unblocked one.
 */
function keepsConnection(err) {
  return isReply(err) && !isUnblocked(err);
}

function isReply(err) {
  // ioredis's ReplyError; node-redis's ErrorReply and its subclasses.
  for (let proto = err && Object.getPrototypeOf(err); proto; proto = Object.getPrototypeOf(proto)) {
    const name = proto.constructor && proto.constructor.name;
    if (name === "ReplyError" || name === "ErrorReply") return true;
  }
  return false;
}

/** A pooled connection, taken in time (one that comes too late is closed when it comes). */
async function takeInTime(pool, ms, address) {
  const taking = pool.take();
  try {
    return await inTime(taking, ms, address);
  } catch (err) {
    taking.then(
      (conn) => conn.destroy(),
      () => {},
    );
    throw err;
  }
}

/** The connection a permit keeps as its own: BOUND ties the permit to it, and WAIT
 * numreplicas covers that connection's writes. Else the caller's. */
async function connectionFor(client, opts) {
  if (!opts.bound && !opts.durableReplicas) return { conn: client, own: false };
  const durableMs = opts.durableReplicas ? opts.durableTimeoutMs : 0;
  const blockMs = Math.max((opts.wait || 0) * 1000, durableMs);
  if (client.cluster) return { conn: client.dedicate(blockMs), own: true };
  return { conn: await ownConnection(client, blockMs), own: true };
}

/** A new connection for a command that may block `blockMs` in the server. */
async function ownConnection(client, blockMs, options = {}) {
  // An ioredis commandTimeout must outlast the server's wait.
  const override = { ...options };
  const timeout = client.commandTimeout;
  if (timeout) {
    override.commandTimeout = Number.isFinite(blockMs) ? timeout + blockMs : undefined;
  }
  const own = await client.duplicate(override);
  own.module = client.module; // the same server
  return own;
}

// ---------------------------------------------------------------------------------------------
// Redis Cluster: ioredis's Cluster and node-redis's createCluster.
//
// Every call for a semaphore goes to the primary serving its slot, in the long form (every key
// named, so a node with the module's command filter or without it takes it), and is resent with
// the same arguments (the same identifier) after a redirection or a failure until it has an
// answer or the retry budget is spent.

/** CRC16-XMODEM, as Redis Cluster hashes a key to its slot. */
const CRC16_TABLE = (() => {
  const table = new Uint16Array(256);
  for (let i = 0; i < 256; i++) {
    let crc = i << 8;
    for (let bit = 0; bit < 8; bit++) crc = crc & 0x8000 ? (crc << 1) ^ 0x1021 : crc << 1;
    table[i] = crc & 0xffff;
  }
  return table;
})();

function asBytes(name) {
  return Buffer.isBuffer(name) ? name : Buffer.from(String(name));
}

/** The hash tag of a key (the bytes between the first `{` and the first `}` after it), or null. */
function hashTag(bytes) {
  const open = bytes.indexOf(0x7b);
  if (open < 0) return null;
  const close = bytes.indexOf(0x7d, open + 1);
  return close > open + 1 ? bytes.subarray(open + 1, close) : null;
}

/** The cluster slot of a key: CRC16 of its hash tag (else of the whole key) mod 16384. */
function keySlot(name) {
  const bytes = asBytes(name);
  const hashed = hashTag(bytes) || bytes;
  let crc = 0;
  for (const byte of hashed) crc = ((crc << 8) & 0xffff) ^ CRC16_TABLE[((crc >> 8) ^ byte) & 0xff];
  return crc % 16384;
}

/**
 * The slot every key of the semaphores `names` lives in, or a TypeError naming the fix: each
 * name needs a hash tag (else its keys fall in different slots), and a set's names one slot.
 */
function clusterSlot(names) {
  const slots = names.map((name) => {
    if (hashTag(asBytes(name)) === null) {
      const n = String(name);
      throw new TypeError(
        `in Redis Cluster a semaphore's name needs a hash tag, e.g. "{${n}}" or "app:{${n}}": ` +
          `the keys of "${n}" (${n}, ${n}:owner, ${n}:counter, ${n}:permits, ${n}:limit) ` +
          "would fall in different slots",
      );
    }
    return keySlot(name);
  });
  const other = slots.findIndex((slot) => slot !== slots[0]);
  if (other > 0) {
    throw new TypeError(
      "in Redis Cluster the semaphores of a set must share a slot: give their names one hash " +
        `tag, e.g. "{app}a" and "{app}b" ("${names[0]}" is in slot ${slots[0]}, ` +
        `"${names[other]}" in slot ${slots[other]})`,
    );
  }
  return slots[0];
}

/** The keys the module keeps for a semaphore besides its name, as the long form names them. */
const LONG_SUFFIXES = ["owner", "counter", "permits", "limit"];

/** The commands that take several semaphores: their keys come last, in the names' order. */
const SET_COMMANDS = new Set(["SEM.ACQUIREALL", "SEM.RELEASEALL", "SEM.REFRESHALL"]);

/** `[SEM.X, ...]` in the long form for the semaphores `names`. */
function longForm(args, names) {
  const keysOf = (name) => LONG_SUFFIXES.map((suffix) => `${name}:${suffix}`);
  if (SET_COMMANDS.has(String(args[0]).toUpperCase())) {
    return [...args, ...names.flatMap(keysOf)];
  }
  return [args[0], args[1], ...keysOf(args[1]), ...args.slice(2)];
}

/** What ioredis and node-redis say of a connection that closed or never opened. */
const CONNECTION_LOST = [
  /Connection is closed/,
  /Stream isn't writeable/,
  /Socket closed unexpectedly/,
  /client is closed/i,
  /Disconnects client/,
  /ECONNREFUSED|ECONNRESET/,
  /Connection timeout/i,
];

/**
 * What kind of trouble an error from a cluster node is: `ask` or `moved` (with the address to
 * go to), `retry` (the slot is moving, the cluster is down or changing), `gone` (the
 * connection or the node is), or null (an answer: it is the caller's).
 */
function clusterTrouble(err) {
  const message = err && typeof err.message === "string" ? err.message : "";
  const redirect = /^(ASK|MOVED) \d+ (\S+)/.exec(message);
  if (redirect) return { kind: redirect[1].toLowerCase(), address: redirect[2] };
  if (/^(TRYAGAIN|CLUSTERDOWN|LOADING|MASTERDOWN|READONLY|UNBLOCKED)\b/.test(message)) {
    return { kind: "retry" };
  }
  if (err && err.redsemNodeGone) return { kind: "gone" };
  if (err && ["ECONNREFUSED", "ECONNRESET", "EPIPE", "ETIMEDOUT"].includes(err.code)) {
    return { kind: "gone" };
  }
  // ioredis and node-redis on a connection that closed or never opened.
  if (CONNECTION_LOST.some((pattern) => pattern.test(message))) {
    return { kind: "gone" };
  }
  return null;
}

function nodeGone(address, why) {
  const err = new Error(`the cluster node ${address} ${why}`);
  err.redsemNodeGone = true;
  return err;
}

/** `conn` with ASKING sent right before each command, on the same connection. */
function asking(conn) {
  return {
    ...conn,
    call: (...args) => {
      // Both are queued in this turn of the event loop, so nothing comes between them.
      Promise.resolve(conn.call("ASKING")).catch(() => {});
      return conn.call(...args);
    },
  };
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** How long finding a node and connecting to it may take before the try counts as failed. */
const REACH_MS = 2000;

/** `promise`, or a failed try after `ms` (a node that does not answer a connection). */
function inTime(promise, ms, what) {
  let timer;
  const late = new Promise((resolve, reject) => {
    timer = setTimeout(() => reject(nodeGone(what, `did not answer within ${ms} ms`)), ms);
  });
  return Promise.race([promise, late]).finally(() => clearTimeout(timer));
}

/**
 * What the package uses of a cluster client, per library: the client's slot map (owner), the
 * connection it keeps to a node (node), a new one of our own (dedicated), and a refresh of its
 * map. The module check is asked of each node once and remembered per address.
 */
class ClusterClient {
  constructor(raw) {
    this.raw = raw;
    this.modules = new Map(); // address -> Promise<boolean>
    this.moved = new Map(); // slot -> address a MOVED named, until the next refresh
    this.pools = new Map(); // address -> Pool
    this._refreshing = null;
    // ioredis's Cluster ends with "end", node-redis's with "disconnect".
    for (const event of ["end", "disconnect"]) raw.on(event, () => this.drainPools());
  }

  /** The address of the primary serving `slot`: where a MOVED sent us, else the client's map. */
  async owner(slot) {
    await this.ready();
    return this.moved.get(slot) || this.mapped(slot);
  }

  /** Refreshes the client's slot map (one at a time; callers share the one under way). */
  refresh() {
    if (!this._refreshing) {
      this._refreshing = this.rediscover()
        .catch(() => {})
        .finally(() => {
          this.moved.clear();
          this._refreshing = null;
        });
    }
    return this._refreshing;
  }

  /**
   * Whether the node at `address` has the module: COMMAND INFO SEM.ACQUIRE, asked once (again
   * after RECHECK_MODULE_MS while the answer is no).
   */
  moduleAt(address) {
    return remembered(this.modules, address, () =>
      inTime(this.node(address), REACH_MS, address).then(askModule),
    );
  }

  /** The pool of blocking connections to the node at `address`. */
  poolAt(address) {
    let pool = this.pools.get(address);
    if (!pool) {
      pool = new Pool(this.raw, async () => this.dedicated(address, Infinity));
      this.pools.set(address, pool);
    }
    return pool;
  }

  /** The cluster client closed: so do the idle pooled connections. */
  drainPools() {
    for (const pool of this.pools.values()) pool.drain();
  }
}

class IORedisCluster extends ClusterClient {
  async ready() {
    // A cluster still connecting queues commands until it has its slot map.
    if (this.raw.status !== "ready") await this.raw.ping();
  }

  mapped(slot) {
    const keys = this.raw.slots[slot];
    return keys && keys.length > 0 ? keys[0] : null;
  }

  _instance(address) {
    const node = this.raw.nodes("all").find((redis) => {
      const { host, port } = redis.options;
      return `${host}:${port}` === address;
    });
    if (!node) throw nodeGone(address, "is not in the client's map");
    return node;
  }

  async node(address) {
    return adapt(this._instance(address));
  }

  async dedicated(address, blockMs) {
    // A duplicate of the cluster's connection to the node: its options (the cluster's
    // redisOptions), never reconnecting by itself (the package follows the slot instead).
    const own = adapt(this._instance(address));
    const conn = await ownConnection(own, blockMs, { retryStrategy: null, readOnly: false });
    conn.raw.on("error", () => {}); // its commands report what goes wrong
    return conn;
  }

  rediscover() {
    return new Promise((resolve) => this.raw.refreshSlotsCache(() => resolve()));
  }
}

class NodeRedisCluster extends ClusterClient {
  async ready() {}

  mapped(slot) {
    const shard = this.raw.slots[slot];
    return shard && shard.master ? shard.master.address : null;
  }

  async _client(address) {
    const node = this.raw.nodeByAddress.get(address);
    if (!node) throw nodeGone(address, "is not in the client's map");
    const client = await this.raw.nodeClient(node);
    // A node that went away: its client reconnects and queues commands meanwhile; the
    // package asks the slot's owner again instead.
    if (!client.isReady) throw nodeGone(address, "is not connected");
    return client;
  }

  async node(address) {
    return adapt(await this._client(address));
  }

  async dedicated(address) {
    const client = await this._client(address);
    const socket = { ...(client.options && client.options.socket), reconnectStrategy: false };
    const own = client.duplicate({ socket });
    own.on("error", () => {});
    await own.connect();
    return adapt(own);
  }

  async rediscover() {
    // node-redis 5 keeps its slot map in _slots; it rediscovers from a live node, else from
    // its root nodes.
    const slots = (this.raw._self || this.raw)._slots;
    if (!slots || typeof slots.rediscover !== "function") return;
    const live = this.raw.masters.find((node) => node.client && node.client.isReady);
    const options = (this.raw._self || this.raw)._options || {};
    const start = live ? live.client : { options: (options.rootNodes || [])[0] };
    await slots.rediscover(start);
  }
}

/** The cluster client of `redis` (made once per client object), or null for a plain client. */
const clusters = new WeakMap();

function clusterOf(redis) {
  if (!redis || typeof redis !== "object") return null;
  let cluster = clusters.get(redis);
  if (!cluster) {
    if (redis.isCluster === true && typeof redis.nodes === "function") {
      cluster = new IORedisCluster(redis);
    } else if (typeof redis.nodeClient === "function") {
      if (!(redis.nodeByAddress instanceof Map)) {
        throw new TypeError("a node-redis cluster client needs node-redis 5 or later");
      }
      cluster = new NodeRedisCluster(redis);
    } else {
      return null;
    }
    clusters.set(redis, cluster);
  }
  return cluster;
}

/**
 * The way to the semaphores `names` (one slot) in a cluster: module commands go to the slot's
 * primary in the long form, or as the script where that node has no module; a waiting call
 * goes on a connection of its own to that node (after `dedicate`). Each call is resent, the
 * same, after MOVED (to the node named), ASK (ASKING, then the call, on the named node) and a
 * failure (TRYAGAIN, CLUSTERDOWN, a lost connection, ...: after a pause from 50 ms doubling to
 * 1 s, and a refresh of the slot map) until it has an answer, for at most the retry budget.
 */
class SlotLink {
  constructor(cluster, names, slot, retryFor) {
    this.cluster = cluster;
    this.names = names;
    this.slot = slot;
    this.budgetMs = (retryFor == null ? RETRY_BUDGET : retryFor) * 1000;
    this.module = undefined;
    this.own = false; // waiting calls go on a connection of our own
    this._blockMs = 0;
    this._dedicated = null; // { address, conn: a promise of our connection to that node }
  }

  /** Asks the slot's primary whether it has the module (once per node address). */
  async detect() {
    const ask = (conn, address) => this.cluster.moduleAt(address);
    this.module = await this._retry("COMMAND INFO", ask, "shared");
    if (!this.module && this.keyPrefix) throw moduleRequired("an ioredis keyPrefix");
    return this;
  }

  /** From now on, waiting calls go on a connection of our own that may block `blockMs`. */
  dedicate(blockMs) {
    this.own = true;
    this._blockMs = blockMs;
    return this;
  }

  /**
   * A module command `[SEM.X, name, ...]` on the slot's primary (on our own connection when
   * dedicated, as a permit's commands go on its own connection): the long form, or the script.
   */
  sem(args) {
    const command = String(args[0]).toUpperCase();
    const send = async (conn, address) => {
      if (await this.cluster.moduleAt(address)) return conn.call(...longForm(args, this.names));
      if (!SCRIPTED.has(command)) throw moduleRequired(command);
      return runScript(conn, args[1], [command.slice("SEM.".length), ...args.slice(2)]);
    };
    return this._retry(command, send, this.own ? "ours" : "shared");
  }

  /**
   * A module command that waits in the server (`build(wait)` makes it for the seconds of
   * `wait` left: Infinity, a number, or null when none is left): on our own connection when
   * dedicated, else on a pooled one when it `blocks`. Resent after an interruption with what is
   * left of the wait. Resolves with the reply and when the answering try was sent.
   */
  async waiting(wait, build, blocks = Boolean(wait), signal = null) {
    const end = wait ? performance.now() + wait * 1000 : null; // Infinity: no end
    let sent;
    const left = () => {
      if (end === null || end === Infinity) return end === null ? null : Infinity;
      const seconds = (end - performance.now()) / 1000;
      return seconds > 0 ? seconds : null;
    };
    const reply = await this._retry(
      String(build(null)[0]).toUpperCase(),
      (conn) => {
        const args = longForm(build(left()), this.names);
        sent = performance.now();
        return conn.call(...args);
      },
      this.own ? "own" : blocks ? "pool" : "shared",
      signal,
    );
    return { reply, sent };
  }

  /**
   * Where the calls of a waiting acquire through the script go: the script to the slot's
   * primary (on our own connection when dedicated), TICK on the cluster's, BLPOP on a pooled
   * connection to that node.
   */
  scriptWay(signal = null) {
    const name = this.names[0];
    return {
      script: (opArgs, first) =>
        this._retry(
          String(opArgs[0]),
          (conn, address) => {
            this._scriptAt = address;
            return runScript(conn, name, opArgs, first);
          },
          this.own ? "ours" : "shared",
        ),
      tick: () => this._retry("TICK", (conn) => runScript(conn, name, ["TICK"]), "shared"),
      clear: (key) => this._retry("DEL", (conn) => conn.call("DEL", key), "shared"),
      blpop: (key, ms) => this.blpop(key, ms, signal),
    };
  }

  /** The script said the module is loaded on the node it ran on: use it from now on. */
  useModule() {
    this.module = true;
    if (this._scriptAt) rememberModule(this.cluster.modules, this._scriptAt);
  }

  /**
   * BLPOP on `key` for `ms` on a pooled connection to the slot's primary. A move or a lost
   * node answers null (no message): the waiter's next try finds the slot's owner.
   */
  async blpop(key, ms, signal = null) {
    let pool = null;
    let conn = null;
    try {
      const address = await inTime(this.cluster.owner(this.slot), REACH_MS, "the cluster");
      if (!address) throw nodeGone(`of slot ${this.slot}`, "is not known");
      pool = this.cluster.poolAt(address);
      conn = await takeInTime(pool, REACH_MS, address);
      const call = conn.call("BLPOP", key, seconds(ms / 1000));
      const guard = guarded(call, ms + BLOCK_GRACE_MS, conn);
      const blocked = conn;
      const reply = await abortable(guard, signal, () => blocked.destroy());
      pool.give(conn);
      return popped(reply);
    } catch (err) {
      if (signal && signal.aborted) {
        if (conn) conn.destroy();
        throw signal.reason;
      }
      const trouble = clusterTrouble(err);
      if (conn) {
        if (keepsConnection(err)) pool.give(conn);
        else conn.destroy(); // interrupted mid-block: never reused
      }
      if (!trouble) throw err;
      await sleep(50);
      return null;
    }
  }

  /** Our own connection never reconnects: a call cut short rejects (no watch needed). */
  onLost() {
    return () => {};
  }

  /** A command on our own connection as it is (WAIT numreplicas after a grant). */
  async call(...args) {
    if (!this._dedicated) throw new SemaphoreError("the permit's connection is gone");
    return (await this._dedicated.conn).call(...args);
  }

  async close() {
    const own = this._dedicated;
    this._dedicated = null;
    if (own) await own.conn.then((conn) => conn.close()).catch(() => {});
  }

  destroy() {
    this._dropDedicated();
  }

  get keyPrefix() {
    const options = this.cluster.raw.options || {};
    return options.keyPrefix || (options.redisOptions && options.redisOptions.keyPrefix);
  }

  /** Our connection to the node at `address` (one at a time: another one is ended). */
  _dedicatedTo(address) {
    if (this._dedicated && this._dedicated.address === address) return this._dedicated.conn;
    this._dropDedicated();
    const conn = this.cluster.dedicated(address, this._blockMs);
    this._dedicated = { address, conn };
    return conn;
  }

  _dropDedicated() {
    const own = this._dedicated;
    this._dedicated = null;
    if (own) own.conn.then((conn) => conn.destroy()).catch(() => {});
  }

  /**
   * The connection a call to the node at `address` goes on: `shared`, the cluster client's
   * own; `own`, ours (moved to the node the call must go to: a wait); `ours`, ours when it
   * is to that node or there is none yet, else the shared one (a permit's connection stays
   * the one it was granted on, which a bound permit needs).
   */
  _connectionTo(address, use) {
    if (use === "shared") return { conn: this.cluster.node(address), ours: false };
    if (use === "own" || !this._dedicated || this._dedicated.address === address) {
      return { conn: this._dedicatedTo(address), ours: true };
    }
    return { conn: this.cluster.node(address), ours: false };
  }

  async _retry(what, send, use, signal = null) {
    const deadline = performance.now() + this.budgetMs;
    let pause = 50;
    let askAt = null;
    let redirects = 0;
    for (;;) {
      let ours = false;
      if (signal && signal.aborted) throw signal.reason;
      try {
        // Finding the node and connecting to it are bounded; the call itself may wait.
        const reachMs = Math.max(Math.min(REACH_MS, deadline - performance.now()), 100);
        const owner = askAt || inTime(this.cluster.owner(this.slot), reachMs, "the cluster");
        const address = await owner;
        if (!address) throw nodeGone(`of slot ${this.slot}`, "is not known");
        if (use === "pool") {
          const pool = this.cluster.poolAt(address);
          const conn = await takeInTime(pool, reachMs, address);
          let reply;
          try {
            const call = send(askAt ? asking(conn) : conn, address);
            reply = await abortable(call, signal, () => conn.destroy());
          } catch (err) {
            // An answer (an error, a redirection) leaves the connection as it was.
            if (keepsConnection(err)) pool.give(conn);
            else conn.destroy();
            throw err;
          }
          pool.give(conn);
          return reply;
        }
        const way = this._connectionTo(address, use);
        ours = way.ours;
        const conn = await inTime(way.conn, reachMs, address);
        const call = send(askAt ? asking(conn) : conn, address);
        // Our own connection is closed (a wait on it ends in the server); never the cluster's.
        return await abortable(call, signal, () => ours && this._dropDedicated());
      } catch (err) {
        if (signal && signal.aborted) throw signal.reason;
        const trouble = clusterTrouble(err);
        if (!trouble) throw err;
        if (ours && trouble.kind === "gone") this._dropDedicated();
        askAt = null;
        if ((trouble.kind === "ask" || trouble.kind === "moved") && redirects++ < 16) {
          if (trouble.kind === "ask") {
            askAt = trouble.address;
          } else {
            this.cluster.moved.set(this.slot, trouble.address);
            this.cluster.refresh(); // meanwhile, to the node the MOVED named
          }
          continue;
        }
        const left = deadline - performance.now();
        if (left <= 0) {
          throw new SemaphoreError(
            `${what} for ${this.names.join(", ")} had no answer from the Redis Cluster within ` +
              `${this.budgetMs / 1000} s (the retry budget): ${err.message}`,
            { cause: err },
          );
        }
        // A last try when the budget ends.
        await abortable(sleep(Math.min(pause, left)), signal, () => {});
        pause = Math.min(pause * 2, 1000);
        redirects = 0;
        await this.cluster.refresh();
      }
    }
  }
}

/**
 * Where the calls for the semaphores `names` go: the client itself, once asked whether its
 * server has the module, or, through a cluster client, the way to the primary serving their
 * slot (the names checked before anything is sent).
 */
async function reach(redis, names, retryFor) {
  const cluster = clusterOf(redis);
  if (!cluster) return detect(adapt(redis));
  return new SlotLink(cluster, names, clusterSlot(names), retryFor).detect();
}

/**
 * A module command that may wait `wait` seconds in the server (`build(wait)` makes it):
 * resolves with its reply and when it was sent. Through a cluster, resent after an
 * interruption with what is left of the wait.
 */
async function sendWaiting(client, conn, own, wait, build, blocks = Boolean(wait), signal = null) {
  if (conn.cluster) return conn.waiting(wait, build, blocks, signal);
  return standaloneWaiting(client, conn, own, wait, build, blocks, signal);
}

/**
 * A permit of `name`: the module's reply (null: not granted) and when the granting try was
 * sent. Without the module, through the script (scriptAcquire); when the script finds the
 * module loaded, this client (this node) uses the module from then on, and a wait goes on there
 * for the time left.
 */
async function take(client, conn, own, name, opts, id) {
  let wait = opts.wait;
  if (!conn.module) {
    const signal = opts.signal;
    const way = conn.cluster ? conn.scriptWay(signal) : standaloneWay(client, conn, name, signal);
    const tried = await scriptAcquire(way, name, opts, id);
    if (!tried.module) return tried;
    if (conn.cluster) conn.useModule();
    else {
      rememberModule(backends, client.raw);
      client.module = true;
      conn.module = true;
    }
    if (tried.reply != null || tried.left === null) return tried;
    wait = tried.left;
  }
  const build = (left) => acquireArgs(name, { ...opts, wait: left }, id);
  return sendWaiting(client, conn, own, wait, build, Boolean(wait), opts.signal);
}

const asyncDispose = Symbol.asyncDispose || Symbol.for("nodejs.asyncDispose");

/**
 * What a permit of one semaphore and a set of permits share: the refresh, loss and release.
 * Subclasses say what they hold (_what), how it is refreshed and given back (_refreshArgs,
 * _releaseArgs), and how many semaphores those must find held (_wanted).
 */
class Held {
  constructor(opts, conn, own, id, sent) {
    /** The holder's identifier: `id`, or the UUID v4 made for this permit. */
    this.id = id;
    this.lease = opts.lease;
    this._conn = conn;
    this._own = own;
    // The server's deadline is at least this (performance.now() ms): the last acquire or refresh
    // confirmed was sent then, and its lease started when the server ran it, later.
    this._confirmedUntil = sent + opts.lease * 1000;
    this._deadline = null; // fires at _confirmedUntil: `signal` aborts on time, unasked
    this._lostError = null;
    this._released = null; // the release's promise, once releasing
    this._timer = null;
    this._refreshing = null; // the refresh under way
    this._controller = null; // made when `signal` is first read: most permits never are
    /** Resolves with the PermitLost error when the permit is lost; never rejects. */
    this.whenLost = new Promise((resolve) => {
      this._resolveLost = resolve;
    });
    // Armed by the acquire once the grant is confirmed (_arm): a grant that came late (a long
    // wait, a resend through a failover) has a lease that started after `sent`, so until its
    // confirming refresh answers, `sent` + lease says nothing about it.
  }

  /** Aborted (with the PermitLost error as its reason) when the permit is lost. */
  get signal() {
    if (this._controller === null) {
      this._controller = new AbortController();
      if (this._lostError !== null) this._controller.abort(this._lostError);
    }
    return this._controller.signal;
  }

  /**
   * True once the permit may have run out: a refresh or the release answered 0, or no refresh
   * was confirmed within a lease (the server is unreachable). It stays true.
   */
  get lost() {
    this._noteDeadline();
    return this._lostError !== null;
  }

  /** Throws PermitLost if the permit is lost: call it in long work to stop early. */
  check() {
    if (this.lost) throw this._lostError;
  }

  /** Moves the deadline to now + lease (the refresh timer does it every lease/3). */
  async refresh() {
    if (this._released) throw new SemaphoreError("the permit was already released");
    const sent = performance.now();
    const args = this._refreshArgs();
    const reply = await semCall(this._conn, args);
    if (reply === this._wanted) {
      this._confirmedUntil = sent + this.lease * 1000;
      this._armDeadline();
      return true;
    }
    // Fewer than all: a lease ran out (the server removes it) or another client removed it.
    this._markLost(`${this._answered(args, reply)} (the lease ran out, or the holder was removed)`);
    return false;
  }

  _answered(args, reply) {
    return this._wanted === 1
      ? `${args[0]} answered ${reply}`
      : `${args[0]} answered ${reply} of ${this._wanted}`;
  }

  /**
   * Gives the permit back: true if it was held throughout, false if it was lost (the work it
   * guarded may have overlapped another holder's). Later calls give the same answer; after a
   * release that failed (its error rejected it: the permit may still be held), a later call
   * sends it again.
   */
  release() {
    if (!this._released) {
      const releasing = this._release();
      this._released = releasing;
      releasing.catch(() => {
        if (this._released !== releasing) return;
        // Releasable again; meanwhile its lease runs on, unrefreshed, until it ends.
        this._released = null;
        this._armDeadline();
      });
    }
    return this._released;
  }

  async _release() {
    this._noteDeadline();
    clearTimeout(this._timer);
    this._timer = null;
    clearTimeout(this._deadline);
    await this._refreshing; // a refresh under way finishes first
    const args = this._releaseArgs();
    // A release that fails keeps the permit's own connection for the next one.
    const reply = await semCall(this._conn, args);
    if (this._own) await this._conn.close();
    if (reply !== this._wanted) {
      this._markLost(`${this._answered(args, reply)}: the lease ran out before the release`);
    }
    return this._lostError === null;
  }

  /** For `await using permit = await acquire(...)`: releases, and throws if it was lost. */
  async [asyncDispose]() {
    if (!(await this.release())) throw this._lostError;
  }

  _startRefreshing() {
    const tick = () => {
      this._refreshing = this.refresh().then(
        (held) => held,
        () => !this.lost, // unreachable server: retry until the lease is up
      );
      this._refreshing.then((goOn) => {
        this._refreshing = null;
        if (goOn && !this._released) this._schedule(tick);
      });
    };
    this._schedule(tick);
  }

  _schedule(tick) {
    this._timer = setTimeout(tick, (this.lease * 1000) / 3);
    this._timer.unref(); // a forgotten permit does not keep the process alive
  }

  /**
   * Ends the acquire: a grant that came later than lease/3 after its first send is confirmed by
   * a refresh first (its answer alone moves the deadline, so no deadline armed from the first
   * send can call it lost meanwhile), then the deadline is armed. False if the confirmation
   * found it lost.
   */
  async _confirm(sent) {
    if (performance.now() - sent > (this.lease * 1000) / 3 && !(await this.refresh())) {
      return false;
    }
    this._armDeadline();
    return true;
  }

  // Marks the permit lost when its confirmed lease ends with no refresh confirmed since (the
  // server is unreachable, or refreshing is off), whether or not anybody reads `lost`.
  _armDeadline() {
    clearTimeout(this._deadline);
    if (this._released || this._lostError !== null) return;
    const ms = Math.max(0, this._confirmedUntil - performance.now()) + 1;
    // Node schedules from its cached loop time, so a timer may fire before performance.now()
    // reaches the deadline: then it is armed again for what is left.
    this._deadline = setTimeout(() => {
      this._noteDeadline();
      this._armDeadline();
    }, ms);
    this._deadline.unref();
  }

  _noteDeadline() {
    if (!this._released && performance.now() >= this._confirmedUntil) {
      this._markLost("no refresh was confirmed within the lease");
    }
  }

  _markLost(reason) {
    if (this._lostError !== null) return;
    clearTimeout(this._deadline);
    this._lostError = new PermitLost(`the permit ${this.id} of ${this._what()} was lost: ${reason}`);
    if (this._controller !== null) this._controller.abort(this._lostError);
    this._resolveLost(this._lostError);
  }
}

class Permit extends Held {
  constructor(name, opts, conn, own, id, ticket, sent) {
    super(opts, conn, own, id, sent);
    this.name = name;
    /** The fencing ticket of a fair permit (only ever grows per name), else null. */
    this.ticket = ticket;
    /** The number of permits held (COUNT). */
    this.count = opts.count || 1;
  }

  get _wanted() {
    return 1;
  }

  _what() {
    return this.name;
  }

  _refreshArgs() {
    return ["SEM.REFRESH", this.name, this.id, seconds(this.lease)];
  }

  _releaseArgs() {
    return ["SEM.RELEASE", this.name, this.id];
  }

  /** Gives back `count` of a weighted permit's permits and keeps the rest. */
  async releaseSome(count) {
    if (this._released) throw new SemaphoreError("the permit was already released");
    if (!Number.isInteger(count) || count < 1 || count >= this.count) {
      throw new RangeError(`count must be from 1 to ${this.count - 1}; use release() for all`);
    }
    const reply = await semCall(this._conn, ["SEM.RELEASE", this.name, this.id, "COUNT", count]);
    if (reply === 1) {
      this.count -= count;
      return true;
    }
    this._markLost("SEM.RELEASE answered 0: the lease ran out before the release");
    return false;
  }
}

/**
 * Permits of several semaphores taken at once for one identifier (SEM.ACQUIREALL), refreshed
 * together (SEM.REFRESHALL) and lost as soon as any one of them is, given back together
 * (SEM.RELEASEALL).
 */
class PermitSet extends Held {
  constructor(semaphores, opts, conn, own, id, tickets, sent) {
    super(opts, conn, own, id, sent);
    /** The semaphores' names, in the order given. */
    this.names = semaphores.map((sem) => sem.name);
    /** The permits held of each, in the same order. */
    this.counts = semaphores.map((sem) => sem.count);
    /** With `fair`: one fencing ticket per semaphore, in the same order; else null. */
    this.tickets = tickets;
  }

  get _wanted() {
    return this.names.length;
  }

  _what() {
    return `the set ${this.names.join(", ")}`;
  }

  _refreshArgs() {
    const names = this.names;
    return ["SEM.REFRESHALL", names.length, ...names, this.id, seconds(this.lease)];
  }

  _releaseArgs() {
    return ["SEM.RELEASEALL", this.names.length, ...this.names, this.id];
  }
}

/**
 * Takes a permit of the semaphore `name`, or throws NotAcquired (or NotDurable, or the
 * server's error).
 *
 * options: limit (required), lease (seconds, default 30; refreshed every lease/3), wait
 * (seconds to wait in the server; null or 0: no waiting, Infinity: no limit), fair
 * (SEM.ACQUIREFAIR; `ticket` is a fencing token), count (permits taken at once), bound (given
 * back when the permit's connection closes), id (default: a new UUID v4; an identifier names
 * one permit: a second acquire with it while the first is held renews that permit rather than
 * taking another, so never hold two permits with one id at once), durableReplicas and
 * durableTimeoutMs (WAIT for replicas after the grant), autoRefresh (default true), signal (an
 * AbortSignal that cancels the acquire as fetch's does: it rejects with the signal's reason,
 * the wait ends in the server with its connection, and a grant that came meanwhile is given
 * back).
 *
 * `redis` is an ioredis client or a connected node-redis client. A permit that binds or asks
 * for replicas uses a connection of its own (`redis.duplicate()`), closed at its release; the
 * others use `redis`, and a wait blocks on a pooled connection (setPoolSize), given back after
 * it. Without the module the script does the same over the same keys, and a waiter waits in
 * the script's line, told of its grant on its own list `<name>:wake:<id>`; `bound` rejects with
 * ModuleRequired.
 *
 * `redis` may be a cluster client (ioredis Cluster, node-redis createCluster): then `name`
 * needs a hash tag, the calls go to the slot's primary (a connection of its own is one to that
 * node), and each is resent through moves and failovers for at most `retryFor` seconds
 * (default 30), with the same identifier.
 */
async function acquire(redis, name, options = {}) {
  const opts = checkOptions(name, options);
  const signal = opts.signal;
  if (signal && signal.aborted) throw signal.reason; // nothing sent
  const id = opts.id != null ? opts.id : randomUUID();
  const client = await reach(redis, [name], opts.retryFor);
  if (!client.module && opts.bound) throw moduleRequired("BOUND");
  const { conn, own } = await connectionFor(client, opts);
  let permit;
  try {
    if (signal && signal.aborted) throw signal.reason;
    const { reply, sent } = await take(client, conn, own, name, opts, id);
    if (reply == null) {
      const waited = opts.wait ? ` within ${opts.wait} s` : "";
      throw new NotAcquired(`no permit of ${name} (limit ${opts.limit}) was granted${waited}`);
    }
    const ticket = opts.fair ? Number(reply[1]) : null;
    permit = new Permit(name, opts, conn, own, id, ticket, sent);
    if (signal && signal.aborted) throw signal.reason; // granted as it was cancelled
    if (opts.durableReplicas) await durableWait(client, permit, name, opts);
    // A wait for the grant leaves the lease's start unknown: confirm it now.
    if (!(await permit._confirm(sent))) throw permit._lostError;
    if (signal && signal.aborted) throw signal.reason;
  } catch (err) {
    await giveBack(client, conn, own, permit, ["SEM.RELEASE", name, id], signal);
    throw signal && signal.aborted ? signal.reason : err;
  }
  if (opts.autoRefresh) permit._startRefreshing();
  return permit;
}

/**
 * After an acquire that failed or was cancelled: its permit given back, or, without one, a
 * wait under way ended with its connection; when cancelled, a grant that came meanwhile (its
 * answer lost with the connection) given back by `release` (args of SEM.RELEASE or
 * SEM.RELEASEALL), on the client's connection. Best effort: a lease never refreshed ends.
 */
async function giveBack(client, conn, own, permit, release, signal) {
  if (permit) {
    await permit.release().catch(() => {});
    return;
  }
  if (own) {
    conn.destroy(); // a wait under way ends with its connection
    if (conn.cluster) conn.own = false; // calls go on the cluster's connections now
  }
  if (signal && signal.aborted) await semCall(client, release).catch(() => {});
}

/**
 * WAIT numreplicas on the permit's own connection after its grant, or NotDurable. A
 * connection lost meanwhile (a failover) leaves the grant's fate unknown: a WAIT sent again on
 * a new connection counts the replicas of that connection's writes (none) and answers at once,
 * so it is never sent again; NotDurable instead, and the permit is given back on the client's
 * connection (the caller's catch). A cancel (`signal`) ends the WAIT as well.
 */
async function durableWait(client, permit, name, opts) {
  const conn = permit._conn;
  const wanted = opts.durableReplicas;
  let stop = () => {};
  const lost = new Promise((resolve, reject) => {
    stop = conn.onLost(() => reject(nodeGone("of the permit", "closed its connection")));
  });
  const cut = () => {
    // Its connection is closed, and the permit's calls go on the client's from now on.
    conn.destroy();
    if (conn.cluster) conn.own = false;
    else permit._conn = client;
    permit._own = false;
  };
  let acked;
  try {
    const wait = Promise.race([conn.call("WAIT", wanted, opts.durableTimeoutMs), lost]);
    acked = await abortable(wait, opts.signal, cut);
  } catch (err) {
    if (opts.signal && opts.signal.aborted) throw err;
    // The grant's node became a replica before the WAIT (a failover): as a cut WAIT, whether
    // a replica has the grant is unknown, and the permit is given back on the new primary.
    const demoted = isReply(err) && /WAIT cannot be used with replica/.test(err.message);
    if (!demoted && !clusterTrouble(err) && !(err instanceof SemaphoreError)) throw err;
    cut();
    const what = demoted ? "its node became a replica" : "the connection was lost";
    throw new NotDurable(
      `${what} while ${wanted} replicas were awaited for the grant of ${name} ` +
        `(${err.message}): whether one has it is unknown`,
      0,
      wanted,
    );
  } finally {
    stop();
    lost.catch(() => {});
  }
  if (acked < wanted) {
    throw new NotDurable(
      `${acked} of ${wanted} replicas acknowledged the grant of ${name} ` +
        `within ${opts.durableTimeoutMs} ms`,
      acked,
      wanted,
    );
  }
}

/**
 * Runs `work(permit)` holding a permit, and gives it back afterwards. Resolves with what the
 * work resolved with; rejects with the work's error, or with PermitLost if the permit ran out
 * during the work.
 */
async function withPermit(redis, name, options, work) {
  const permit = await acquire(redis, name, options);
  let result;
  try {
    result = await work(permit);
  } catch (err) {
    await permit.release().catch(() => {}); // the work's own error wins
    throw err;
  }
  if (!(await permit.release())) throw permit._lostError;
  return result;
}

function checkSetOptions(semaphores, options) {
  const opts = {
    lease: 30,
    wait: null,
    fair: false,
    bound: false,
    id: null,
    autoRefresh: true,
    retryFor: RETRY_BUDGET,
    signal: null,
    ...options,
  };
  if (!Array.isArray(semaphores) || semaphores.length < 1 || semaphores.length > 64) {
    throw new TypeError("semaphores must be an array of 1 to 64 { name, limit, count }");
  }
  const sems = semaphores.map(({ name, limit, count = 1 }) => {
    if (!name) throw new TypeError("a semaphore name must not be empty");
    checkInteger(`the limit of ${name}`, limit, 1);
    checkInteger(`the count of ${name}`, count, 1);
    if (count > limit) {
      throw new TypeError(`the count of ${name} must be an integer from 1 to its limit`);
    }
    return { name, limit, count };
  });
  if (new Set(sems.map((sem) => String(sem.name))).size < sems.length) {
    throw new TypeError("a semaphore is named twice");
  }
  checkSeconds("lease", opts.lease, { positive: true, infinite: false });
  if (opts.wait != null) checkSeconds("wait", opts.wait, { positive: false, infinite: true });
  if (opts.id != null && opts.id.length === 0) {
    throw new TypeError("the identifier must not be empty");
  }
  checkRetryBudget(opts.retryFor);
  checkSignal(opts.signal);
  return { sems, opts };
}

function acquireAllArgs(sems, opts, id) {
  const args = ["SEM.ACQUIREALL", sems.length];
  for (const { name, limit, count } of sems) args.push(name, limit, count);
  args.push(seconds(opts.lease), "ID", id);
  if (opts.fair) args.push("FAIR", "WITHTICKET");
  if (opts.wait) args.push("WAIT", opts.wait === Infinity ? "0" : seconds(opts.wait));
  if (opts.bound) args.push("BOUND");
  return args;
}

/**
 * Takes permits of several semaphores for one identifier, all or none (SEM.ACQUIREALL), or
 * throws NotAcquired (then none is held).
 *
 * semaphores: [{ name, limit, count = 1 }, ...], 1 to 64 distinct names (in Redis Cluster,
 * sharing a slot). options: lease, wait, fair (every semaphore fair; `tickets` has one per
 * semaphore), bound, id, autoRefresh, as for acquire. A set that binds uses a connection of its
 * own, closed at its release; the others use `redis`, and a wait a pooled connection.
 */
async function acquireAll(redis, semaphores, options = {}) {
  const { sems, opts } = checkSetOptions(semaphores, options);
  const signal = opts.signal;
  if (signal && signal.aborted) throw signal.reason; // nothing sent
  const id = opts.id != null ? opts.id : randomUUID();
  const client = await reach(
    redis,
    sems.map((sem) => sem.name),
    opts.retryFor,
  );
  if (!client.module) throw moduleRequired("SEM.ACQUIREALL");
  const { conn, own } = await connectionFor(client, opts);
  let permits;
  try {
    if (signal && signal.aborted) throw signal.reason;
    const build = (wait) => acquireAllArgs(sems, { ...opts, wait }, id);
    const blocks = Boolean(opts.wait);
    const { reply, sent } = await sendWaiting(client, conn, own, opts.wait, build, blocks, signal);
    if (reply === null) {
      const wanted = sems.map((sem) => `${sem.name} (${sem.count} of ${sem.limit})`).join(", ");
      const waited = opts.wait ? ` within ${opts.wait} s` : "";
      throw new NotAcquired(`the set ${wanted} was not granted${waited}`);
    }
    const tickets = opts.fair ? reply[1].map(Number) : null;
    permits = new PermitSet(sems, opts, conn, own, id, tickets, sent);
    if (signal && signal.aborted) throw signal.reason; // granted as it was cancelled
    // A wait for the grant leaves the lease's start unknown: confirm it now.
    if (!(await permits._confirm(sent))) throw permits._lostError;
    if (signal && signal.aborted) throw signal.reason;
  } catch (err) {
    const names = sems.map((sem) => sem.name);
    const release = ["SEM.RELEASEALL", names.length, ...names, id];
    await giveBack(client, conn, own, permits, release, signal);
    throw signal && signal.aborted ? signal.reason : err;
  }
  if (opts.autoRefresh) permits._startRefreshing();
  return permits;
}

/** As withPermit, for a set: runs `work(permits)` holding every permit of the set. */
async function withPermits(redis, semaphores, options, work) {
  const permits = await acquireAll(redis, semaphores, options);
  let result;
  try {
    result = await work(permits);
  } catch (err) {
    await permits.release().catch(() => {}); // the work's own error wins
    throw err;
  }
  if (!(await permits.release())) throw permits._lostError;
  return result;
}

/**
 * Waits until the semaphore `name` has no live holder (SEM.WAITEMPTY): true once it has none
 * (at once if it has none now), false when `timeout` seconds pass first (Infinity: no limit;
 * 0 looks once). It takes nothing. It blocks its connection: a pooled one.
 * Without the module it rejects with ModuleRequired.
 */
async function waitEmpty(redis, name, timeout, options = {}) {
  if (!name) throw new TypeError("the semaphore name must not be empty");
  checkSeconds("timeout", timeout, { positive: false, infinite: true });
  const opts = callOptions(options);
  // The server reads 0 as "no limit": a timeout of 0 (or none left) looks for at most a
  // millisecond instead.
  const arg = (wait) => (wait == null ? "0.001" : wait === Infinity ? "0" : seconds(wait));
  const build = (wait) => ["SEM.WAITEMPTY", name, arg(wait)];
  const client = await reach(redis, [name], opts.retryFor);
  if (!client.module) throw moduleRequired("SEM.WAITEMPTY");
  // It blocks, even for a millisecond: on a pooled connection.
  const wait = timeout > 0 ? timeout : null;
  const { reply } = await sendWaiting(client, client, false, wait, build, true);
  return reply === 1;
}

/** The largest limit SEM.LIMIT stores (an unsigned 32-bit number). */
const MAX_LIMIT = 4294967295;

/**
 * The operator's limit stored for the semaphore `name` (SEM.LIMIT name), or null when there
 * is none. While one is stored, every acquire of `name` uses it instead of its own.
 */
async function storedLimit(redis, name, options = {}) {
  if (!name) throw new TypeError("the semaphore name must not be empty");
  const { retryFor } = callOptions(options);
  const reply = await semCall(await reach(redis, [name], retryFor), ["SEM.LIMIT", name]);
  return reply == null ? null : Number(reply);
}

/**
 * Stores an operator's limit for the semaphore `name` (SEM.LIMIT name n), 0 to 4294967295:
 * every acquire of `name` uses it instead of its own until clearLimit. 0 pauses the
 * semaphore; a lower limit takes no permit from its holders.
 */
async function setLimit(redis, name, limit, options = {}) {
  if (!name) throw new TypeError("the semaphore name must not be empty");
  if (!Number.isInteger(limit) || limit < 0 || limit > MAX_LIMIT) {
    throw new TypeError(`limit must be an integer from 0 to ${MAX_LIMIT} (0 pauses)`);
  }
  const { retryFor } = callOptions(options);
  await semCall(await reach(redis, [name], retryFor), ["SEM.LIMIT", name, limit]);
}

/**
 * Removes the operator's limit of the semaphore `name` (SEM.LIMIT name CLEAR): acquires use
 * their own limits again. Resolves with true if one was stored, else false.
 */
async function clearLimit(redis, name, options = {}) {
  if (!name) throw new TypeError("the semaphore name must not be empty");
  const { retryFor } = callOptions(options);
  const link = await reach(redis, [name], retryFor);
  return (await semCall(link, ["SEM.LIMIT", name, "CLEAR"])) === 1;
}

module.exports = {
  acquire,
  withPermit,
  acquireAll,
  withPermits,
  waitEmpty,
  storedLimit,
  setLimit,
  clearLimit,
  setPoolSize,
  Permit,
  PermitSet,
  SemaphoreError,
  NotAcquired,
  PermitLost,
  NotDurable,
  ModuleRequired,
};
