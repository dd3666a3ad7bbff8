"use strict";
// A redis-server with the module loaded, on a free loopback port, in a scratch directory.
// REDSEM_MODULE names the module (default: the repository's target/debug/libredsem.so; set it
// where the tests run outside the repository),
// REDIS_SERVER the server binary (default: redis-server).
// REDSEM_BACKEND=scripts starts every server WITHOUT the module (with MODULE LOAD allowed, so a
// test may load it later), and the package runs its Lua script there: the whole suite then
// tests the scripts, and what needs the module must reject with ModuleRequired.

const { spawn } = require("node:child_process");
const fs = require("node:fs");
const net = require("node:net");
const os = require("node:os");
const path = require("node:path");

const ROOT = path.resolve(__dirname, "../../..");
const MODULE = process.env.REDSEM_MODULE || path.join(ROOT, "target/debug/libredsem.so");
const REDIS_SERVER = process.env.REDIS_SERVER || "redis-server";
const BACKEND = process.env.REDSEM_BACKEND || "module";
if (BACKEND !== "module" && BACKEND !== "scripts") {
  throw new Error(`REDSEM_BACKEND must be "scripts" or "module" (the default), not ${BACKEND}`);
}
/** True when the suite runs against the Lua script (no module in the server). */
const SCRIPTS = BACKEND === "scripts";

function freePort() {
  return new Promise((resolve, reject) => {
    const probe = net.createServer();
    probe.once("error", reject);
    probe.listen(0, "127.0.0.1", () => {
      const { port } = probe.address();
      probe.close(() => resolve(port));
    });
  });
}

function ping(port) {
  return new Promise((resolve) => {
    const socket = net.connect(port, "127.0.0.1");
    let answer = "";
    const done = (ok) => {
      socket.destroy();
      resolve(ok);
    };
    socket.once("error", () => done(false));
    socket.on("data", (data) => {
      answer += data;
      if (answer.includes("\r\n")) done(answer.startsWith("+PONG"));
    });
    socket.write("PING\r\n");
  });
}

function checkModule() {
  if (!fs.existsSync(MODULE)) {
    throw new Error(`${MODULE} is missing: build the module (cargo build -p redsem)`);
  }
}

/** A server as REDSEM_BACKEND asks: with the module, or without it (scripts). */
function startServer(...extra) {
  return SCRIPTS ? startServerWithoutModule(...extra) : start(["--loadmodule", MODULE], extra);
}

/**
 * A server without the module, whatever REDSEM_BACKEND says, where a test may MODULE LOAD it
 * (loadModule(client) sends that).
 */
function startServerWithoutModule(...extra) {
  return start(["--enable-module-command", "yes"], extra);
}

/** The arguments of MODULE LOAD for the module under test. */
function moduleLoadArgs() {
  checkModule();
  return ["MODULE", "LOAD", path.resolve(MODULE)];
}

async function start(moduleArgs, extra) {
  if (moduleArgs[0] === "--loadmodule") checkModule();
  const port = await freePort();
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "redsem-node-"));
  const log = fs.openSync(path.join(dir, "redis.log"), "w");
  const args = ["--port", String(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"];
  args.push("--dir", dir, ...moduleArgs, ...extra);
  const child = spawn(REDIS_SERVER, args, { stdio: ["ignore", log, log] });
  let exited = null;
  child.once("exit", (code) => (exited = code));
  const readLog = () => fs.readFileSync(path.join(dir, "redis.log"), "utf8");
  const deadline = Date.now() + 20000;
  while (!(await ping(port))) {
    if (exited !== null) throw new Error(`redis-server exited with ${exited}:\n${readLog()}`);
    if (Date.now() > deadline) throw new Error(`redis-server did not answer:\n${readLog()}`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  return {
    port,
    async stop() {
      if (exited === null) {
        const gone = new Promise((resolve) => child.once("exit", resolve));
        child.kill("SIGKILL");
        await gone;
      }
      fs.closeSync(log);
      fs.rmSync(dir, { recursive: true, force: true });
    },
  };
}

module.exports = { startServer, startServerWithoutModule, moduleLoadArgs, SCRIPTS };
