"use strict";
// The cost of the package over a raw client: acquire + release pairs through the package
// against the same client sending the same commands itself (SEM.ACQUIRE / SEM.RELEASE, or
// EVALSHA of the script without the module), one after another, on one local server, with
// ioredis and node-redis, the module and the scripts. Prints the pairs per second of each and
// the package ÷ raw ratio of the time per pair. Not a test: figures for docs/performance.md.
//
//   NODE_PATH=<a project's node_modules with ioredis and redis> node clients/node/bench/pair.js [pairs]
//
// REDSEM_MODULE and REDIS_SERVER as for the tests (test/server.js).

const { createHash, randomUUID } = require("node:crypto");
const fs = require("node:fs");
const path = require("node:path");
const { performance } = require("node:perf_hooks");
const Redis = require("ioredis");
const { createClient } = require("redis");

const { acquire } = require("..");
const { start, MODULE } = serverParts();

const PAIRS = Number(process.argv[2] || 2000);
const ROUNDS = 5;

function serverParts() {
  const server = require("../test/server");
  const module =
    process.env.REDSEM_MODULE || path.resolve(__dirname, "../../../target/debug/libredsem.so");
  return { start: server.startServerWithoutModule, MODULE: module };
}

const source = fs.readFileSync(path.join(__dirname, "..", "redsem.lua"));
// The text the package runs for a first acquire (without the allow-oom flag), and for release.
const acqSource = Buffer.concat([
  Buffer.from("#!lua"),
  source.subarray("#!lua flags=allow-oom".length),
]);
const sha = (text) => createHash("sha1").update(text).digest("hex");
const SUFFIXES = ["owner", "counter", "permits", "limit", "wake"];
const keys = (name) => [name, ...SUFFIXES.map((s) => `${name}:${s}`)];

/** The raw client's pair: the commands the package sends, sent by hand. */
function rawPair(call, scripts) {
  if (!scripts) {
    return async (name) => {
      const id = randomUUID();
      if ((await call("SEM.ACQUIRE", name, 5, "30", "ID", id)) == null) throw new Error("none");
      if ((await call("SEM.RELEASE", name, id)) !== 1) throw new Error("not released");
    };
  }
  const acq = sha(acqSource);
  const rel = sha(source);
  return async (name) => {
    const id = randomUUID();
    const k = keys(name);
    if ((await call("EVALSHA", acq, 6, ...k, "ACQUIRE", 5, "30", "ID", id)) == null) {
      throw new Error("none");
    }
    if ((await call("EVALSHA", rel, 6, ...k, "RELEASE", id)) !== 1) throw new Error("not released");
  };
}

function packagePair(redis) {
  return async (name) => {
    const permit = await acquire(redis, name, { limit: 5, lease: 30 });
    if (!(await permit.release())) throw new Error("lost");
  };
}

/**
 * Time per pair (µs) of `pkg` and of `raw`, one pair of each in turn (a busy machine slows
 * both alike), over PAIRS pairs each: the median of ROUNDS rounds.
 */
async function timed(pkg, raw) {
  const rounds = { pkg: [], raw: [] };
  for (let round = 0; round < ROUNDS; round++) {
    let pkgMs = 0;
    let rawMs = 0;
    for (let i = 0; i < PAIRS; i++) {
      const started = performance.now();
      await pkg("bench");
      const between = performance.now();
      await raw("bench");
      rawMs += performance.now() - between;
      pkgMs += between - started;
    }
    rounds.pkg.push((pkgMs * 1000) / PAIRS);
    rounds.raw.push((rawMs * 1000) / PAIRS);
  }
  return { p: median(rounds.pkg), r: median(rounds.raw) };
}

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

async function main() {
  const server = await start();
  const rows = [];
  try {
    for (const backend of ["scripts", "module"]) {
      const probe = new Redis({ port: server.port });
      if (backend === "module") await probe.call("MODULE", "LOAD", path.resolve(MODULE));
      else
        await probe
          .call("SCRIPT", "LOAD", acqSource)
          .then(() => probe.call("SCRIPT", "LOAD", source));
      probe.disconnect();
      for (const library of ["ioredis", "node-redis"]) {
        let redis;
        let call;
        if (library === "ioredis") {
          redis = new Redis({ port: server.port });
          call = (...args) => redis.call(...args);
        } else {
          redis = createClient({ url: `redis://127.0.0.1:${server.port}` });
          await redis.connect();
          call = (...args) => redis.sendCommand(args.map(String));
        }
        const close = () => redis.quit();
        const pkg = packagePair(redis);
        const raw = rawPair(call, backend === "scripts");
        for (let i = 0; i < 500; i++) await pkg("bench").then(() => raw("bench")); // warm up
        const { p, r } = await timed(pkg, raw);
        rows.push({ library, backend, p, r });
        await close();
      }
    }
  } finally {
    await server.stop();
  }
  console.log(
    `${PAIRS} pairs of each per round, in turn; median of ${ROUNDS} rounds; Node ${process.version}`,
  );
  console.log("library     backend  package µs/pair  raw µs/pair  package ÷ raw");
  for (const { library, backend, p, r } of rows) {
    const cells = [
      library.padEnd(11),
      backend.padEnd(8),
      p.toFixed(0).padStart(15),
      r.toFixed(0).padStart(12),
      (p / r).toFixed(2).padStart(14),
    ];
    console.log(cells.join(" "));
  }
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
