"use strict";
// The package at an application's scale, with each library's default client settings: 10,000
// permits held at once cost no connection and at most 4 KB each, a round of refreshes loses
// none, and 200 waiters of one name are served in the order they came, each on a connection
// of its own while it waits; the application's own calls on the client answer meanwhile.

const assert = require("node:assert/strict");
const { performance } = require("node:perf_hooks");
const { after, before, test } = require("node:test");
const { setTimeout: sleep } = require("node:timers/promises");
const v8 = require("node:v8");
const vm = require("node:vm");
const Redis = require("ioredis");
const { createClient } = require("redis");

const { acquire } = require("redsem-client");
const { startServer } = require("./server");
const { semArgs } = require("./helpers");

v8.setFlagsFromString("--expose-gc");
const gc = vm.runInNewContext("gc");

let server;
let observer;

before(async () => {
  server = await startServer();
  observer = new Redis({ port: server.port });
});

after(async () => {
  observer.disconnect();
  await server.stop();
});

const connected = async () =>
  Number(/connected_clients:(\d+)/.exec(await observer.info("clients"))[1]);
const blocked = async () => Number(/blocked_clients:(\d+)/.exec(await observer.info("clients"))[1]);

const libraries = {
  ioredis: async () => {
    const redis = new Redis({ port: server.port });
    await redis.ping();
    return {
      redis,
      set: (key, value) => redis.set(key, value),
      get: (key) => redis.get(key),
      close: () => redis.quit(),
    };
  },
  "node-redis": async () => {
    const redis = createClient({ url: `redis://127.0.0.1:${server.port}` });
    await redis.connect();
    return {
      redis,
      set: (key, value) => redis.set(key, value),
      get: (key) => redis.get(key),
      close: () => redis.quit(),
    };
  },
};

/** 100 SET + GET pairs of the application on the client: the slowest pair in ms. */
async function appCalls(app, tag) {
  let slowest = 0;
  for (let i = 0; i < 100; i++) {
    const started = performance.now();
    await app.set(`app:${tag}:${i}`, String(i));
    assert.equal(await app.get(`app:${tag}:${i}`), String(i));
    slowest = Math.max(slowest, performance.now() - started);
  }
  return slowest;
}

for (const [library, open] of Object.entries(libraries)) {
  test(`${library}: 10,000 permits held at once cost no connection and at most 4 KB each`, async () => {
    const app = await open();
    try {
      const baseline = await connected();
      await (await acquire(app.redis, "warm", { limit: 5 })).release();
      gc();
      const heapBefore = process.memoryUsage().heapUsed;
      const permits = [];
      for (let i = 0; i < 10000; i += 500) {
        const batch = [];
        for (let j = i; j < i + 500; j++) {
          batch.push(acquire(app.redis, `${library}:held:${j}`, { limit: 5, lease: 30 }));
        }
        permits.push(...(await Promise.all(batch)));
      }
      gc();
      const perPermit = (process.memoryUsage().heapUsed - heapBefore) / permits.length;
      assert.ok(perPermit <= 4096, `${perPermit} bytes per held permit`);
      // The client's own connection only (a module check reuses it).
      assert.ok((await connected()) <= baseline, `${await connected()} connections`);
      assert.ok((await appCalls(app, "held")) < 1000);
      assert.equal(await observer.call(...semArgs([`SEM.GET`, `${library}:held:9999`])), 1);
      const released = await Promise.all(permits.map((permit) => permit.release()));
      assert.equal(released.filter(Boolean).length, 10000);
      assert.equal(await observer.dbsize(), 100); // the app's keys; no semaphore key left
      await observer.flushall();
    } finally {
      await app.close();
    }
  });

  test(`${library}: a round of refreshes of 1,000 permits of a 1 s lease loses none`, async () => {
    const app = await open();
    try {
      const permits = await Promise.all(
        Array.from({ length: 1000 }, (_, i) =>
          acquire(app.redis, `${library}:short:${i}`, { limit: 1, lease: 1 }),
        ),
      );
      const granted = performance.now();
      // Meanwhile refreshes run every 333 ms; past the first lease of all, held throughout.
      assert.ok((await appCalls(app, "short")) < 1000);
      await sleep(Math.max(0, granted + 1700 - performance.now()));
      for (const permit of permits) assert.equal(permit.lost, false);
      const pipeline = observer.pipeline();
      for (let i = 0; i < 1000; i++)
        pipeline.call(...semArgs([`SEM.GET`, `${library}:short:${i}`]));
      const counts = (await pipeline.exec()).map(([err, count]) => err || count);
      assert.deepEqual(new Set(counts), new Set([1]));
      const released = await Promise.all(permits.map((permit) => permit.release()));
      assert.equal(released.filter(Boolean).length, 1000);
      await observer.flushall();
    } finally {
      await app.close();
    }
  });

  test(`${library}: 200 waiters of one name are served in order, the app's calls answering`, async () => {
    const app = await open();
    try {
      const baseline = await connected();
      const name = `${library}:line`;
      const opts = { limit: 1, lease: 30, wait: 10 };
      const first = await acquire(app.redis, name, opts);
      const served = [];
      const waiters = [];
      for (let i = 0; i < 200; i++) {
        // Each waiter waits in the server before the next comes: their order is known.
        waiters.push(
          acquire(app.redis, name, opts).then(async (permit) => {
            served.push(i);
            await sleep(20);
            assert.equal(await permit.release(), true);
          }),
        );
        const until = performance.now() + 5000;
        while ((await blocked()) < i + 1) {
          assert.ok(performance.now() < until, `waiter ${i} waits`);
          await sleep(1);
        }
      }
      // A wait holds one connection while it waits, as BLPOP does.
      assert.ok((await connected()) >= baseline + 200);
      assert.equal(await first.release(), true);
      let slowest = 0;
      let done = false;
      const all = Promise.all(waiters).finally(() => (done = true));
      for (let round = 0; !done; round++)
        slowest = Math.max(slowest, await appCalls(app, `line${round % 3}`));
      await all;
      assert.deepEqual(
        served,
        Array.from({ length: 200 }, (_, i) => i),
      );
      assert.ok(slowest < 500, `the app's slowest SET + GET took ${slowest} ms`);
      // Waits over, their connections are closed but for the pool's idle ones (8).
      await sleep(100);
      assert.ok((await connected()) <= baseline + 8, `${await connected()} connections`);
      await observer.flushall();
    } finally {
      await app.close();
    }
  });
}
