"use strict";
// Tests of redsem-client through Redis Cluster clients (ioredis's Cluster and node-redis's
// createCluster) against a real local cluster of 3 primaries with a replica each, started by
// scripts/test-cluster. REDSEM_CLUSTER says which cluster (unset: these tests skip):
//   module   every node loads the module (which takes the short form and the long form);
//   filter0  the module without its command filter (as on Redis 8.4+: the long form only);
//   scripts  no module anywhere: the package runs its Lua script, and what needs the module
//            rejects with ModuleRequired.
// REDSEM_TEST_CLUSTER is the absolute path of scripts/test-cluster, REDSEM_MODULE of the module,
// REDIS_SERVER the server binary (default redis-server).

const assert = require("node:assert/strict");
const { execFile } = require("node:child_process");
const fs = require("node:fs");
const os = require("node:os");
const path = require("node:path");
const { performance } = require("node:perf_hooks");
const { after, before, describe, test } = require("node:test");
const { setTimeout: sleep } = require("node:timers/promises");
const util = require("node:util");
const Redis = require("ioredis");
const { createCluster } = require("redis");

const {
  acquire,
  acquireAll,
  clearLimit,
  setLimit,
  storedLimit,
  waitEmpty,
  withPermits,
  NotAcquired,
  NotDurable,
  PermitLost,
  SemaphoreError,
} = require("redsem-client");

const CLUSTER = process.env.REDSEM_CLUSTER;
const TEST_CLUSTER = process.env.REDSEM_TEST_CLUSTER;
const run = util.promisify(execFile);

if (!CLUSTER) {
  test(
    "Redis Cluster (set REDSEM_CLUSTER to module, filter0 or scripts)",
    { skip: true },
    () => {},
  );
} else {
  if (!["module", "filter0", "scripts"].includes(CLUSTER)) {
    throw new Error(`REDSEM_CLUSTER must be module, filter0 or scripts, not ${CLUSTER}`);
  }
  if (!TEST_CLUSTER || !path.isAbsolute(TEST_CLUSTER)) {
    throw new Error("REDSEM_TEST_CLUSTER must be the absolute path of scripts/test-cluster");
  }
  clusterTests();
}

