"use strict";
// A standalone primary's failover under a durable grant (durableReplicas), with both client
// libraries: the clients reach the primary through an address that moves to the promoted
// replica (as a managed Redis's endpoint does), and the replica's link from the primary is
// held (the grant never reaches it) until the primary is killed during the grant's WAIT.

const assert = require("node:assert/strict");
const net = require("node:net");
const { performance } = require("node:perf_hooks");
const { after, test } = require("node:test");
const { setTimeout: sleep } = require("node:timers/promises");
const Redis = require("ioredis");
const { createClient } = require("redis");

const { acquire, NotDurable } = require("redsem-client");
const { startServer } = require("./server");
const { semArgs } = require("./helpers");

/**
 * A TCP proxy on a free port to `target`'s port: `target` may change (new connections go
 * there), `hold` drops what the server sends from then on, `cut()` closes every connection.
 * `delayMs` holds back what the server sends by that long; `keepAfter` (a RegExp) keeps what
 * the server sends on a connection once the client sent it a command matching it, until
 * `flush()` passes it on.
 */
function proxy(target) {
  const sockets = new Set();
  const kept = [];
  const state = { target, hold: false, port: 0, delayMs: 0, keepAfter: null, kept: 0 };
  state.flush = () => {
    state.keepAfter = null;
    for (const pass of kept.splice(0)) pass();
  };
  const server = net.createServer((client) => {
    const upstream = net.connect(state.target, "127.0.0.1");
    sockets.add(client);
    sockets.add(upstream);
    const end = () => {
      client.destroy();
      upstream.destroy();
      sockets.delete(client);
      sockets.delete(upstream);
    };
    for (const socket of [client, upstream]) {
      socket.on("error", end);
      socket.on("close", end);
    }
    let keeping = false;
    let pending = Promise.resolve(); // in order, each after its delay
    client.on("data", (data) => {
      if (state.keepAfter && state.keepAfter.test(String(data))) keeping = true;
      upstream.write(data);
    });
    upstream.on("data", (data) => {
      if (state.hold) return;
      const pass = () => client.destroyed || client.write(data);
      if (keeping && state.keepAfter) {
        state.kept += 1;
        kept.push(pass);
        return;
      }
      keeping = false;
      if (state.delayMs === 0 && kept.length === 0) return pass();
      const delayMs = state.delayMs;
      pending = pending.then(() => sleep(delayMs)).then(pass);
    });
  });
  state.cut = () => {
    for (const socket of sockets) socket.destroy();
    sockets.clear();
  };
  state.close = () => {
    state.cut();
    return new Promise((resolve) => server.close(resolve));
  };
  return new Promise((resolve) =>
    server.listen(0, "127.0.0.1", () => {
      state.port = server.address().port;
      resolve(state);
    }),
  );
}

async function waitUntil(what, condition, limitMs = 20000) {
  const deadline = Date.now() + limitMs;
  while (!(await condition())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting until ${what}`);
    await sleep(20);
  }
}

const servers = [];
const proxies = [];
const clients = [];

after(async () => {
  for (const close of clients) await Promise.resolve(close()).catch(() => {});
  for (const p of proxies) await p.close();
  for (const server of servers) await server.stop();
});

const LIMIT = { timeout: 60000 };

test("a durable grant's WAIT cut by the primary's failure is NotDurable, not resent", LIMIT, async () => {
  const primary = await startServer("--repl-diskless-sync-delay", "0");
  servers.push(primary);
  const link = await proxy(primary.port); // the replica's link from the primary
  proxies.push(link);
  const replica = await startServer(
    "--replicaof",
    "127.0.0.1",
    String(link.port),
    "--repl-diskless-sync-delay",
    "0",
  );
  servers.push(replica);
  const endpoint = await proxy(primary.port); // where the clients connect
  proxies.push(endpoint);
  const onReplica = new Redis({ port: replica.port });
  clients.push(() => onReplica.disconnect());
  await waitUntil("the replica is in sync", async () =>
    (await onReplica.info("replication")).includes("master_link_status:up"),
  );

  const ioredis = new Redis({ port: endpoint.port });
  ioredis.on("error", () => {});
  clients.push(() => ioredis.disconnect());
  const nodeRedis = createClient({ url: `redis://127.0.0.1:${endpoint.port}` });
  nodeRedis.on("error", () => {});
  await nodeRedis.connect();
  clients.push(() => nodeRedis.destroy());

  // From now on nothing the primary writes reaches the replica.
  link.hold = true;
  const opts = { limit: 1, lease: 30, durableReplicas: 1, durableTimeoutMs: 60000 };
  const outcome = (promise) =>
    promise.then(
      (permit) => ({ permit }),
      (error) => ({ error }),
    );
  const acquired = {
    ioredis: outcome(acquire(ioredis, "jobs-ioredis", opts)),
    "node-redis": outcome(acquire(nodeRedis, "jobs-node-redis", opts)),
  };
  const onPrimary = new Redis({ port: primary.port });
  onPrimary.on("error", () => {});
  await waitUntil("both grants wait for the replica", async () => {
    const clientsInfo = await onPrimary.info("clients");
    return /blocked_clients:2\b/.test(clientsInfo);
  });
  for (const name of ["jobs-ioredis", "jobs-node-redis"]) {
    assert.equal(await onPrimary.call(...semArgs(["SEM.GET", name])), 1);
  }
  onPrimary.disconnect();

  // The primary dies; its replica, which never had the grants, is promoted, and has a
  // replica of its own: a WAIT 1 sent again there on a new connection would answer 1 at once.
  servers.splice(servers.indexOf(primary), 1);
  await primary.stop();
  link.cut();
  assert.equal(await onReplica.replicaof("NO", "ONE"), "OK");
  const second = await startServer("--replicaof", "127.0.0.1", String(replica.port));
  servers.push(second);
  await waitUntil("the promoted replica has a replica in sync", async () =>
    /slave0:.*state=online/.test(await onReplica.info("replication")),
  );
  endpoint.target = replica.port;

  for (const [library, name] of [
    ["ioredis", "jobs-ioredis"],
    ["node-redis", "jobs-node-redis"],
  ]) {
    const { permit, error } = await acquired[library];
    assert.equal(permit, undefined, `${library}: a permit no replica has was called durable`);
    assert.ok(error instanceof NotDurable, `${library}: ${error && error.stack}`);
    assert.deepEqual([error.acked, error.wanted], [0, 1]);
    assert.equal(await onReplica.call(...semArgs(["SEM.GET", name])), 0, library);
  }
});

