"use strict";
// Tests of redsem-client with node-redis (the `redis` package) against a real redis-server: the
// same permits as with ioredis, through node-redis's own calls (sendCommand, duplicate,
// connect, close). With REDSEM_BACKEND=scripts the server has no module (see server.js).

const assert = require("node:assert/strict");
const fs = require("node:fs");
const path = require("node:path");
const { after, before, beforeEach, test } = require("node:test");
const { setTimeout: sleep } = require("node:timers/promises");
const { createClient } = require("redis");

const {
  acquire,
  acquireAll,
  clearLimit,
  setLimit,
  setPoolSize,
  storedLimit,
  waitEmpty,
  withPermit,
  NotAcquired,
  PermitLost,
} = require("redsem-client");
const { startServer } = require("./server");
const {
  SCRIPTS,
  assertModuleRequired,
  assertTickets,
  callsSince,
  commandCalls,
  firstTicket,
  semArgs,
  sendFromElsewhere,
} = require("./helpers");

let server;
let redis;

before(async () => {
  server = await startServer();
  redis = await createClient({ url: `redis://127.0.0.1:${server.port}` }).connect();
});

after(async () => {
  await redis.close();
  await server.stop();
});

beforeEach(async () => {
  await redis.flushAll();
});

const live = (name) => redis.sendCommand(semArgs(["SEM.GET", name]).map(String));
// A fresh name's first fair ticket from now on: the module's fencing floor, then one up per
// grant; through the script, at least the server's clock (helpers.js).
const floor = async () => firstTicket(SCRIPTS ? "" : await redis.info("sem"), await redis.time());
const calls = async () => commandCalls(await redis.info("commandstats"));
const clients = async () => (await redis.clientList()).length;

async function waitUntil(what, condition, limitMs = 5000) {
  const deadline = Date.now() + limitMs;
  while (!(await condition())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting until ${what}`);
    await sleep(10);
  }
}

test("node-redis: the README's example, as written there, on the test server", async () => {
  const readme = fs.readFileSync(
    process.env.REDSEM_CLIENTS_README || path.join(__dirname, "../../README.md"),
    "utf8",
  );
  const blocks = [...readme.matchAll(/```javascript\n([\s\S]*?)```/g)].map((match) => match[1]);
  assert.equal(blocks.length, 1);
  const url = "redis://127.0.0.1:6379";
  assert.ok(blocks[0].includes(url));
  const code = blocks[0].replace(url, `redis://127.0.0.1:${server.port}`);
  const AsyncFunction = (async () => {}).constructor;
  const printed = [];
  const console = { log: (...args) => printed.push(args.join(" ")) };
  await new AsyncFunction("require", "console", code)(require, console);
  assert.match(printed.join("\n"), /^working as [0-9a-f-]{36}$/);
  assert.equal(await live("jobs"), 0);
});

test("node-redis: grant, refusal and release on the caller's connection", async () => {
  const before = await clients();
  const first = await acquire(redis, "jobs", { limit: 2, lease: 30, count: 2 });
  assert.deepEqual(await redis.zRange("jobs", 0, -1), [first.id]);
  assert.equal(await live("jobs"), 2);
  await assert.rejects(acquire(redis, "jobs", { limit: 2, lease: 30 }), NotAcquired);
  assert.equal(await clients(), before); // no connection of its own without wait or bound
  assert.equal(await first.releaseSome(1), true);
  assert.equal(await live("jobs"), 1);
  assert.equal(await first.release(), true);
  assert.equal(await redis.exists("jobs"), 0);
});

test("node-redis: fair tickets come back as numbers", async () => {
  const opts = { limit: 2, lease: 30, fair: true };
  const f = await floor();
  const result = await withPermit(redis, "printers", opts, async (permit) => {
    assertTickets([permit.ticket], f, [f]);
    assert.equal(await redis.zScore("printers:owner", permit.id), permit.ticket);
    return "done";
  });
  assert.equal(result, "done");
  assert.equal(await live("printers"), 0);
});