function clusterTests() {
  const SCRIPTS = CLUSTER === "scripts";
  const { assertModuleRequired, callsSince, commandCalls, semArgs } = require("./helpers");

  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "redsem-node-cluster-"));
  let nodes; // as scripts/test-cluster prints them
  let observer; // an ioredis Cluster the tests look through

  const testCluster = async (...args) =>
    (await run(TEST_CLUSTER, [...args], { timeout: 90000 })).stdout;
  const describeCluster = async () => JSON.parse(await testCluster("nodes", dir)).nodes;

  before(async () => {
    const args = ["start", dir, "--primaries", "3", "--replicas", "1"];
    args.push("--server", process.env.REDIS_SERVER || "redis-server");
    if (SCRIPTS) {
      args.push("--modules-later");
    } else {
      const module = process.env.REDSEM_MODULE;
      if (!module || !path.isAbsolute(module)) throw new Error("REDSEM_MODULE must be absolute");
      args.push("--module", module);
      if (CLUSTER === "filter0") args.push("--module-arg", "command-filter", "--module-arg", "0");
    }
    nodes = JSON.parse(await testCluster(...args)).nodes;
    observer = new Redis.Cluster([{ host: "127.0.0.1", port: nodes[0].port }]);
    observer.on("error", () => {});
  });

  after(async () => {
    if (observer) observer.disconnect();
    await testCluster("stop", dir);
    // A client a failed test left open would keep this process, and the run, alive.
    setTimeout(() => process.exit(), 5000).unref();
  });

  /** `[SEM.X, name, ...]` as the tests send it by hand: the long form, or the script's op X. */
  function byHand([command, name, ...rest]) {
    if (SCRIPTS) return semArgs([command, name, ...rest], true); // EVAL over the six keys
    const suffixes = ["owner", "counter", "permits", "limit"];
    return [command, name, ...suffixes.map((suffix) => `${name}:${suffix}`), ...rest];
  }
  const live = async (name) => Number(await observer.call(...byHand(["SEM.GET", name])));
  const slotOf = async (name) => Number(await observer.cluster("KEYSLOT", name));

  /** The live primaries, each with its slots. */
  const primaries = async () => (await describeCluster()).filter((n) => n.alive && n.primary);
  const serving = (slot, among) =>
    among.find((n) => n.slots.some(([a, b]) => a <= slot && slot <= b));
  const ownerOf = async (slot) => serving(slot, await primaries());

  /** A name `{prefix-i}` whose slot the primary on `port` serves (the first i that fits). */
  async function nameOn(port, prefix) {
    const among = await primaries();
    for (let i = 0; i < 1000; i++) {
      const name = `{${prefix}-${i}}`;
      if (serving(await slotOf(name), among).port === port) return name;
    }
    throw new Error(`no name for the primary on ${port}`);
  }

  /** INFO `section` of every live primary, as { port: what `parse` makes of it }. */
  async function infoEverywhere(section, parse) {
    const found = {};
    for (const node of await primaries()) {
      const conn = new Redis({ port: node.port, lazyConnect: true });
      try {
        found[node.port] = parse(await conn.info(section));
      } finally {
        conn.disconnect();
      }
    }
    return found;
  }
  const callsEverywhere = () => infoEverywhere("commandstats", commandCalls);
  /** The errors every primary answered so far, by code ({ MOVED: n, ASK: n, ... }), summed. */
  const errorsAnswered = async () => {
    const total = {};
    const counts = await infoEverywhere("errorstats", (info) => [
      ...info.matchAll(/^errorstat_([A-Z]+):count=(\d+)/gm),
    ]);
    for (const matches of Object.values(counts)) {
      for (const [, code, count] of matches) total[code] = (total[code] || 0) + Number(count);
    }
    return total;
  };

  // The two client libraries' cluster clients, as these tests make them.
  const libraries = {
    ioredis: {
      connect: async () => {
        const cluster = new Redis.Cluster(
          nodes.filter((n) => n.primary).map((n) => ({ host: "127.0.0.1", port: n.port })),
        );
        cluster.on("error", () => {});
        cluster.on("node error", () => {});
        return cluster;
      },
      close: (cluster) => cluster.disconnect(),
    },
    "node-redis": {
      connect: async () => {
        const rootNodes = nodes.map((n) => ({ url: `redis://127.0.0.1:${n.port}` }));
        const cluster = createCluster({ rootNodes });
        cluster.on("error", () => {});
        cluster.on("node-error", () => {});
        return cluster.connect();
      },
      close: (cluster) => cluster.destroy(),
    },
  };

  for (const [library, lib] of Object.entries(libraries)) {
    describe(`${library} cluster, ${CLUSTER}`, () => {
      let redis;
      const tag = library === "ioredis" ? "io" : "nr";

      before(async () => {
        redis = await lib.connect();
      });

      after(async () => {
        await lib.close(redis);
      });

      test("acquire and release on the slot's primary; fair tickets grow", async () => {
        const name = `{${tag}-jobs}`;
        const plain = await acquire(redis, name, { limit: 2, lease: 30 });
        assert.equal(await live(name), 1);
        assert.equal(await plain.refresh(), true);
        const second = await acquire(redis, name, { limit: 2, lease: 30 });
        await assert.rejects(acquire(redis, name, { limit: 2, lease: 30 }), NotAcquired);
        assert.equal(await second.release(), true);
        assert.equal(await plain.release(), true);
        assert.equal(await live(name), 0);

        const fairName = `app:{${tag}-printers}`;
        const tickets = [];
        for (let i = 0; i < 4; i++) {
          const permit = await acquire(redis, fairName, { limit: 1, lease: 30, fair: true });
          tickets.push(permit.ticket);
          // The module's keys, in the semaphore's slot.
          assert.equal(
            Number(await observer.zscore(`${fairName}:owner`, permit.id)),
            permit.ticket,
          );
          assert.equal(await permit.release(), true);
        }
        for (let i = 1; i < tickets.length; i++)
          assert.ok(tickets[i] > tickets[i - 1], `${tickets}`);
        assert.equal(await live(fairName), 0);
      });

      test("a waiter is served after a release, on its own connection to the primary", async () => {
        const name = `{${tag}-queue}`;
        const holder = await acquire(redis, name, { limit: 1, lease: 30 });
        const waiting = acquire(redis, name, { limit: 1, lease: 30, wait: 10 });
        await sleep(300);
        const released = performance.now();
        assert.equal(await holder.release(), true);
        const permit = await waiting;
        const served = performance.now() - released;
        assert.ok(served < 500, `served ${Math.round(served)} ms after the release`);
        assert.equal(await live(name), 1);
        const started = performance.now();
        await assert.rejects(acquire(redis, name, { limit: 1, lease: 30, wait: 0.3 }), NotAcquired);
        const waited = performance.now() - started;
        assert.ok(waited > 250 && waited < 1500, `gave up after ${Math.round(waited)} ms`);
        assert.equal(await permit.release(), true);
        assert.equal(await live(name), 0);
      });

      test("a signal cancels a wait on the primary; a durable one's own connection too", async () => {
        const [primary] = await primaries();
        const name = await nameOn(primary.port, `${tag}-cancel`);
        const node = new Redis({ port: primary.port });
        const blocked = async () =>
          Number(/blocked_clients:(\d+)/.exec(await node.info("clients"))[1]);
        try {
          const holder = await acquire(redis, name, { limit: 1, lease: 30 });
          // On a pooled connection, then on the permit's own (durableReplicas).
          for (const durableReplicas of [0, 1]) {
            const controller = new AbortController();
            const opts = { limit: 1, wait: 10, durableReplicas, signal: controller.signal };
            const waiting = acquire(redis, name, opts);
            const deadline = Date.now() + 5000;
            while ((await blocked()) !== 1) {
              assert.ok(Date.now() < deadline, "the waiter blocks");
              await sleep(5);
            }
            controller.abort();
            assert.equal(await waiting.catch((error) => error), controller.signal.reason);
            while ((await blocked()) !== 0) {
              assert.ok(Date.now() < deadline + 5000, "its wait ends in the server");
              await sleep(5);
            }
          }
          assert.equal(await holder.release(), true);
          await sleep(100);
          assert.equal(await live(name), 0); // the permit freed went to nobody
        } finally {
          node.disconnect();
        }
      });

      test("waits reuse a pool of connections to the primary: 20 waits open at most its size", async () => {
        const [primary] = await primaries();
        const name = await nameOn(primary.port, `${tag}-pool`);
        const node = new Redis({ port: primary.port });
        const stat = async (section, field) => {
          return Number(new RegExp(`${field}:(\\d+)`).exec(await node.info(section))[1]);
        };
        try {
          await acquire(redis, name, { limit: 1, lease: 30 }).then((permit) => permit.release());
          const before = await stat("stats", "total_connections_received");
          for (let i = 0; i < 20; i++) {
            const holder = await acquire(redis, name, { limit: 1, lease: 30 });
            const waiting = acquire(redis, name, { limit: 1, lease: 30, wait: 10 });
            const deadline = Date.now() + 5000;
            while ((await stat("clients", "blocked_clients")) !== 1) {
              assert.ok(Date.now() < deadline, "the waiter blocks");
              await sleep(5);
            }
            assert.equal(await holder.release(), true);
            assert.equal(await (await waiting).release(), true);
          }
          const opened = (await stat("stats", "total_connections_received")) - before;
          assert.ok(opened >= 1 && opened <= 8, `${opened} connections opened for 20 waits`);
        } finally {
          node.disconnect();
        }
      });

      test("limits hold under concurrent acquirers over names in 3 slots", async () => {
        const names = [];
        for (const node of await primaries()) names.push(await nameOn(node.port, `${tag}-busy`));
        assert.equal(new Set(await Promise.all(names.map(slotOf))).size, 3);
        const limit = 2;
        const holding = Object.fromEntries(names.map((name) => [name, 0]));
        const most = Object.fromEntries(names.map((name) => [name, 0]));
        const worker = async (name) => {
          for (let round = 0; round < 3; round++) {
            const permit = await acquire(redis, name, { limit, lease: 30, wait: 10 });
            holding[name] += 1;
            most[name] = Math.max(most[name], holding[name]);
            await sleep(2 + Math.random() * 8);
            holding[name] -= 1;
            assert.equal(await permit.release(), true);
          }
        };
        await Promise.all(names.flatMap((name) => Array.from({ length: 4 }, () => worker(name))));
        for (const name of names) {
          assert.equal(most[name], limit, `${name}: at most ${most[name]} at once`);
          assert.equal(await live(name), 0);
        }
      });

      test("sets and waitEmpty (the module), or ModuleRequired (the script)", async () => {
        const pair = [
          { name: `{${tag}-app}gpu`, limit: 1 },
          { name: `{${tag}-app}licence`, limit: 3, count: 2 },
        ];
        if (SCRIPTS) {
          await assertModuleRequired(acquireAll(redis, pair), "SEM.ACQUIREALL");
          await assertModuleRequired(waitEmpty(redis, pair[0].name, 1), "SEM.WAITEMPTY");
          await assertModuleRequired(
            acquire(redis, pair[0].name, { limit: 1, bound: true }),
            "BOUND",
          );
          return;
        }
        const permits = await acquireAll(redis, pair, { lease: 30, fair: true });
        assert.equal(permits.tickets.length, 2);
        assert.equal(await permits.refresh(), true);
        await assert.rejects(
          acquireAll(redis, pair, { lease: 30, fair: true, wait: 0.2 }),
          NotAcquired,
        );
        assert.equal(await waitEmpty(redis, pair[0].name, 0.2), false);
        const emptied = waitEmpty(redis, pair[0].name, 10);
        await sleep(200);
        assert.equal(await permits.release(), true);
        assert.equal(await emptied, true);
        const id = await withPermits(
          redis,
          pair,
          { lease: 30, wait: 5, bound: true },
          async (held) => {
            assert.equal(await live(pair[1].name), 2);
            return held.id;
          },
        );
        assert.ok(id.length > 0);
        assert.equal(await live(pair[0].name), 0);
        const bound = await acquire(redis, pair[0].name, { limit: 1, lease: 30, bound: true });
        assert.equal(await live(pair[0].name), 1);
        assert.equal(await bound.release(), true);
      });

      test("the stored limit is read, stored, used and cleared on the slot's primary", async () => {
        const name = `{${tag}-reports}`;
        assert.equal(await storedLimit(redis, name), null);
        await setLimit(redis, name, 1);
        assert.equal(await storedLimit(redis, name), 1);
        const permit = await acquire(redis, name, { limit: 5, lease: 30 });
        await assert.rejects(acquire(redis, name, { limit: 5, lease: 30 }), NotAcquired);
        assert.equal(await clearLimit(redis, name), true);
        assert.equal(await storedLimit(redis, name), null);
        assert.equal(await clearLimit(redis, name), false);
        const second = await acquire(redis, name, { limit: 5, lease: 30 });
        assert.equal(await second.release(), true);
        assert.equal(await permit.release(), true);
      });

      test("no hash tag, or a set over slots: refused before anything is sent", async () => {
        const fresh = await lib.connect(); // has asked nothing yet
        try {
          await sleep(300);
          const beforeCalls = await callsEverywhere();
          const noTag = (name) =>
            `in Redis Cluster a semaphore's name needs a hash tag, e.g. "{${name}}" or ` +
            `"app:{${name}}": the keys of "${name}" (${name}, ${name}:owner, ${name}:counter, ` +
            `${name}:permits, ${name}:limit) would fall in different slots`;
          const refused = (promise, message) =>
            assert.rejects(promise, (err) => err instanceof TypeError && err.message === message);
          await refused(acquire(fresh, "jobs", { limit: 1, wait: 1 }), noTag("jobs"));
          await refused(acquire(fresh, "{}jobs", { limit: 1 }), noTag("{}jobs"));
          await refused(storedLimit(fresh, "jobs"), noTag("jobs"));
          await refused(setLimit(fresh, "jobs", 3), noTag("jobs"));
          await refused(clearLimit(fresh, "jobs"), noTag("jobs"));
          await refused(waitEmpty(fresh, "jobs", 1), noTag("jobs"));
          await refused(
            acquireAll(fresh, [
              { name: "{app}a", limit: 1 },
              { name: "b", limit: 1 },
            ]),
            noTag("b"),
          );
          const [a, b] = ["{a}x", "{b}y"];
          const [slotA, slotB] = [await slotOf(a), await slotOf(b)];
          await refused(
            acquireAll(fresh, [
              { name: a, limit: 1 },
              { name: b, limit: 1 },
            ]),
            "in Redis Cluster the semaphores of a set must share a slot: give their names one " +
              `hash tag, e.g. "{app}a" and "{app}b" ("${a}" is in slot ${slotA}, ` +
              `"${b}" in slot ${slotB})`,
          );
          const afterCalls = await callsEverywhere();
          for (const [port, calls] of Object.entries(afterCalls)) {
            const sent = callsSince(beforeCalls[port] || {}, calls);
            for (const command of Object.keys(sent)) {
              // What a cluster client asks by itself (its slot map), the tests' own looks, and
              // the replicas' links.
              if (!command.startsWith("cluster|") && !["ping", "replconf"].includes(command)) {
                assert.fail(`${command} was sent to ${port}: ${JSON.stringify(sent)}`);
              }
            }
          }
          for (const key of ["jobs", "{}jobs", "b", a, b, "{}jobs:owner", "jobs:limit"]) {
            assert.equal(await observer.exists(key), 0, key);
          }
        } finally {
          await lib.close(fresh);
        }
      });

      test("a call after its slot moved follows MOVED to the new primary", async () => {
        const start = await primaries();
        const name = await nameOn(start[0].port, `${tag}-moved`);
        const slot = await slotOf(name);
        const permit = await acquire(redis, name, { limit: 2, lease: 30, fair: true });
        await testCluster("move", dir, String(slot), String(start[1].port), "--pause-ms", "0");
        const errorsBefore = await errorsAnswered();
        // The client's map still names the first primary: it answers MOVED, the call goes on.
        const second = await acquire(redis, name, { limit: 2, lease: 30, fair: true });
        assert.ok(second.ticket > permit.ticket);
        const errorsAfter = await errorsAnswered();
        assert.ok(
          (errorsAfter.MOVED || 0) > (errorsBefore.MOVED || 0),
          JSON.stringify(errorsAfter),
        );
        assert.equal(await permit.refresh(), true);
        assert.equal(await live(name), 2);
        assert.equal(await permit.release(), true);
        assert.equal(await second.release(), true);
        assert.equal(await live(name), 0);
      });

      test("a call with no answer within its retry budget: a SemaphoreError", async () => {
        const [source, target] = await primaries();
        const name = await nameOn(source.port, `${tag}-stuck`);
        const slot = await slotOf(name);
        const permit = await acquire(redis, name, {
          limit: 2,
          lease: 30,
          fair: true,
          retryFor: 0.5,
        });
        // Half a move, left so: one of the semaphore's keys is on the target, the others are
        // not, and every call naming them all is answered TRYAGAIN.
        const at = (node) => new Redis({ port: node.port });
        const [from, to] = [at(source), at(target)];
        try {
          await to.cluster("SETSLOT", slot, "IMPORTING", source.id);
          await from.cluster("SETSLOT", slot, "MIGRATING", target.id);
          const moved = await from.call(
            "MIGRATE",
            "127.0.0.1",
            target.port,
            "",
            0,
            5000,
            "KEYS",
            `${name}:counter`,
          );
          assert.equal(moved, "OK");
        } finally {
          from.disconnect();
          to.disconnect();
        }
        const stuck = (err) =>
          err instanceof SemaphoreError &&
          err.message.includes("within 0.5 s (the retry budget)") &&
          /TRYAGAIN/.test(err.message);
        const started = performance.now();
        await assert.rejects(storedLimit(redis, name, { retryFor: 0.5 }), stuck);
        const waited = performance.now() - started;
        assert.ok(waited > 400 && waited < 3000, `gave up after ${Math.round(waited)} ms`);
        await assert.rejects(permit.refresh(), stuck);
        assert.equal(permit.lost, false); // its lease runs on: it is not lost yet
        // The move finishes: the permit is there, on the target.
        await testCluster("move", dir, String(slot), String(target.port), "--pause-ms", "0");
        assert.equal(await permit.refresh(), true);
        assert.equal(await live(name), 1);
        assert.equal(await permit.release(), true);
      });
    });
  }

  test("the README's cluster example, as written there, on the test cluster", async () => {
    // The README the package ships.
    const readme = fs.readFileSync(
      path.join(path.dirname(require.resolve("redsem-client")), "README.md"),
      "utf8",
    );
    const blocks = [...readme.matchAll(/```js\n([\s\S]*?)```/g)].map((match) => match[1]);
    const example = blocks.find((block) => block.includes("createCluster"));
    assert.ok(example.includes("port: 7000") && example.includes("127.0.0.1:7000"));
    const port = (await primaries())[0].port;
    const code = example.replaceAll(":7000", `:${port}`).replaceAll("port: 7000", `port: ${port}`);
    const printed = [];
    const console = { log: (...args) => printed.push(util.format(...args)), error: () => {} };
    // The clients the example makes, closed here should it fail halfway (an open cluster
    // client would keep this process alive).
    const made = [];
    class TestCluster extends Redis.Cluster {
      constructor(...args) {
        super(...args);
        made.push(() => this.disconnect());
      }
    }
    const libraryFor = {
      ioredis: { Cluster: TestCluster },
      redis: {
        createCluster: (...args) => {
          const cluster = createCluster(...args);
          made.push(() => cluster.destroy());
          return cluster;
        },
      },
    };
    const required = (id) => libraryFor[id] || require(id);
    const AsyncFunction = (async () => {}).constructor;
    try {
      await new AsyncFunction("require", "console", code)(required, console);
    } finally {
      for (const close of made) {
        try {
          close();
        } catch {
          // closed by the example already
        }
      }
    }
    assert.match(printed.join("\n"), /^working as [0-9a-f-]{36}$/);
    assert.equal(await live("{jobs}"), 0);
    assert.equal(await live("app:{jobs}"), 0);
  });

  // Both libraries' clients at once, on the same semaphores: one reshard and one failover
  // serve both (each takes seconds of the cluster's time).
  describe(`both libraries, ${CLUSTER}: moves and failovers`, () => {
    const clients = {};

    before(async () => {
      for (const [library, lib] of Object.entries(libraries))
        clients[library] = await lib.connect();
    });

    after(async () => {
      for (const [library, lib] of Object.entries(libraries)) await lib.close(clients[library]);
    });

    test("a reshard under load: limits hold, tickets grow, no permit is lost", async () => {
      const start = await primaries();
      const name = await nameOn(start[0].port, "moving");
      const slot = await slotOf(name);
      // Keys beside the semaphore's, so that a move takes a while, key by key.
      for (let i = 0; i < 20; i++) await observer.set(`${name}:filler:${i}`, "x");
      const limit = 2;
      let holding = 0;
      let most = 0;
      const grants = []; // { asked, granted, ticket }
      const failures = [];
      let moving = true;
      const worker = async (redis) => {
        while (moving) {
          const asked = performance.now();
          let permit;
          try {
            permit = await acquire(redis, name, { limit, lease: 30, fair: true, wait: 20 });
          } catch (err) {
            failures.push(err);
            return;
          }
          holding += 1;
          most = Math.max(most, holding);
          grants.push({ asked, granted: performance.now(), ticket: permit.ticket });
          await sleep(Math.random() * 15);
          if (Math.random() < 0.3 && !(await permit.refresh())) failures.push(`${permit.id} lost`);
          holding -= 1;
          if (!(await permit.release())) failures.push(`${permit.id} lost at its release`);
        }
      };
      // Three acquirers per library: two hold, the others wait.
      const workers = Object.values(clients).flatMap((redis) => [1, 2, 3].map(() => worker(redis)));
      await sleep(200);
      const errorsBefore = await errorsAnswered();
      // Away to the second primary and back: each phase of a move met by acquirers, waiters,
      // refreshes and releases.
      for (const to of [start[1], start[0]]) {
        await testCluster("move", dir, String(slot), String(to.port), "--pause-ms", "10");
        assert.equal((await ownerOf(slot)).port, to.port);
        await sleep(150);
      }
      moving = false;
      await Promise.all(workers);
      assert.deepEqual(failures, []);
      // The clients met the moves while the keys went over (ASK, TRYAGAIN).
      const errorsAfter = await errorsAnswered();
      const met = (code) => (errorsAfter[code] || 0) - (errorsBefore[code] || 0);
      assert.ok(met("ASK") + met("TRYAGAIN") > 0, JSON.stringify(errorsAfter));
      assert.ok(most <= limit, `${most} holders at once, limit ${limit}`);
      assert.ok(grants.length > 20, `${grants.length} grants`);
      // Fair tickets: each one once, and a grant asked after another's was seen takes a
      // greater one.
      assert.equal(new Set(grants.map((g) => g.ticket)).size, grants.length);
      for (const a of grants) {
        for (const b of grants) {
          if (a.granted < b.asked) assert.ok(a.ticket < b.ticket, `${a.ticket} then ${b.ticket}`);
        }
      }
      assert.equal(await live(name), 0);
    });

    test("a primary killed under holders and waiters: each keeps or gets one permit", async () => {
      const victim = (await primaries()).find((n) => n.primary && n.slots.length > 0);
      const cases = [];
      for (const [library, redis] of Object.entries(clients)) {
        const name = await nameOn(victim.port, `${library}-failover`);
        // The victim's replica acknowledges the grant (WAIT 1 on the holder's connection).
        const holder = await acquire(redis, name, { limit: 1, lease: 30, durableReplicas: 1 });
        const waiting = acquire(redis, name, { limit: 1, lease: 30, wait: 25 }).then(
          (permit) => ({ permit }),
          (error) => ({ error }),
        );
        cases.push({ library, redis, name, holder, waiting });
      }
      await sleep(200); // the waiters block on their own connections to the victim
      await testCluster("kill", dir, String(victim.port));
      // The holders' refreshes are resent until the replica has taken over, and find the
      // permits there (the replica had acknowledged them).
      for (const refreshed of await Promise.all(cases.map((c) => c.holder.refresh()))) {
        assert.equal(refreshed, true);
      }
      await testCluster("wait", dir);
      for (const { library, redis, name, holder, waiting } of cases) {
        assert.notEqual((await ownerOf(await slotOf(name))).port, victim.port);
        // One permit at a time: the holder's, until it gives it back.
        assert.equal(holder.lost, false, library);
        assert.equal(await live(name), 1, library);
        assert.equal(await holder.release(), true, library);
        // The waiter waited again on the new primary and is served by the release.
        const { permit, error } = await waiting;
        assert.equal(error, undefined, error && `${library}: ${error.stack}`);
        assert.equal(await live(name), 1, library);
        assert.equal(await permit.refresh(), true, library);
        await assert.rejects(acquire(redis, name, { limit: 1, lease: 30 }), NotAcquired);
        // A permit the new primary does not have (as one whose grant never reached the
        // replica): its next refresh reports it lost, and so does its release.
        assert.equal(await observer.call(...byHand(["SEM.RELEASE", name, permit.id])), 1);
        assert.equal(await permit.refresh(), false, library);
        assert.equal(permit.lost, true);
        assert.ok((await permit.whenLost) instanceof PermitLost);
        assert.equal(await permit.release(), false, library);
        assert.equal(await live(name), 0, library);
      }
    });

    test("a durable grant's WAIT cut by its primary's failure is NotDurable", async () => {
      // A primary with a live replica, which is stopped: the grant waits for its
      // acknowledgement (WAIT 1) when the primary is killed.
      const all = await describeCluster();
      let victim;
      let replica;
      for (const node of all.filter((n) => n.alive && n.primary && n.slots.length > 0)) {
        const conn = new Redis({ port: node.port, lazyConnect: true });
        try {
          const lines = await conn.cluster("REPLICAS", node.id);
          const ports = lines.map((line) => Number(/:(\d+)@/.exec(line)[1]));
          replica = all.find((n) => n.alive && ports.includes(n.port));
        } finally {
          conn.disconnect();
        }
        if (replica) {
          victim = node;
          break;
        }
      }
      assert.ok(victim, "a primary with a live replica");
      process.kill(replica.pid, "SIGSTOP");
      let stopped = true;
      try {
        const opts = { limit: 1, lease: 30, durableReplicas: 1, durableTimeoutMs: 60000 };
        const cases = [];
        for (const [library, redis] of Object.entries(clients)) {
          const name = await nameOn(victim.port, `${library}-durable`);
          const acquired = acquire(redis, name, opts).then(
            (permit) => ({ permit }),
            (error) => ({ error }),
          );
          cases.push({ library, name, acquired });
        }
        const onVictim = new Redis({ port: victim.port });
        try {
          for (let waited = 0; ; waited += 20) {
            const blocked = /blocked_clients:(\d+)/.exec(await onVictim.info("clients"))[1];
            if (Number(blocked) >= cases.length) break;
            assert.ok(waited < 10000, "the grants wait for the replica");
            await sleep(20);
          }
        } finally {
          onVictim.disconnect();
        }
        await testCluster("kill", dir, String(victim.port));
        process.kill(replica.pid, "SIGCONT");
        stopped = false;
        await testCluster("wait", dir);
        for (const { library, name, acquired } of cases) {
          const { permit, error } = await acquired;
          assert.equal(permit, undefined, `${library}: a permit was called durable`);
          assert.ok(error instanceof NotDurable, `${library}: ${error && error.stack}`);
          assert.deepEqual([error.acked, error.wanted], [0, 1]);
          // Given back on the new primary, whether the grant reached it or not.
          assert.equal(await live(name), 0, library);
        }
      } finally {
        if (stopped) process.kill(replica.pid, "SIGCONT");
      }
    });
  });
}
