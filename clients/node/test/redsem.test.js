"use strict";
// Tests of redsem-client with ioredis against a real redis-server with the module loaded
// (test/server.js), or without it (REDSEM_BACKEND=scripts): then the package runs its script,
// and what needs the module must reject with ModuleRequired.

const assert = require("node:assert/strict");
const fs = require("node:fs");
const path = require("node:path");
const util = require("node:util");
const { after, before, beforeEach, test } = require("node:test");
const { setTimeout: sleep } = require("node:timers/promises");
const Redis = require("ioredis");

const {
  acquire,
  acquireAll,
  clearLimit,
  setLimit,
  storedLimit,
  waitEmpty,
  withPermit,
  withPermits,
  NotAcquired,
  NotDurable,
  PermitLost,
} = require("redsem-client");
const { startServer } = require("./server");
const {
  SCRIPTS,
  SCRIPT_SHA,
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
  redis = new Redis({ port: server.port });
});

after(async () => {
  await redis.quit();
  await server.stop();
});

beforeEach(async () => {
  await redis.flushall();
});

const live = (name) => redis.call(...semArgs(["SEM.GET", name]));
// A fresh name's first fair ticket from now on: the module's fencing floor, then one up per
// grant; through the script, at least the server's clock (helpers.js).
const floor = async () => firstTicket(SCRIPTS ? "" : await redis.info("sem"), await redis.time());
const calls = async () => commandCalls(await redis.info("commandstats"));

