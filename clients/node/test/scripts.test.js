"use strict";
// The package without the module, whatever REDSEM_BACKEND says: a server that has none (with
// MODULE LOAD allowed), where every operation runs as the script over the module's keys, with
// ioredis and with node-redis. Waiters wait in the script's line and are told of their grant on
// their own list <name>:wake:<id> at once when a permit is given back, and right after a lease
// runs out (TICK); loading the module on a live semaphore changes nothing for its holders and
// tickets, and the clients move to it.

const assert = require("node:assert/strict");
const { after, before, beforeEach, describe, test } = require("node:test");
const { setTimeout: sleep } = require("node:timers/promises");
const Redis = require("ioredis");
const { createClient } = require("redis");

const { acquire, setLimit, NotAcquired } = require("redsem-client");
const { moduleLoadArgs, startServerWithoutModule } = require("./server");
const helpers = require("./helpers");

const { SCRIPT_SHA, assertModuleRequired, callsSince, commandCalls, semArgs } = helpers;

// The two client libraries, as these tests use them: connect, send a command, close.
const libraries = {
  ioredis: {
    connect: async (port) => new Redis({ port }),
    call: (client, args) => client.call(...args),
    close: (client) => client.quit(),
  },
  "node-redis": {
    connect: async (port) => {
      const client = createClient({ url: `redis://127.0.0.1:${port}` });
      client.on("error", () => {});
      return client.connect();
    },
    call: (client, args) => client.sendCommand(args.map(String)),
    close: (client) => client.close(),
  },
};

