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

const { SCRIPTS, SCRIPT_SHA, assertModuleRequired, callsSince, commandCalls, semArgs } = helpers;

async function waitUntil(what, condition, limitMs = 5000) {
  const deadline = Date.now() + limitMs;
  while (!(await condition())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting until ${what}`);
    await sleep(10);
  }
}

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

    for (const fair of [true, false]) {
      const kind = fair ? "fair" : "plain";
      test(`first come, first served (${kind}): waiters are granted in the order they came`, async () => {
        const opts = { limit: 1, lease: 30, fair };
        const holder = await acquire(redis, "jobs", opts);
        const order = [];
        const waiters = [];
        for (let i = 0; i < 6; i++) {
          const waiter = acquire(redis, "jobs", { ...opts, wait: 20 }).then(async (permit) => {
            order.push(i);
            assert.equal(await permit.release(), true); // the next one's turn, at once
          });
          waiters.push(waiter);
          await sleep(30);
        }
        assert.equal(await holder.release(), true);
        await Promise.all(waiters);
        assert.deepEqual(order, [0, 1, 2, 3, 4, 5]);
        // Nothing is left of the line and the lists; a fair name keeps its counter.
        assert.deepEqual(await call("KEYS", "jobs*"), fair ? ["jobs:counter"] : []);
      });
    }

    test("a waiter told when a lease ends (H<ms>) sends TICK then, without another try", async () => {
      const spy = new Redis({ port: server.port });
      const monitor = await spy.monitor();
      const seen = [];
      monitor.on("monitor", (time, args) => seen.push(args.map(String)));
      try {
        const holder = await acquire(redis, "told", { limit: 1, lease: 30 });
        const waiter = (id, lease) =>
          acquire(redis, "told", { limit: 1, lease, wait: 5, id, autoRefresh: false }).then(
            (permit) => ({ permit, at: performance.now() }),
          );
        const first = waiter("w1", 0.6);
        await waitUntil("w1 is in line", async () => Number(await call("ZCARD", "told:line")) === 1);
        const second = waiter("w2", 30);
        await waitUntil("w2 is in line", async () => Number(await call("ZCARD", "told:line")) === 2);
        assert.equal(await holder.release(), true); // w1 holds 0.6 s; w2 is told when that ends
        const [one, two] = await Promise.all([first, second]);
        const after = two.at - one.at;
        assert.ok(after > 500 && after < 800, `w2 granted ${Math.round(after)} ms after w1`);
        await sleep(50); // the last of the monitor's lines
        const tries = seen.filter((args) => args.includes("ACQUIRE") && args.includes("w2"));
        const ticks = seen.filter((args) => args.includes("TICK"));
        assert.equal(tries.length, 1, JSON.stringify(tries)); // the one that took its place
        assert.equal(ticks.length, 1, JSON.stringify(ticks));
        await one.permit.release();
        await two.permit.release();
      } finally {
        monitor.disconnect();
        spy.disconnect();
      }
    });

    test("at hz 1 a lease's end serves the first waiter at once (TICK), and so does a release", async () => {
      const [, hz] = await call("CONFIG", "GET", "hz");
      await call("CONFIG", "SET", "hz", "1");
      try {
        // The lease ends 300 ms after the holder's acquire was sent, or a little later.
        const sent = performance.now();
        const holder = await acquire(redis, "jobs", { limit: 1, lease: 0.3, autoRefresh: false });
        const permit = await acquire(redis, "jobs", { limit: 1, lease: 30, wait: 5 });
        const late = performance.now() - (sent + 300);
        assert.ok(late < 150, `granted ${Math.round(late)} ms after the lease's end`);
        assert.equal(await holder.release(), false);
        const waiting = acquire(redis, "jobs", { limit: 1, lease: 30, wait: 5 });
        await sleep(300);
        assert.equal(await permit.release(), true);
        const released = performance.now();
        const next = await waiting;
        const after = performance.now() - released;
        assert.ok(after < 50, `granted ${Math.round(after)} ms after the release's reply`);
        assert.equal(await next.release(), true);
      } finally {
        await call("CONFIG", "SET", "hz", hz);
      }
    });

    test("memory full: refresh and release work; an acquire gets the server's OOM error and changes nothing", async () => {
      const holder = await acquire(redis, "jobs", { limit: 3, lease: 30, fair: true });
      const [, policy] = await call("CONFIG", "GET", "maxmemory-policy");
      const [, maxmemory] = await call("CONFIG", "GET", "maxmemory");
      // Every key's type and contents.
      const snapshot = async () => {
        const keys = (await call("KEYS", "*")).sort();
        const read = {
          zset: (key) => call("ZRANGE", key, 0, -1, "WITHSCORES"),
          hash: (key) => call("HGETALL", key),
          string: (key) => call("GET", key),
          list: (key) => call("LRANGE", key, 0, -1),
        };
        const contents = [];
        for (const key of keys) {
          const type = String(await call("TYPE", key));
          contents.push([key, type, await read[type](key)]);
        }
        return contents;
      };
      await call("CONFIG", "SET", "maxmemory-policy", "noeviction");
      await call("CONFIG", "SET", "maxmemory", "1");
      try {
        const before = await snapshot();
        const oom = (err) => /^OOM command not allowed when used memory > 'maxmemory'/.test(err.message);
        for (const wait of [null, 1]) {
          const opts = { limit: 3, lease: 30, fair: true, wait };
          await assert.rejects(acquire(redis, "jobs", opts), oom);
        }
        await assert.rejects(acquire(redis, "other", { limit: 1, wait: 1 }), oom);
        assert.deepEqual(await snapshot(), before);
        assert.equal(await holder.refresh(), true);
        assert.equal(await holder.release(), true);
      } finally {
        await call("CONFIG", "SET", "maxmemory", maxmemory);
        await call("CONFIG", "SET", "maxmemory-policy", policy);
      }
      assert.deepEqual(await call("KEYS", "*"), ["jobs:counter"]);
    });

    test("the module loaded while a client waits through the script: it moves there at once", {
      skip: SCRIPTS ? false : "once, with REDSEM_BACKEND=scripts",
    }, async () => {
      const own = await startServerWithoutModule();
      const a = await lib.connect(own.port); // asks before the module is loaded: the script
      const callA = (...args) => lib.call(a, args);
      let b;
      try {
        const holder = await acquire(a, "jobs", { limit: 1, lease: 30 });
        const waiterA = acquire(a, "jobs", { limit: 1, lease: 30, wait: 20 });
        await waitUntil("A's waiter is in the script's line", async () => {
          return Number(await callA("ZCARD", "jobs:line")) === 1;
        });
        await callA(...moduleLoadArgs());
        // A client made after the load waits with the module; A's release, through the script
        // (A asked less than 10 s ago), runs the module's and serves it at once.
        b = await lib.connect(own.port);
        const waiterB = acquire(b, "jobs", { limit: 1, lease: 30, wait: 20 });
        await waitUntil("B waits in the module", async () => {
          return /blocked_clients:2/.test(await callA("INFO", "clients"));
        });
        const released = performance.now();
        assert.equal(await holder.release(), true);
        const permitB = await waiterB;
        const servedB = performance.now() - released;
        assert.ok(servedB < 100, `B served ${Math.round(servedB)} ms after the release`);
        // A's waiter was told M: it waits with the module now, and is served after B.
        assert.equal(await callA("EXISTS", "jobs:line"), 0);
        assert.equal(await permitB.release(), true);
        const permitA = await waiterA;
        assert.deepEqual(await callA("SEM.GET", "jobs"), 1);
        // A is on the module: its calls are the module's own, no script; BOUND works.
        const before = commandCalls(await callA("INFO", "commandstats"));
        const more = await acquire(a, "other", { limit: 1, lease: 30, wait: 1 });
        const bound = await acquire(a, "bound", { limit: 1, lease: 30, bound: true });
        for (const permit of [permitA, more, bound]) assert.equal(await permit.release(), true);
        const sent = callsSince(before, commandCalls(await callA("INFO", "commandstats")));
        assert.ok(!sent.evalsha && !sent.eval, JSON.stringify(sent));
        assert.ok(sent["sem.acquire"] === 2 && sent["sem.release"] === 3, JSON.stringify(sent));
      } finally {
        await lib.close(a);
        if (b) await lib.close(b);
        await own.stop();
      }
    });

    if (library === "ioredis") {
      test("a waiter that dies leaves the line when its place runs out: the next is served", async () => {
        const holder = await acquire(redis, "jobs", { limit: 2, lease: 30 });
        // A waiter for both permits takes its place first and never comes back: nobody behind
        // it is served while its place is held (6 s from its last attempt).
        const args = ["SEM.ACQUIRE", "jobs", 2, "30", "ID", "dead", "COUNT", 2, "LINE"];
        const [reply, , ahead] = await call(...semArgs(args, true));
        assert.deepEqual([reply, ahead], [null, 0]);
        const started = performance.now();
        const permit = await acquire(redis, "jobs", { limit: 2, lease: 30, wait: 15 });
        const waited = performance.now() - started;
        // The place runs out after 6 s; the waiter tries again at least every 2.5 s.
        assert.ok(waited > 5500 && waited < 8500, `served after ${Math.round(waited)} ms`);
        assert.deepEqual((await call("ZRANGE", "jobs", 0, -1)).sort(), [holder.id, permit.id].sort());
        assert.equal(await call("EXISTS", "jobs:wake:dead"), 0);
        assert.equal(await holder.release(), true);
        assert.equal(await permit.release(), true);
      });
    }
  });
}