async function waitUntil(what, condition, limitMs = 5000) {
  const deadline = Date.now() + limitMs;
  while (!(await condition())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting until ${what}`);
    await sleep(10);
  }
}

test("the README's example, as written there, on the test server", async () => {
  // REDSEM_CLIENTS_README: where the tests run from an installed copy, outside the repository.
  const readme = fs.readFileSync(
    process.env.REDSEM_CLIENTS_README || path.join(__dirname, "../../README.md"),
    "utf8",
  );
  const blocks = [...readme.matchAll(/```js\n([\s\S]*?)```/g)].map((match) => match[1]);
  assert.equal(blocks.length, 3);
  const AsyncFunction = (async () => {}).constructor;
  const printed = [];
  const console = { log: (...args) => printed.push(util.format(...args)) }; // as console.log prints
  // The clients the examples make, closed here should an example fail halfway.
  const made = [];
  class TestRedis extends Redis {
    constructor(...args) {
      super(...args);
      made.push(this);
    }
  }
  const required = (id) => (id === "ioredis" ? TestRedis : require(id));
  const f = await floor();
  try {
    for (const [i, block] of blocks.entries()) {
      assert.ok(block.includes("new Redis(6379)"));
      const code = block.replace("new Redis(6379)", `new Redis(${server.port})`);
      const run = new AsyncFunction("require", "console", code)(required, console);
      // The second takes a set and waits for empty, which scripts cannot do.
      if (SCRIPTS && i === 1) await assertModuleRequired(run, "SEM.ACQUIREALL");
      else await run;
    }
  } finally {
    for (const client of made) client.disconnect();
  }
  assert.ok(printed.some((line) => line.startsWith("working on 3 as")), printed.join("\n"));
  const ticket = Number(/has ticket (\d+)$/m.exec(printed.join("\n"))[1]);
  assertTickets([ticket], f, [f]);
  if (!SCRIPTS) {
    // Two fresh names granted in one step: the clock of that step, then the next one up.
    const pair = /holding gpu,licence with tickets (\d+),(\d+)$/m.exec(printed.join("\n"));
    assert.ok(pair && Number(pair[2]) === Number(pair[1]) + 1, printed.join("\n"));
    assertTickets([Number(pair[1])], f, [f]);
    assert.ok(printed.includes("drained: true"), printed.join("\n"));
  }
  assert.ok(printed.includes("paused; stored limit: 0"), printed.join("\n"));
  assert.ok(printed.includes("cleared: true stored limit: null"), printed.join("\n"));
  for (const name of ["jobs", "printers", "gpu", "licence", "deploys", "reports"]) {
    assert.equal(await live(name), 0, name);
  }
});

test("the package README's example, as written there, on the test server", async () => {
  // The README the package ships; its other example is the cluster's (cluster.test.js).
  const readme = fs.readFileSync(
    path.join(path.dirname(require.resolve("redsem-client")), "README.md"),
    "utf8",
  );
  const blocks = [...readme.matchAll(/```js\n([\s\S]*?)```/g)].map((match) => match[1]);
  assert.equal(blocks.length, 2);
  const example = blocks.find((block) => block.includes("new Redis(6379)"));
  const code = example.replace("new Redis(6379)", `new Redis(${server.port})`);
  const printed = [];
  const console = { log: (...args) => printed.push(util.format(...args)) };
  const made = [];
  class TestRedis extends Redis {
    constructor(...args) {
      super(...args);
      made.push(this);
    }
  }
  const required = (id) => (id === "ioredis" ? TestRedis : require(id));
  const AsyncFunction = (async () => {}).constructor;
  try {
    await new AsyncFunction("require", "console", code)(required, console);
  } finally {
    for (const client of made) client.disconnect();
  }
  const lines = printed.join("\n");
  assert.match(lines, /^working on 1 as [0-9a-f-]{36}$/m);
  assert.match(lines, /^working on 3 as [0-9a-f-]{36}$/m);
  assert.match(lines, /^held throughout: true$/m);
  assert.equal(await live("jobs"), 0);
});

test("grant and release", async () => {
  const permit = await acquire(redis, "jobs", { limit: 3, lease: 30 });
  try {
    assert.equal(await live("jobs"), 1);
    assert.notEqual(await redis.zscore("jobs", permit.id), null);
    assert.equal(permit.ticket, null);
    assert.equal(permit.lost, false);
  } finally {
    assert.equal(await permit.release(), true);
  }
  assert.equal(await redis.exists("jobs"), 0);
  assert.equal(await permit.release(), true); // the same answer again, nothing sent
});

test("withPermit returns the work's result and gives the permit back", async () => {
  const opts = { limit: 3, lease: 30, wait: 10 };
  const result = await withPermit(redis, "jobs", opts, async (permit) => {
    assert.deepEqual(await redis.zrange("jobs", 0, -1), [permit.id]);
    return "done";
  });
  assert.equal(result, "done");
  assert.equal(await live("jobs"), 0);
});

test("the limit refuses at once", async () => {
  const first = await acquire(redis, "jobs", { limit: 2, lease: 30 });
  const second = await acquire(redis, "jobs", { limit: 2, lease: 30 });
  const started = Date.now();
  await assert.rejects(acquire(redis, "jobs", { limit: 2, lease: 30 }), NotAcquired);
  assert.ok(Date.now() - started < 1000);
  assert.equal(await live("jobs"), 2);
  await first.release();
  await second.release();
  assert.equal(await live("jobs"), 0);
});

test("a wait times out", async () => {
  const holder = await acquire(redis, "jobs", { limit: 1, lease: 30 });
  const started = Date.now();
  await assert.rejects(acquire(redis, "jobs", { limit: 1, lease: 30, wait: 0.3 }), NotAcquired);
  const waited = Date.now() - started;
  assert.ok(waited >= 250 && waited < 5000, `waited ${waited} ms`);
  assert.equal(await live("jobs"), 1);
  await holder.release();
});

test("a wait is served when a holder leaves, without blocking the shared connection", async () => {
  const holder = await acquire(redis, "jobs", { limit: 1, lease: 30 });
  const waiting = acquire(redis, "jobs", { limit: 1, lease: 30, wait: Infinity });
  await sleep(200);
  assert.equal(await redis.ping(), "PONG"); // the waiter has a connection of its own
  assert.equal(await holder.release(), true);
  const permit = await waiting;
  assert.deepEqual(await redis.zrange("jobs", 0, -1), [permit.id]);
  await permit.release();
});

test("refresh keeps a short lease alive", async () => {
  await withPermit(redis, "jobs", { limit: 1, lease: 0.6 }, async (permit) => {
    await sleep(2000); // more than three leases
    assert.equal(permit.lost, false);
    assert.deepEqual(await redis.zrange("jobs", 0, -1), [permit.id]);
  });
  assert.equal(await live("jobs"), 0);
});

test("a permit removed by another client is lost", async () => {
  let seen;
  await assert.rejects(
    withPermit(redis, "jobs", { limit: 1, lease: 0.6 }, async (permit) => {
      // A signal read while held aborts when the permit is lost; one read after, is aborted.
      const early = permit.signal;
      assert.equal(early.aborted, false);
      const aborted = new Promise((resolve) => early.addEventListener("abort", resolve));
      await redis.del("jobs");
      seen = await permit.whenLost; // the refresher learns it within lease/3
      await aborted;
      assert.equal(early.reason, seen);
      assert.equal(permit.signal, early);
      assert.ok(permit.signal.aborted);
      assert.equal(permit.signal.reason, seen);
      assert.throws(() => permit.check(), PermitLost);
    }),
    PermitLost,
  );
  assert.match(seen.message, /SEM.REFRESH answered 0/);
});

test("signal and whenLost fire when the lease ends unrefreshed, with nobody asking", async () => {
  const started = performance.now();
  const permit = await acquire(redis, "jobs", { limit: 1, lease: 0.3, autoRefresh: false });
  const lost = await Promise.race([permit.whenLost, sleep(3000).then(() => null)]);
  assert.ok(lost instanceof PermitLost, "whenLost resolved");
  assert.ok(permit.signal.aborted);
  assert.ok(performance.now() - started < 2000, "on time");
  assert.equal(await permit.release(), false);
});

test("a lease that runs out during the work rejects; the work's own error wins", async () => {
  const opts = { limit: 1, lease: 0.2, autoRefresh: false };
  await assert.rejects(
    withPermit(redis, "jobs", opts, () => sleep(500)),
    PermitLost,
  );
  await assert.rejects(
    withPermit(redis, "jobs", opts, async () => {
      await sleep(500);
      throw new Error("the work failed");
    }),
    /the work failed/,
  );
  assert.equal(await live("jobs"), 0);
});

test("fair permits carry growing tickets", async () => {
  const opts = { limit: 2, lease: 30, fair: true };
  const f = await floor();
  const first = await acquire(redis, "printers", opts);
  const second = await acquire(redis, "printers", opts);
  assertTickets([first.ticket, second.ticket], f, [f, f + 1]);
  assert.equal(Number(await redis.zscore("printers:owner", second.id)), second.ticket);
  assert.equal(Number(await redis.get("printers:counter")), second.ticket);
  await assert.rejects(acquire(redis, "printers", { limit: 2, lease: 30 }), /fair holders/);
  await first.release();
  await second.release();
  const third = await acquire(redis, "printers", opts);
  assertTickets([first.ticket, second.ticket, third.ticket], f, [f, f + 1, f + 2]);
  await third.release();
});

test("a fair ticket after its keys went is above the one before", async () => {
  // A DEL of the name, its owner set and its counter, or FLUSHDB, between two fair grants most
  // often within one millisecond: the script starts again from the server's clock in
  // microseconds, the module above every ticket the node handed out.
  const opts = { limit: 1, lease: 30, fair: true, autoRefresh: false };
  const repeats = [];
  for (let round = 0; round < 200; round++) {
    const first = await acquire(redis, "fence", opts);
    if (round % 2) await redis.flushdb();
    else await redis.del("fence", "fence:owner", "fence:counter");
    const second = await acquire(redis, "fence", opts);
    if (!(second.ticket > first.ticket)) repeats.push([round, first.ticket, second.ticket]);
    assert.equal(await first.release(), false); // its keys went: lost
    assert.equal(await second.release(), true);
  }
  assert.deepEqual(repeats, [], `${repeats.length} of 200 rounds: [round, first, second]`);
});

test("count takes several permits and gives some back", async () => {
  const big = await acquire(redis, "gpus", { limit: 4, lease: 30, count: 3 });
  assert.equal(await live("gpus"), 3);
  await assert.rejects(acquire(redis, "gpus", { limit: 4, lease: 30, count: 2 }), NotAcquired);
  assert.equal(await big.releaseSome(2), true);
  assert.equal(big.count, 1);
  assert.equal(await live("gpus"), 1);
  assert.equal(await big.release(), true);
  assert.equal(await live("gpus"), 0);
});

test("a given identifier is used", async () => {
  await withPermit(redis, "jobs", { limit: 1, lease: 30, id: "worker-7" }, async (permit) => {
    assert.equal(permit.id, "worker-7");
    assert.deepEqual(await redis.zrange("jobs", 0, -1), ["worker-7"]);
  });
});

test("a bound permit is given back when its connection closes", async () => {
  if (SCRIPTS) {
    await storedLimit(redis, "jobs"); // the client has asked whether the module is there
    const before = await calls();
    await assertModuleRequired(acquire(redis, "jobs", { limit: 1, bound: true }), "BOUND");
    const waiting = acquire(redis, "jobs", { limit: 1, bound: true, wait: 1 });
    await assertModuleRequired(waiting, "BOUND");
    assert.deepEqual(callsSince(before, await calls()), {}, "nothing was sent");
    return;
  }
  const permit = await acquire(redis, "jobs", { limit: 1, lease: 3, bound: true });
  assert.equal(await live("jobs"), 1);
  // As if the holder's process died: its connection closes, and the server gives the permit
  // back at once, long before the lease ends.
  await redis.client("KILL", "TYPE", "normal", "SKIPME", "yes");
  await waitUntil("the server gives the permit back", async () => (await live("jobs")) === 0, 2000);
  await permit.whenLost; // the refresher (every second) learns it
  assert.equal(await permit.release(), false);
});

test("Symbol.asyncDispose releases, and throws when the permit was lost", async () => {
  const permit = await acquire(redis, "jobs", { limit: 1, lease: 30 });
  await permit[Symbol.asyncDispose]();
  assert.equal(await live("jobs"), 0);
  const short = await acquire(redis, "jobs", { limit: 1, lease: 0.2, autoRefresh: false });
  await sleep(400);
  await assert.rejects(short[Symbol.asyncDispose](), PermitLost);
});

test("durableReplicas waits for replicas; a grant they missed is given back", async () => {
  const primary = await startServer("--repl-diskless-sync-delay", "0");
  const replica = await startServer("--replicaof", "127.0.0.1", String(primary.port));
  const r = new Redis({ port: primary.port });
  const replicaR = new Redis({ port: replica.port });
  try {
    await waitUntil("the replica is in sync", async () =>
      (await replicaR.info("replication")).includes("master_link_status:up"), 20000);
    await withPermit(r, "jobs", { limit: 1, lease: 30, durableReplicas: 1 }, async (permit) => {
      assert.deepEqual(await replicaR.zrange("jobs", 0, -1), [permit.id]);
    });
    const opts = { limit: 1, lease: 30, durableReplicas: 2, durableTimeoutMs: 200 };
    const refused = await acquire(r, "jobs", opts).catch((err) => err);
    assert.ok(refused instanceof NotDurable, String(refused));
    assert.deepEqual([refused.acked, refused.wanted], [1, 2]);
    assert.equal(await r.call(...semArgs(["SEM.GET", "jobs"])), 0);
  } finally {
    await r.quit();
    await replicaR.quit();
    await replica.stop();
    await primary.stop();
  }
});

const pair = [
  { name: "gpu", limit: 2 },
  { name: "licence", limit: 5, count: 3 },
];

/** Through the script: `acquireAll` (and so every set test) rejects, having sent nothing. */
async function setNeedsModule(run) {
  await storedLimit(redis, "gpu"); // the client has asked whether the module is there
  const before = await calls();
  await assertModuleRequired(run(), "SEM.ACQUIREALL");
  assert.deepEqual(callsSince(before, await calls()), {}, "nothing was sent");
  assert.deepEqual([await redis.exists("gpu"), await redis.exists("licence")], [0, 0]);
}

test("non-finite, non-numeric and boolean numbers are refused by name, before anything is sent", async () => {
  const before = await calls();
  for (const bad of [Infinity, -Infinity, NaN, "10", true, false, null, 2.5]) {
    const cases = [
      ["limit", () => acquire(redis, "jobs", { limit: bad })],
      ["lease", () => acquire(redis, "jobs", { limit: 1, lease: bad })],
      ["durableReplicas", () => acquire(redis, "jobs", { limit: 1, durableReplicas: bad })],
      ["the limit of gpu", () => acquireAll(redis, [{ name: "gpu", limit: bad }])],
      ["the count of gpu", () => acquireAll(redis, [{ name: "gpu", limit: 2, count: bad }])],
      ["lease", () => acquireAll(redis, [{ name: "gpu", limit: 2 }], { lease: bad })],
    ];
    if (bad !== null) cases.push(["count", () => acquire(redis, "jobs", { limit: 3, count: bad })]);
    // Infinity waits without limit, null does not wait, 2.5 s is a wait.
    if (bad !== Infinity && bad !== null && bad !== 2.5) {
      cases.push(["wait", () => acquire(redis, "jobs", { limit: 1, wait: bad })]);
      cases.push(["timeout", () => waitEmpty(redis, "jobs", bad)]);
    }
    // A lease of 2.5 s is one; the rest of 2.5's cases are integers.
    const refused = cases.filter(([what]) => !(bad === 2.5 && what === "lease"));
    for (const [what, call] of refused) {
      await assert.rejects(
        async () => call(),
        (err) => err instanceof TypeError && err.message.startsWith(`${what} must be`),
        `${what}: ${String(bad)}`,
      );
    }
  }
  assert.deepEqual(callsSince(before, await calls()), {}, "nothing was sent");
  assert.equal(await redis.exists("jobs", "gpu"), 0);
});

test("a set is granted whole and given back whole", async () => {
  if (SCRIPTS) return setNeedsModule(() => acquireAll(redis, pair, { lease: 30 }));
  const permits = await acquireAll(redis, pair, { lease: 30 });
  assert.deepEqual(permits.names, ["gpu", "licence"]);
  assert.deepEqual(permits.counts, [1, 3]);
  assert.equal(permits.tickets, null);
  assert.equal(permits.lost, false);
  assert.deepEqual([await live("gpu"), await live("licence")], [1, 3]);
  assert.deepEqual(await redis.zrange("gpu", 0, -1), [permits.id]);
  assert.equal(await permits.release(), true);
  assert.deepEqual([await live("gpu"), await live("licence")], [0, 0]);
  assert.equal(await permits.release(), true); // the same answer again, nothing sent
});

test("one full semaphore refuses the set, and nothing is held", async () => {
  const holder = await acquire(redis, "licence", { limit: 1, lease: 30 });
  const started = Date.now();
  const sets = [{ name: "gpu", limit: 2 }, { name: "licence", limit: 1 }];
  if (SCRIPTS) await assertModuleRequired(acquireAll(redis, sets, { lease: 30 }), "SEM.ACQUIREALL");
  else await assert.rejects(acquireAll(redis, sets, { lease: 30 }), NotAcquired);
  assert.ok(Date.now() - started < 1000);
  assert.equal(await redis.exists("gpu"), 0);
  assert.equal(await live("licence"), 1);
  await holder.release();
  await assert.rejects(acquireAll(redis, [pair[0], pair[0]]), TypeError);
  await assert.rejects(acquireAll(redis, [{ name: "gpu", limit: 2, count: 3 }]), TypeError);
});

test("a fair set carries one ticket per semaphore", async () => {
  if (SCRIPTS) return setNeedsModule(() => withPermits(redis, pair, { fair: true }, () => {}));
  const f = await floor();
  const single = await acquire(redis, "licence", { limit: 5, lease: 30, fair: true });
  assertTickets([single.ticket], f, [f]);
  const t = single.ticket;
  await withPermits(redis, pair, { fair: true }, async (permits) => {
    // gpu is fresh (the clock of this grant), licence goes on from its counter, and above
    // gpu's ticket, handed out before it in the same step.
    const gpu = permits.tickets[0];
    assertTickets([gpu], f, [f]);
    const licence = Math.max(t + 1, gpu + 1);
    assert.equal(permits.tickets[1], licence);
    assert.equal(Number(await redis.zscore("licence:owner", permits.id)), licence);
  });
  await single.release();
});

test("a waiting set is granted when a member is freed, on its own connection", async () => {
  if (SCRIPTS) return setNeedsModule(() => acquireAll(redis, pair, { lease: 30, wait: 10 }));
  const holder = await acquire(redis, "licence", { limit: 5, lease: 30, count: 3 });
  await assert.rejects(acquireAll(redis, pair, { wait: 0.2 }), NotAcquired);
  const waiting = acquireAll(redis, pair, { lease: 30, wait: 10 });
  await sleep(200);
  assert.equal(await redis.ping(), "PONG"); // the waiter has a connection of its own
  assert.equal(await live("gpu"), 0);
  assert.equal(await holder.release(), true);
  const permits = await waiting;
  assert.deepEqual(await redis.zrange("gpu", 0, -1), [permits.id]);
  assert.deepEqual(await redis.zrange("licence", 0, -1), [permits.id]);
  assert.equal(await permits.release(), true);
  assert.deepEqual([await live("gpu"), await live("licence")], [0, 0]);
});

test("refresh keeps a set alive; a member removed by another client loses the set", async () => {
  if (SCRIPTS) return setNeedsModule(() => withPermits(redis, pair, { lease: 0.6 }, () => {}));
  await withPermits(redis, pair, { lease: 0.6 }, async (permits) => {
    await sleep(2000); // more than three leases
    assert.equal(permits.lost, false);
    assert.deepEqual(await redis.zrange("licence", 0, -1), [permits.id]);
  });
  let seen;
  await assert.rejects(
    withPermits(redis, pair, { lease: 0.6 }, async (permits) => {
      await redis.del("licence");
      seen = await permits.whenLost;
      assert.ok(permits.signal.aborted);
      assert.throws(() => permits.check(), PermitLost);
    }),
    PermitLost,
  );
  assert.match(seen.message, /SEM.REFRESHALL answered 1 of 2/);
  assert.deepEqual([await live("gpu"), await live("licence")], [0, 0]);
});

test("waitEmpty: true once the holders leave, false at the timeout", async () => {
  if (SCRIPTS) {
    await storedLimit(redis, "jobs"); // the client has asked whether the module is there
    const before = await calls();
    for (const timeout of [10, 0, Infinity]) {
      await assertModuleRequired(waitEmpty(redis, "jobs", timeout), "SEM.WAITEMPTY");
    }
    assert.deepEqual(callsSince(before, await calls()), {}, "nothing was sent");
    return;
  }
  assert.equal(await waitEmpty(redis, "jobs", 10), true); // no holder: at once
  const holder = await acquire(redis, "jobs", { limit: 3, lease: 30 });
  const started = Date.now();
  assert.equal(await waitEmpty(redis, "jobs", 0.3), false);
  assert.ok(Date.now() - started >= 250);
  assert.equal(await waitEmpty(redis, "jobs", 0), false); // looks once
  const waiting = waitEmpty(redis, "jobs", Infinity);
  await sleep(200);
  assert.equal(await redis.ping(), "PONG"); // it has a connection of its own
  assert.equal(await holder.release(), true);
  assert.equal(await waiting, true);
});

test("an operator's limit is stored, used by every acquire instead of its own, and cleared", async () => {
  assert.equal(await storedLimit(redis, "jobs"), null);
  assert.equal(await clearLimit(redis, "jobs"), false);
  await setLimit(redis, "jobs", 0); // pauses
  assert.equal(await storedLimit(redis, "jobs"), 0);
  await assert.rejects(acquire(redis, "jobs", { limit: 10 }), NotAcquired);
  const set = acquireAll(redis, [{ name: "jobs", limit: 10 }]);
  if (SCRIPTS) await assertModuleRequired(set, "SEM.ACQUIREALL");
  else await assert.rejects(set, NotAcquired);
  assert.equal(await live("jobs"), 0);
  await setLimit(redis, "jobs", 2);
  assert.equal(await storedLimit(redis, "jobs"), 2);
  const first = await acquire(redis, "jobs", { limit: 10 });
  const second = await acquire(redis, "jobs", { limit: 10 });
  await assert.rejects(acquire(redis, "jobs", { limit: 10 }), NotAcquired); // 2, not 10
  // Raised, a waiter is served at once.
  const waiting = acquire(redis, "jobs", { limit: 10, wait: 10 });
  await sleep(100);
  await setLimit(redis, "jobs", 4294967295);
  const third = await waiting;
  assert.equal(await storedLimit(redis, "jobs"), 4294967295);
  assert.equal(await clearLimit(redis, "jobs"), true);
  assert.equal(await storedLimit(redis, "jobs"), null);
  assert.equal(await clearLimit(redis, "jobs"), false);
  for (const permit of [first, second, third]) assert.equal(await permit.release(), true);
  for (const bad of [-1, 4294967296, 1.5, "3", null]) {
    await assert.rejects(setLimit(redis, "jobs", bad), TypeError);
  }
  await assert.rejects(storedLimit(redis, ""), TypeError);
  assert.equal(await redis.exists("jobs:limit"), 0);
});

test("the backend is asked once per client; then only its own commands are sent", async () => {
  const client = new Redis({ port: server.port });
  try {
    const before = await calls();
    await withPermit(client, "jobs", { limit: 2, lease: 30, fair: true }, async (permit) => {
      await permit.refresh();
    });
    await withPermit(client, "jobs", { limit: 2, lease: 30, wait: 1 }, () => {});
    await setLimit(client, "jobs", 3);
    assert.equal(await storedLimit(client, "jobs"), 3);
    assert.equal(await clearLimit(client, "jobs"), true);
    const sent = callsSince(before, await calls());
    // Each run of the script asks COMMAND INFO itself (is the module loaded now?): each
    // EVALSHA ran it or answered NOSCRIPT, and then the EVAL did.
    const scriptRuns = SCRIPTS ? sent.evalsha : 0;
    assert.equal(sent["command|info"], 1 + scriptRuns, JSON.stringify(sent));
    delete sent["command|info"];
    if (SCRIPTS) {
      // EVALSHA of the repository's script, which the package carries unchanged (EVAL once per
      // text, the first acquire's and the allow-oom one, if not loaded yet: NOSCRIPT); the
      // commands the script runs are counted too.
      assert.deepEqual(await redis.script("EXISTS", SCRIPT_SHA), [1]);
      assert.ok(sent.evalsha >= 8 && !(sent.eval > 2), JSON.stringify(sent));
      assert.ok(!Object.keys(sent).some((command) => command.startsWith("sem.")));
    } else {
      // With the module, the wire is as before: the module's commands, no script (the module's
      // own calls, such as GET, are counted too).
      const ours = Object.keys(sent).filter((command) => /^(sem\.|eval)/.test(command));
      assert.deepEqual(Object.fromEntries(ours.map((command) => [command, sent[command]])), {
        "sem.acquirefair": 1,
        "sem.refresh": 1,
        "sem.release": 2,
        "sem.acquire": 1,
        "sem.limit": 3,
      });
    }
  } finally {
    await client.quit();
  }
});

test("waits reuse pooled connections: 50 waits that block open at most the pool's size", async () => {
  const client = new Redis({ port: server.port }); // its own pool, empty
  const connections = async () => {
    return Number(/total_connections_received:(\d+)/.exec(await redis.info("stats"))[1]);
  };
  const blocked = async () => Number(/blocked_clients:(\d+)/.exec(await redis.info("clients"))[1]);
  try {
    await client.ping();
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
    await client.quit();
  }
});

test("a wait unblocked with an error waits again on a new connection; a dead idle one is not reused", async () => {
  const client = new Redis({ port: server.port });
  const ids = async () => {
    const list = await redis.client("LIST");
    return new Set([...list.matchAll(/^id=(\d+)/gm)].map((match) => match[1]));
  };
  const blocked = async () => Number(/blocked_clients:(\d+)/.exec(await redis.info("clients"))[1]);
  try {
    await client.ping();
    const holder = await acquire(client, "jobs", { limit: 1, lease: 30 });
    const first = await ids();
    const started = Date.now();
    const waiting = acquire(client, "jobs", { limit: 1, lease: 30, wait: 10 });
    let blocking;
    await waitUntil("the waiter blocks", async () => {
      [blocking] = [...(await ids())].filter((id) => !first.has(id));
      return blocking && (await blocked()) === 1;
    });
    // As a failover does to blocked clients: the wait ends with an error.
    assert.equal(await redis.client("UNBLOCK", blocking, "ERROR"), 1);
    await waitUntil("its connection closes", async () => !(await ids()).has(blocking));
    await waitUntil("the waiter blocks again", async () => (await blocked()) === 1);
    const [again] = [...(await ids())].filter((id) => !first.has(id));
    assert.ok(again && again !== blocking, "the wait goes on on a new pooled connection");
    assert.equal(await holder.release(), true);
    const served = await waiting;
    assert.ok(Date.now() - started < 10000, "served within its wait");
    assert.equal(await live("jobs"), 1);
    assert.equal(await served.release(), true);
    // That connection went back to the pool; killed while idle, it is not handed out again.
    const other = await acquire(client, "jobs", { limit: 1, lease: 30 });
    await redis.client("KILL", "ID", again);
    await assert.rejects(acquire(client, "jobs", { limit: 1, lease: 30, wait: 0.3 }), NotAcquired);
    const [pooled] = [...(await ids())].filter((id) => !first.has(id));
    assert.ok(pooled && pooled !== again, "a new pooled connection");
    assert.equal(await other.release(), true);
    assert.equal(await live("jobs"), 0);
  } finally {
    await client.quit();
  }
});

const blockedClients = async () =>
  Number(/blocked_clients:(\d+)/.exec(await redis.info("clients"))[1]);

/** Waiters in the script's line of `name` (none with the module, which keeps no such key). */
const inLine = (name) => redis.zcard(`${name}:line`);

test("a signal cancels a waiting acquire: its wait ends in the server, it rejects with the reason", async () => {
  const holder = await acquire(redis, "jobs", { limit: 1, lease: 30 });
  const controller = new AbortController();
  let worked = false;
  const opts = { limit: 1, wait: 10, signal: controller.signal };
  const waiting = withPermit(redis, "jobs", opts, () => {
    worked = true;
  });
  await waitUntil("the waiter blocks", async () => (await blockedClients()) === 1);
  const started = Date.now();
  controller.abort();
  const err = await waiting.catch((error) => error);
  assert.ok(Date.now() - started < 1000, "rejected at once");
  assert.equal(err, controller.signal.reason);
  assert.equal(err.name, "AbortError"); // as fetch rejects
  assert.equal(worked, false);
  // Its wait is over in the server: nobody blocks, nobody is in line.
  await waitUntil("its wait ends in the server", async () => (await blockedClients()) === 0);
  assert.equal(await inLine("jobs"), 0);
  // The permit freed goes to nobody.
  assert.equal(await holder.release(), true);
  await sleep(100);
  assert.equal(await live("jobs"), 0);
  assert.equal(await redis.exists("jobs"), 0);
});

test("a grant that comes as a wait is cancelled is given back, never refreshed", async () => {
  for (const fair of [false, true]) {
    const holder = [fair ? "SEM.ACQUIREFAIR" : "SEM.ACQUIRE", "jobs", 1, 30, "ID", "holder"];
    const held = await redis.call(...semArgs(holder));
    assert.equal(SCRIPTS ? held[0] : held, "holder"); // the script answers [reply, retry, ahead]
    const controller = new AbortController();
    const reason = new Error("no longer wanted");
    const id = `waiter-${fair}`;
    const opts = { limit: 1, lease: 0.9, wait: 10, fair, id, signal: controller.signal };
    const waiting = acquire(redis, "jobs", opts);
    await waitUntil("the waiter blocks", async () => (await blockedClients()) === 1);
    // The holder leaves, which grants the waiter: its answer waits unread when the wait is
    // cancelled.
    const release = semArgs(["SEM.RELEASE", "jobs", "holder"]);
    assert.equal(sendFromElsewhere(server.port, release), ":1\r\n");
    controller.abort(reason);
    assert.equal(await waiting.catch((error) => error), reason);
    assert.equal(await live("jobs"), 0, "the grant was given back");
    assert.equal(await redis.zscore("jobs", id), null);
    // Nothing refreshes it: nothing comes back.
    await sleep(700);
    assert.equal(await live("jobs"), 0);
  }
});

test("an already-aborted signal rejects at once, sending nothing", async () => {
  await storedLimit(redis, "jobs"); // the client has asked whether the module is there
  const before = await calls();
  const signal = AbortSignal.abort();
  const opts = { limit: 1, lease: 30, wait: 10, signal };
  const work = () => assert.fail("no work without a permit");
  for (const call of [
    () => acquire(redis, "jobs", opts),
    () => withPermit(redis, "jobs", opts, work),
    () => acquireAll(redis, pair, { wait: 10, signal }),
    () => withPermits(redis, pair, { signal }, work),
  ]) {
    await assert.rejects(call(), (err) => err === signal.reason && err.name === "AbortError");
  }
  assert.deepEqual(callsSince(before, await calls()), {}, "nothing was sent");
  // A signal must be an AbortSignal.
  for (const bad of ["abort", {}, true]) {
    await assert.rejects(acquire(redis, "jobs", { limit: 1, signal: bad }), TypeError);
    await assert.rejects(acquireAll(redis, pair, { signal: bad }), TypeError);
  }
  assert.equal(await redis.dbsize(), 0);
});

test("a signal cancels a waiting set, and a set granted as it is cancelled is given back", async () => {
  if (SCRIPTS) {
    const signal = new AbortController().signal;
    return setNeedsModule(() => acquireAll(redis, pair, { wait: 10, signal }));
  }
  const holder = await acquire(redis, "gpu", { limit: 2, lease: 30, count: 2 });
  const controller = new AbortController();
  const waiting = withPermits(redis, pair, { wait: 10, signal: controller.signal }, () =>
    assert.fail("no work without the permits"),
  );
  await waitUntil("the set waits", async () => (await blockedClients()) === 1);
  controller.abort();
  assert.equal(await waiting.catch((error) => error), controller.signal.reason);
  await waitUntil("its wait ends in the server", async () => (await blockedClients()) === 0);
  assert.deepEqual([await live("gpu"), await live("licence")], [2, 0]);
  // Granted as it is cancelled (its answer unread): given back whole.
  const late = new AbortController();
  const second = acquireAll(redis, pair, { wait: 10, signal: late.signal });
  await waitUntil("the set waits", async () => (await blockedClients()) === 1);
  assert.equal(sendFromElsewhere(server.port, ["SEM.RELEASE", "gpu", holder.id]), ":1\r\n");
  late.abort();
  assert.equal(await second.catch((error) => error), late.signal.reason);
  assert.deepEqual([await live("gpu"), await live("licence")], [0, 0]);
});

test("a release that fails with a connection error leaves the permit releasable", async () => {
  // Without an offline queue, a command sent while the connection is down fails at once.
  const client = new Redis({ port: server.port, enableOfflineQueue: false, lazyConnect: true });
  try {
    await client.connect();
    const permit = await acquire(client, "jobs", { limit: 1, lease: 30 });
    await redis.client("KILL", "ID", String(await client.client("ID")));
    await waitUntil("the client sees its connection closed", () => client.status !== "ready");
    await assert.rejects(permit.release(), /enableOfflineQueue/);
    assert.equal(await live("jobs"), 1, "still held");
    assert.equal(permit.lost, false);
    await waitUntil("the client is back", () => client.status === "ready");
    assert.equal(await permit.release(), true);
    assert.equal(await live("jobs"), 0);
    assert.equal(await permit.release(), true); // the same answer again
  } finally {
    client.disconnect();
  }
});