for (const [library, lib] of Object.entries(libraries)) {
  describe(`${library}, without the module`, () => {
    let server;
    let redis;
    const call = (...args) => lib.call(redis, args);
    const live = (name, scripts = true) => call(...semArgs(["SEM.GET", name], scripts));
    const calls = async () => commandCalls(await call("INFO", "commandstats"));

    before(async () => {
      server = await startServerWithoutModule();
      redis = await lib.connect(server.port);
    });

    after(async () => {
      await lib.close(redis);
      await server.stop();
    });

    beforeEach(async () => {
      await call("FLUSHALL");
    });

    test("the script runs over the module's keys, loaded again after SCRIPT FLUSH", async () => {
      assert.deepEqual(await call("COMMAND", "INFO", "SEM.ACQUIRE"), [null]);
      const opts = { limit: 2, lease: 30, fair: true, count: 2, id: "desk-3" };
      const permit = await acquire(redis, "printers", opts);
      assert.equal(permit.id, "desk-3");
      assert.equal(Number(await call("ZSCORE", "printers:owner", "desk-3")), permit.ticket);
      assert.equal(Number(await call("GET", "printers:counter")), permit.ticket);
      assert.equal(await live("printers"), 2);
      // The package runs the repository's script, unchanged.
      assert.deepEqual(await call("SCRIPT", "EXISTS", SCRIPT_SHA), [1]);
      await call("SCRIPT", "FLUSH");
      const before = await calls();
      assert.equal(await permit.refresh(), true); // EVALSHA: NOSCRIPT, then EVAL
      const sent = callsSince(before, await calls()); // with the commands the script ran
      assert.deepEqual([sent.evalsha, sent.eval], [1, 1], JSON.stringify(sent));
      assert.deepEqual(await call("SCRIPT", "EXISTS", SCRIPT_SHA), [1]);
      assert.equal(await permit.release(), true);
      assert.equal(await call("EXISTS", "printers"), 0);
    });

    if (library === "ioredis") {
      test("an ioredis keyPrefix is refused: the script's keys would differ", async () => {
        const prefixed = new Redis({ port: server.port, keyPrefix: "app:" });
        try {
          for (const run of [
            () => acquire(prefixed, "jobs", { limit: 1 }),
            () => setLimit(prefixed, "jobs", 1),
          ]) {
            await assertModuleRequired(run(), "an ioredis keyPrefix");
          }
          assert.deepEqual(await call("KEYS", "*"), []);
        } finally {
          prefixed.disconnect();
        }
      });
    }

    test("a release serves a waiter at once, well before the re-check", async () => {
      const holder = await acquire(redis, "jobs", { limit: 1, lease: 30 });
      const started = performance.now();
      const waiting = acquire(redis, "jobs", { limit: 1, lease: 30, wait: 10 });
      await sleep(400); // the waiter blocks on its own list, jobs:wake:<id>
      const released = performance.now();
      assert.equal(await holder.release(), true);
      const permit = await waiting;
      const served = performance.now();
      assert.ok(served - released < 400, `served ${Math.round(served - released)} ms after`);
      assert.ok(served - started < 900, `before the re-check: ${Math.round(served - started)} ms`);
      assert.deepEqual(await call("ZRANGE", "jobs", 0, -1), [permit.id]);
      // The line's keys and the waiters' lists never linger without a TTL.
      for (const key of await call("KEYS", "jobs:*")) {
        if (/^jobs:(wake|line|places)/.test(key)) assert.notEqual(await call("PTTL", key), -1, key);
      }
      assert.deepEqual(await call("KEYS", "jobs:wake*"), []); // the grant was taken
      assert.equal(await permit.release(), true);
    });

    test("waiters are woken in the order they came", async () => {
      const holder = await acquire(redis, "jobs", { limit: 1, lease: 30 });
      const order = [];
      const first = acquire(redis, "jobs", { limit: 1, lease: 30, wait: 10 });
      first.then(() => order.push("first"));
      await sleep(100);
      const second = acquire(redis, "jobs", { limit: 1, lease: 30, wait: 10 });
      second.then(() => order.push("second"));
      await sleep(200);
      await holder.release();
      const next = await first;
      await sleep(100);
      assert.deepEqual(order, ["first"]);
      await next.release();
      await (await second).release();
      assert.deepEqual(order, ["first", "second"]);
    });

    test("a lease that runs out serves a waiter by the re-check", async () => {
      // Nobody releases: the waiter asks again when the lease ends (the script's retry_ms) ...
      const holder = await acquire(redis, "jobs", { limit: 1, lease: 0.5, autoRefresh: false });
      let started = performance.now();
      let permit = await acquire(redis, "jobs", { limit: 1, lease: 30, wait: 5 });
      let waited = performance.now() - started;
      assert.ok(waited > 300 && waited < 1000, `served after ${Math.round(waited)} ms`);
      assert.deepEqual(await call("ZRANGE", "jobs", 0, -1), [permit.id]);
      assert.equal(await holder.release(), false);
      assert.equal(await permit.release(), true);
      // ... and at least every second when it ends later.
      await acquire(redis, "jobs", { limit: 1, lease: 1.5, autoRefresh: false });
      started = performance.now();
      permit = await acquire(redis, "jobs", { limit: 1, lease: 30, wait: 5 });
      waited = performance.now() - started;
      assert.ok(waited > 1200 && waited < 2500, `served after ${Math.round(waited)} ms`);
      assert.equal(await permit.release(), true);
    });

    test("a paused semaphore: a waiter gives up when its wait ends, a raise serves it", async () => {
      await setLimit(redis, "jobs", 0);
      const started = performance.now();
      const refused = acquire(redis, "jobs", { limit: 1, lease: 30, wait: 0.5 });
      await assert.rejects(refused, NotAcquired);
      const waited = performance.now() - started;
      assert.ok(waited > 400 && waited < 1500, `gave up after ${Math.round(waited)} ms`);
      const waiting = acquire(redis, "jobs", { limit: 1, lease: 30, wait: 10 });
      await sleep(300);
      const raised = performance.now();
      await setLimit(redis, "jobs", 1);
      const permit = await waiting;
      assert.ok(performance.now() - raised < 250, "served at once");
      assert.equal(await permit.release(), true);
    });

    test("MODULE LOAD on a live semaphore: holders, tickets and waiters go on", async () => {
      const own = await startServerWithoutModule();
      const before = await lib.connect(own.port); // asks before the module is loaded
      let after;
      try {
        const plain = await acquire(before, "jobs", { limit: 2, lease: 30 });
        const fair = await acquire(before, "printers", { limit: 2, lease: 30, fair: true });
        await lib.call(before, moduleLoadArgs());
        after = await lib.connect(own.port); // asks after: the module
        // The holders of the scripts hold under the module, and the client that asked before
        // goes on with the script, which now runs the module's commands (within 10 s of its
        // question; its first acquire answers "the module is loaded" and moves it there).
        assert.equal(await lib.call(after, ["SEM.GET", "jobs"]), 1);
        assert.equal(await lib.call(after, ["SEM.REFRESH", "jobs", plain.id, "30"]), 1);
        assert.equal(await plain.refresh(), true);
        assert.equal(await fair.refresh(), true);
        const second = await acquire(after, "jobs", { limit: 2, lease: 30 });
        await assert.rejects(acquire(after, "jobs", { limit: 2, lease: 30 }), NotAcquired);
        await assert.rejects(acquire(before, "jobs", { limit: 2, lease: 30 }), NotAcquired);
        // Tickets go on growing.
        const next = await acquire(after, "printers", { limit: 2, lease: 30, fair: true });
        assert.ok(next.ticket > fair.ticket, `${next.ticket} after ${fair.ticket}`);
        assert.equal(await fair.release(), true);
        const third = await acquire(before, "printers", { limit: 2, lease: 30, fair: true });
        assert.ok(third.ticket > next.ticket, `${third.ticket} after ${next.ticket}`);
        // A waiter of the client that asked before waits with the module now, and is served
        // when the module releases.
        const waiting = acquire(before, "jobs", { limit: 2, lease: 30, wait: 10 });
        await sleep(200);
        const released = performance.now();
        assert.equal(await second.release(), true);
        const scriptWaiter = await waiting;
        const served = performance.now() - released;
        assert.ok(served < 1500, `the script's waiter is served after ${Math.round(served)} ms`);
        assert.equal(await plain.release(), true);
        const last = await acquire(after, "jobs", { limit: 2, lease: 30 });
        const calls = commandCalls(await lib.call(after, ["INFO", "commandstats"]));
        const moduleCalls = [calls["sem.acquire"], calls["sem.acquirefair"]];
        // The fair acquires: `next`, and `third` through the script, which ran the module's.
        assert.ok(moduleCalls[0] >= 3 && moduleCalls[1] === 2, JSON.stringify(calls));
        for (const permit of [last, scriptWaiter, next, third]) {
          assert.equal(await permit.release(), true);
        }
        assert.equal(await lib.call(after, ["SEM.GET", "jobs"]), 0);
        assert.equal(await lib.call(after, ["SEM.GET", "printers"]), 0);
      } finally {
        await lib.close(before);
        if (after) await lib.close(after);
        await own.stop();
      }
    });
  });
}
