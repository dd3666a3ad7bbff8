// The soak's Node worker: SOAK_THREADS loops, each with its own ioredis Cluster, take permits of
// the soak's names through redsem-client and log every call as one JSON line (the protocol of
// tests/soak/README.md; the environment as for worker.py).
"use strict";
const fs = require("fs");
const { performance } = require("perf_hooks");
const Redis = require("ioredis");
const { acquire, NotAcquired, NotDurable, PermitLost } = require("redsem-client");

const env = process.env;
const nodes = env.SOAK_NODES.split(",").map((n) => {
  const [host, port] = n.split(":");
  return { host, port: Number(port) };
});
const names = env.SOAK_NAMES.split(",").map((n) => {
  const [name, limit, kind] = n.split("=");
  return { name, limit: Number(limit), fair: kind === "fair" };
});
const seconds = Number(env.SOAK_SECONDS);
const threads = Number(env.SOAK_THREADS || 2);
const worker = env.SOAK_WORKER;
const retryFor = Number(env.SOAK_RETRY_FOR || 10);
const durableAllowed = env.SOAK_DURABLE === "1";
const out = fs.openSync(env.SOAK_OUT, "a");

// CLOCK_REALTIME in µs, finer than Date.now().
const nowUs = () => Math.round((performance.timeOrigin + performance.now()) * 1000);
const log = (record) => fs.writeSync(out, JSON.stringify(record) + "\n");
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// A small seeded generator (mulberry32), so that a seed repeats a run's choices.
function random(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

async function call(record, fn) {
  record.t0 = nowUs();
  let value = null;
  try {
    value = await fn();
  } catch (err) {
    if (err instanceof NotAcquired) {
      record.out = "not-acquired";
    } else if (err instanceof PermitLost) {
      record.out = "lost";
      record.err = String(err.message);
    } else if (err instanceof NotDurable) {
      record.out = "not-durable";
      record.err = String(err.message);
    } else {
      record.out = "error";
      record.err = `${err && err.name}: ${err && err.message}`;
    }
  }
  record.t1 = nowUs();
  return value;
}

async function loop(index) {
  const rng = random(Number(env.SOAK_SEED || 1) * 1000 + index);
  const pick = (list) => list[Math.floor(rng() * list.length)];
  const me = `${worker}.${index}`;
  const rc = new Redis.Cluster(nodes, { redisOptions: { commandTimeout: 5000 } });
  const end = performance.now() + seconds * 1000;
  let seq = 0;
  while (performance.now() < end) {
    seq += 1;
    const { name, limit, fair } = pick(names);
    const lease = pick([2, 3]);
    const wait = pick([0, 0, 1, 3]);
    const durable = durableAllowed && rng() < 0.2;
    const base = { w: me, p: `${me}#${seq}`, name, limit, lease: lease * 1000, retry_for: retryFor * 1000 };
    const rec = { ...base, op: "acquire", fair, wait: wait * 1000, durable };
    const options = { limit, lease, wait: wait || null, fair, autoRefresh: false, retryFor };
    if (durable) Object.assign(options, { durableReplicas: 1, durableTimeoutMs: 500 });
    const permit = await call(rec, () => acquire(rc, name, options));
    if (permit) {
      rec.out = "ok";
      rec.ticket = permit.ticket;
      rec.id = String(permit.id);
    }
    log(rec);
    if (!permit) {
      await sleep(rng() * 200);
      continue;
    }
    const refresh = async () => {
      const r = { ...base, op: "refresh" };
      const held = await call(r, () => permit.refresh());
      if (!r.out) r.out = held ? "ok" : "lost";
      log(r);
      return r.out === "ok";
    };
    const check = async () => {
      const r = { ...base, op: "check" };
      await call(r, () => permit.check());
      if (!r.out) r.out = "ok";
      log(r);
      return r.out === "ok";
    };
    // A wait for the grant leaves the lease's start unknown: confirm it, as the package does.
    let held = true;
    if ((rec.t1 - rec.t0) / 1e6 > lease / 3) held = await refresh();
    if (rng() < 0.15) {
      await sleep((lease + 0.3) * 1000); // overstay: the release should report the loss
    } else {
      const holdEnd = performance.now() + rng() * lease * 1600;
      while (held && performance.now() < holdEnd) {
        await sleep(Math.min((lease * 1000) / 3, Math.max(holdEnd - performance.now(), 0)));
        if (performance.now() < holdEnd) held = (await check()) && (await refresh());
      }
    }
    const r = { ...base, op: "release" };
    const released = await call(r, () => permit.release());
    if (!r.out) r.out = released ? "ok" : "lost";
    log(r);
    await sleep(rng() * 100);
  }
  rc.disconnect();
}

Promise.all(Array.from({ length: threads }, (_, i) => loop(i))).then(
  () => process.exit(0),
  (err) => {
    console.error(err);
    process.exit(1);
  },
);