test("node-redis: a wait has a pooled connection of its own, kept for the next wait", async () => {
  const holder = await acquire(redis, "jobs", { limit: 1, lease: 30 });
  const before = await clients();
  const waiting = acquire(redis, "jobs", { limit: 1, lease: 30, wait: 10 });
  await waitUntil("the waiter connects", async () => (await clients()) === before + 1);
  assert.equal(await redis.ping(), "PONG"); // the shared connection is not blocked
  assert.equal(await holder.release(), true);
  const permit = await waiting;
  assert.deepEqual(await redis.zRange("jobs", 0, -1), [permit.id]);
  // The next wait blocks on the same connection, given back to the pool.
  const next = acquire(redis, "jobs", { limit: 1, lease: 30, wait: 10 });
  await sleep(200);
  assert.equal(await clients(), before + 1);
  assert.equal(await permit.release(), true);
  assert.equal(await (await next).release(), true);
  assert.equal(await clients(), before + 1);
  setPoolSize(redis, 0); // an empty pool keeps none
  await waitUntil("the pooled connection closes", async () => (await clients()) === before);
  setPoolSize(redis, 8);
});

test("node-redis: a wait times out", async () => {
  const holder = await acquire(redis, "jobs", { limit: 1, lease: 30 });
  const started = Date.now();
  await assert.rejects(acquire(redis, "jobs", { limit: 1, lease: 30, wait: 0.3 }), NotAcquired);
  const waited = Date.now() - started;
  assert.ok(waited >= 250 && waited < 5000, `waited ${waited} ms`);
  await holder.release();
});

test("node-redis: refresh keeps a short lease alive; a removed permit is lost", async () => {
  await withPermit(redis, "jobs", { limit: 1, lease: 0.6 }, async (permit) => {
    await sleep(1500); // more than two leases
    assert.equal(permit.lost, false);
  });
  await assert.rejects(
    withPermit(redis, "jobs", { limit: 1, lease: 0.6 }, async (permit) => {
      await redis.del("jobs");
      await permit.whenLost;
      assert.throws(() => permit.check(), PermitLost);
    }),
    PermitLost,
  );
});

test("node-redis: a bound permit is given back when its connection closes", async () => {
  if (SCRIPTS) {
    await storedLimit(redis, "jobs"); // the client has asked whether the module is there
    const connected = await clients();
    const before = await calls();
    await assertModuleRequired(acquire(redis, "jobs", { limit: 1, bound: true }), "BOUND");
    const waiting = acquire(redis, "jobs", { limit: 1, bound: true, wait: 1 });
    await assertModuleRequired(waiting, "BOUND");
    assert.deepEqual(callsSince(before, await calls()), {}, "nothing was sent");
    assert.equal(await clients(), connected, "no connection was opened");
    return;
  }
  const permit = await acquire(redis, "jobs", { limit: 1, lease: 3, bound: true });
  assert.equal(await live("jobs"), 1);
  await redis.sendCommand(["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"]);
  await waitUntil("the server gives the permit back", async () => (await live("jobs")) === 0, 2000);
  await permit.whenLost;
  assert.equal(await permit.release(), false);
});

test("node-redis: sets, tickets, a waiting set, a lost set and waitEmpty", async () => {
  const pair = [{ name: "gpu", limit: 1 }, { name: "licence", limit: 5, count: 2 }];
  if (SCRIPTS) {
    await storedLimit(redis, "gpu"); // the client has asked whether the module is there
    const connected = await clients();
    const before = await calls();
    await assertModuleRequired(acquireAll(redis, pair, { fair: true }), "SEM.ACQUIREALL");
    await assertModuleRequired(acquireAll(redis, pair, { wait: 10 }), "SEM.ACQUIREALL");
    await assertModuleRequired(waitEmpty(redis, "gpu", 10), "SEM.WAITEMPTY");
    assert.deepEqual(callsSince(before, await calls()), {}, "nothing was sent");
    assert.equal(await clients(), connected, "no connection was opened");
    assert.deepEqual([await redis.exists("gpu"), await redis.exists("licence")], [0, 0]);
    return;
  }
  const f = await floor();
  const permits = await acquireAll(redis, pair, { lease: 0.6, fair: true });
  // Two fresh names granted in one step: the clock of that step, then the next one up.
  assert.equal(permits.tickets[1], permits.tickets[0] + 1);
  assertTickets([permits.tickets[0]], f, [f]);
  const t = permits.tickets[0];
  await assert.rejects(acquireAll(redis, pair, { fair: true }), NotAcquired);
  assert.equal(await live("licence"), 2);
  assert.equal(await waitEmpty(redis, "gpu", 0.2), false);
  await sleep(1000);
  assert.equal(permits.lost, false); // refreshed
  const emptied = waitEmpty(redis, "gpu", 10);
  const waiting = acquireAll(redis, pair, { lease: 0.6, fair: true, wait: 10 });
  await sleep(200);
  assert.equal(await permits.release(), true);
  assert.equal(await emptied, true);
  const next = await waiting;
  // Each above every ticket handed out before, in the order named.
  assert.deepEqual(next.tickets, [t + 2, t + 3]);
  await redis.del("gpu");
  await next.whenLost;
  assert.throws(() => next.check(), PermitLost);
  assert.equal(await next.release(), false);
  assert.equal(await live("licence"), 0);
});

