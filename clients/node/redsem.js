"use strict";
// Permits of a redsem semaphore (the Redis module `sem`) for ioredis 5 or node-redis 4 and 5
// (the `redis` package), CommonJS, Node 18+. The package redsem-client; types in redsem.d.ts.
//
//   const { withPermit } = require("redsem-client");
//   await withPermit(redis, "jobs", { limit: 3, lease: 30, wait: 10 }, async (permit) => {
//     // at most 3 holders here; permit.signal aborts if the permit is lost
//   });
//
// The identifier is made here (a UUID v4) unless `id` gives one, so when the client resends an
// acquire after a reconnection it renews the same holder rather than taking a second permit.

const { randomUUID } = require("node:crypto");
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

/** Seconds as the module reads them: digits and up to 3 decimals. */
function seconds(value) {
  let ms = Math.round(value * 1000);
  if (ms === 0 && value > 0) ms = 1; // a positive time never rounds down to "no time"
  return `${Math.floor(ms / 1000)}.${String(ms % 1000).padStart(3, "0")}`;
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
    ...options,
  };
  if (!name) throw new TypeError("the semaphore name must not be empty");
  if (!Number.isInteger(opts.limit) || opts.limit < 1) {
    throw new TypeError("limit must be an integer of at least 1");
  }
  if (!(opts.lease > 0)) throw new TypeError("lease must be a number of seconds greater than 0");
  if (opts.wait != null && !(opts.wait >= 0)) {
    throw new TypeError("wait must be null, or a number of seconds (Infinity: no limit)");
  }
  if (opts.count != null && (!Number.isInteger(opts.count) || opts.count < 1)) {
    throw new TypeError("count must be null or an integer of at least 1");
  }
  if (opts.id != null && opts.id.length === 0) {
    throw new TypeError("the identifier must not be empty");
  }
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
 * The four things a permit does with a connection (send a command, open a connection of its
 * own, close it, drop it), over either client library.
 */
function adapt(redis) {
  if (redis && typeof redis.call === "function" && typeof redis.duplicate === "function") {
    return {
      call: (...args) => redis.call(...args),
      // ioredis connects a duplicate by itself, and queues commands until it has.
      duplicate: async (override) => adapt(redis.duplicate(override)),
      close: () => redis.quit().catch(() => redis.disconnect()),
      destroy: () => redis.disconnect(),
      commandTimeout: redis.options && redis.options.commandTimeout,
    };
  }
  if (redis && typeof redis.sendCommand === "function" && typeof redis.duplicate === "function") {
    return {
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
          await Promise.resolve(
            typeof redis.destroy === "function" ? redis.destroy() : redis.disconnect(),
          ).catch(() => {});
        }
      },
      destroy: () => {
        const ended = typeof redis.destroy === "function" ? redis.destroy() : redis.disconnect();
        Promise.resolve(ended).catch(() => {});
      },
      commandTimeout: undefined,
    };
  }
  throw new TypeError("redis must be an ioredis client or a connected node-redis client");
}

/** The connection a permit uses: its own when it waits or binds, else the caller's. */
async function connectionFor(client, opts) {
  if (!opts.wait && !opts.bound && !opts.durableReplicas) return { conn: client, own: false };
  // WAIT blocks the connection it is sent on, BOUND ties the permit to it, and WAIT numreplicas
  // covers that connection's writes. An ioredis commandTimeout must outlast the server's wait.
  const override = {};
  const timeout = client.commandTimeout;
  if (timeout) {
    const durableMs = opts.durableReplicas ? opts.durableTimeoutMs : 0;
    const blockMs = Math.max((opts.wait || 0) * 1000, durableMs);
    override.commandTimeout = Number.isFinite(blockMs) ? timeout + blockMs : undefined;
  }
  return { conn: await client.duplicate(override), own: true };
}

const asyncDispose = Symbol.asyncDispose || Symbol.for("nodejs.asyncDispose");