test("a grant later than its lease after the first send is held once confirmed", LIMIT, async () => {
  // The waiter's grant comes 2 s after its send (the holder's lease of 2 s runs out first),
  // later than the waiter's lease of 1 s; every answer reaches the waiter 150 ms late, so its
  // confirming refresh is under way well past that send's lease.
  const server = await startServer();
  servers.push(server);
  const slow = await proxy(server.port);
  proxies.push(slow);
  slow.delayMs = 150;
  const direct = new Redis({ port: server.port });
  clients.push(() => direct.disconnect());
  const ioredis = new Redis({ port: slow.port });
  ioredis.on("error", () => {});
  clients.push(() => ioredis.disconnect());
  const nodeRedis = createClient({ url: `redis://127.0.0.1:${slow.port}` });
  await nodeRedis.connect();
  clients.push(() => nodeRedis.destroy());
  for (const [library, redis] of [
    ["ioredis", ioredis],
    ["node-redis", nodeRedis],
  ]) {
    const name = `late-${library}`;
    const holder = await acquire(direct, name, { limit: 1, lease: 2, autoRefresh: false });
    const started = performance.now();
    const permit = await acquire(redis, name, { limit: 1, lease: 1, wait: 10 });
    assert.ok(performance.now() - started > 2000, library);
    assert.equal(permit.lost, false, library);
    permit.check();
    assert.equal(permit.signal.aborted, false, library);
    await sleep(400); // past a refresh, held all along
    permit.check();
    assert.equal(await permit.release(), true, library);
    assert.equal(await holder.release(), false, library); // its lease ran out
    assert.equal(await direct.call(...semArgs(["SEM.GET", name])), 0, library);
  }
});

test("a durable grant whose node became a replica before its WAIT is NotDurable", LIMIT, async () => {
  const primary = await startServer("--repl-diskless-sync-delay", "0");
  servers.push(primary);
  const replica = await startServer(
    "--replicaof",
    "127.0.0.1",
    String(primary.port),
    "--repl-diskless-sync-delay",
    "0",
  );
  servers.push(replica);
  const endpoint = await proxy(primary.port); // where the clients connect
  proxies.push(endpoint);
  const onPrimary = new Redis({ port: primary.port });
  onPrimary.on("error", () => {});
  clients.push(() => onPrimary.disconnect());
  const onReplica = new Redis({ port: replica.port });
  onReplica.on("error", () => {});
  clients.push(() => onReplica.disconnect());
  await waitUntil("the replica is in sync", async () =>
    (await onReplica.info("replication")).includes("master_link_status:up"),
  );
  const ioredis = new Redis({ port: endpoint.port });
  ioredis.on("error", () => {});
  clients.push(() => ioredis.disconnect());
  const nodeRedis = createClient({ url: `redis://127.0.0.1:${endpoint.port}` });
  nodeRedis.on("error", () => {});
  await nodeRedis.connect();
  clients.push(() => nodeRedis.destroy());
  const opts = { limit: 1, lease: 30, durableReplicas: 1, durableTimeoutMs: 5000 };
  const libraries = { ioredis, "node-redis": nodeRedis };
  for (const [library, redis] of Object.entries(libraries)) {
    // Durable while the primary is one.
    const permit = await acquire(redis, `warm-${library}`, opts);
    assert.equal(await permit.release(), true, library);
  }

  // The grants' answers are kept back until the primary has become its replica's replica.
  endpoint.keepAfter = /ACQUIRE/;
  const acquired = {};
  for (const [library, redis] of Object.entries(libraries)) {
    acquired[library] = acquire(redis, `jobs-${library}`, opts).then(
      (permit) => ({ permit }),
      (error) => ({ error }),
    );
  }
  await waitUntil("both grants are kept back", async () => endpoint.kept >= 2);
  for (const library of Object.keys(libraries)) {
    assert.equal(await onPrimary.call(...semArgs(["SEM.GET", `jobs-${library}`])), 1);
  }
  assert.equal(await onReplica.replicaof("NO", "ONE"), "OK");
  assert.equal(await onPrimary.replicaof("127.0.0.1", String(replica.port)), "OK");
  endpoint.flush();
  for (const library of Object.keys(libraries)) {
    const { permit, error } = await acquired[library];
    assert.equal(permit, undefined, `${library}: a permit was called durable`);
    assert.ok(error instanceof NotDurable, `${library}: ${error && error.stack}`);
    assert.match(error.message, /became a replica/);
    assert.deepEqual([error.acked, error.wanted], [0, 1]);
  }
});