test("node-redis: an operator's limit is read, stored, used and cleared", async () => {
  assert.equal(await storedLimit(redis, "jobs"), null);
  await setLimit(redis, "jobs", 0);
  assert.equal(await storedLimit(redis, "jobs"), 0);
  await assert.rejects(acquire(redis, "jobs", { limit: 10 }), NotAcquired);
  await setLimit(redis, "jobs", 1);
  await withPermit(redis, "jobs", { limit: 10 }, async () => {
    await assert.rejects(acquire(redis, "jobs", { limit: 10 }), NotAcquired);
  });
  assert.equal(await clearLimit(redis, "jobs"), true);
  assert.equal(await storedLimit(redis, "jobs"), null);
  assert.equal(await clearLimit(redis, "jobs"), false);
  assert.equal(await live("jobs"), 0);
});

test("node-redis: 50 waits that block open at most the pool's size of connections", async () => {
  const client = await createClient({ url: `redis://127.0.0.1:${server.port}` }).connect();
  const connections = async () => {
    return Number(/total_connections_received:(\d+)/.exec(await redis.info("stats"))[1]);
  };
  const blocked = async () => Number(/blocked_clients:(\d+)/.exec(await redis.info("clients"))[1]);
  try {
    const before = await connections();
    for (let i = 0; i < 50; i++) {
      const holder = await acquire(client, "jobs", { limit: 1, lease: 30 });
      const waiting = acquire(client, "jobs", { limit: 1, lease: 30, wait: 10 });
      await waitUntil("the waiter blocks", async () => (await blocked()) === 1);
      assert.equal(await holder.release(), true);
      assert.equal(await (await waiting).release(), true);
    }
    const opened = (await connections()) - before;
    assert.ok(opened >= 1 && opened <= 8, `${opened} connections opened for 50 waits`);
  } finally {
    await client.close();
  }
});

test("node-redis: a signal cancels a wait; a grant that comes as it is cancelled is given back", async () => {
  const blocked = async () => Number(/blocked_clients:(\d+)/.exec(await redis.info("clients"))[1]);
  const holder = await acquire(redis, "jobs", { limit: 1, lease: 30 });
  const controller = new AbortController();
  const waiting = acquire(redis, "jobs", { limit: 1, wait: 10, signal: controller.signal });
  await waitUntil("the waiter blocks", async () => (await blocked()) === 1);
  controller.abort();
  const err = await waiting.catch((error) => error);
  assert.equal(err, controller.signal.reason);
  assert.equal(err.name, "AbortError");
  await waitUntil("its wait ends in the server", async () => (await blocked()) === 0);
  assert.equal(await holder.release(), true);
  assert.equal(await live("jobs"), 0);
  // The holder leaves from elsewhere, which grants the waiter: its answer waits unread.
  const take = semArgs(["SEM.ACQUIRE", "jobs", "1", "30", "ID", "holder"]).map(String);
  const held = await redis.sendCommand(take);
  assert.equal(SCRIPTS ? held[0] : held, "holder");
  const late = new AbortController();
  const second = acquire(redis, "jobs", { limit: 1, wait: 10, id: "late", signal: late.signal });
  await waitUntil("the waiter blocks", async () => (await blocked()) === 1);
  const release = semArgs(["SEM.RELEASE", "jobs", "holder"]);
  assert.equal(sendFromElsewhere(server.port, release), ":1\r\n");
  late.abort();
  assert.equal(await second.catch((error) => error), late.signal.reason);
  assert.equal(await live("jobs"), 0, "the grant was given back");
});