class Permit {
  constructor(name, opts, conn, own, id, ticket, sent) {
    this.name = name;
    /** The holder's identifier: `id`, or the UUID v4 made for this permit. */
    this.id = id;
    /** The fencing ticket of a fair permit (only ever grows per name), else null. */
    this.ticket = ticket;
    /** The number of permits held (COUNT). */
    this.count = opts.count || 1;
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
    this._controller = new AbortController();
    /** Aborted (with the PermitLost error as its reason) when the permit is lost. */
    this.signal = this._controller.signal;
    /** Resolves with the PermitLost error when the permit is lost; never rejects. */
    this.whenLost = new Promise((resolve) => {
      this._resolveLost = resolve;
    });
    this._armDeadline();
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
    const reply = await this._conn.call("SEM.REFRESH", this.name, this.id, seconds(this.lease));
    if (reply === 1) {
      this._confirmedUntil = sent + this.lease * 1000;
      this._armDeadline();
      return true;
    }
    this._markLost("SEM.REFRESH answered 0 (the lease ran out, or the holder was removed)");
    return false;
  }

  /** Gives back `count` of a weighted permit's permits and keeps the rest. */
  async releaseSome(count) {
    if (this._released) throw new SemaphoreError("the permit was already released");
    if (!Number.isInteger(count) || count < 1 || count >= this.count) {
      throw new RangeError(`count must be from 1 to ${this.count - 1}; use release() for all`);
    }
    const reply = await this._conn.call("SEM.RELEASE", this.name, this.id, "COUNT", count);
    if (reply === 1) {
      this.count -= count;
      return true;
    }
    this._markLost("SEM.RELEASE answered 0: the lease ran out before the release");
    return false;
  }

  /**
   * Gives the permit back: true if it was held throughout, false if it was lost (the work it
   * guarded may have overlapped another holder's). Later calls give the same answer.
   */
  release() {
    if (!this._released) this._released = this._release();
    return this._released;
  }

  async _release() {
    this._noteDeadline();
    clearTimeout(this._timer);
    this._timer = null;
    clearTimeout(this._deadline);
    await this._refreshing; // a refresh under way finishes first
    let reply;
    try {
      reply = await this._conn.call("SEM.RELEASE", this.name, this.id);
    } catch (err) {
      this._markLost(`the release failed: ${err.message}`);
      throw err;
    } finally {
      if (this._own) await this._conn.close();
    }
    if (reply !== 1) this._markLost("SEM.RELEASE answered 0: the lease ran out before the release");
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
    this._lostError = new PermitLost(`the permit ${this.id} of ${this.name} was lost: ${reason}`);
    this._controller.abort(this._lostError);
    this._resolveLost(this._lostError);
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
 * durableTimeoutMs (WAIT for replicas after the grant), autoRefresh (default true).
 *
 * `redis` is an ioredis client or a connected node-redis client. A permit that waits, binds or
 * asks for replicas uses a connection of its own (`redis.duplicate()`), closed at its release;
 * the others use `redis`.
 */
async function acquire(redis, name, options = {}) {
  const opts = checkOptions(name, options);
  const id = opts.id != null ? opts.id : randomUUID();
  const { conn, own } = await connectionFor(adapt(redis), opts);
  let permit;
  try {
    const sent = performance.now();
    const reply = await conn.call(...acquireArgs(name, opts, id));
    if (reply === null) {
      const waited = opts.wait ? ` within ${opts.wait} s` : "";
      throw new NotAcquired(`no permit of ${name} (limit ${opts.limit}) was granted${waited}`);
    }
    const ticket = opts.fair ? Number(reply[1]) : null;
    permit = new Permit(name, opts, conn, own, id, ticket, sent);
    if (opts.durableReplicas) {
      const acked = await conn.call("WAIT", opts.durableReplicas, opts.durableTimeoutMs);
      if (acked < opts.durableReplicas) {
        throw new NotDurable(
          `${acked} of ${opts.durableReplicas} replicas acknowledged the grant of ${name} ` +
            `within ${opts.durableTimeoutMs} ms`,
          acked,
          opts.durableReplicas,
        );
      }
    }
    // A wait for the grant leaves the lease's start unknown: confirm it now.
    if (performance.now() - sent > (opts.lease * 1000) / 3 && !(await permit.refresh())) {
      throw permit._lostError;
    }
  } catch (err) {
    if (permit) {
      await permit.release().catch(() => {});
    } else if (own) {
      conn.destroy(); // a wait under way ends with its connection
    }
    throw err;
  }
  if (opts.autoRefresh) permit._startRefreshing();
  return permit;
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

module.exports = {
  acquire,
  withPermit,
  Permit,
  SemaphoreError,
  NotAcquired,
  PermitLost,
  NotDurable,
};
