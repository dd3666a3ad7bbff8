"use strict";
// A standalone primary's failover under a durable grant (durableReplicas), with both client
// libraries: the clients reach the primary through an address that moves to the promoted
// replica (as a managed Redis's endpoint does), and the replica's link from the primary is
// held (the grant never reaches it) until the primary is killed during the grant's WAIT.

const assert = require("node:assert/strict");
const net = require("node:net");
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
 */
function proxy(target) {
  const sockets = new Set();
  const state = { target, hold: false, port: 0 };
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
    client.on("data", (data) => upstream.write(data));
    upstream.on("data", (data) => state.hold || client.write(data));
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
