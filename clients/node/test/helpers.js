"use strict";
// What the tests share, for either backend (REDSEM_BACKEND, see server.js): the module's
// commands as the tests send them by hand, the script's source, commandstats, ModuleRequired.

const assert = require("node:assert/strict");
const { execFileSync } = require("node:child_process");
const { createHash } = require("node:crypto");
const fs = require("node:fs");
const path = require("node:path");

const { ModuleRequired, SemaphoreError } = require("redsem-client");
const { SCRIPTS } = require("./server");

// The one source of the script, clients/scripts/redsem.lua: found from REDSEM_CLIENTS_README
// (clients/README.md) where the tests run outside the repository.
const SCRIPT_FILE = process.env.REDSEM_CLIENTS_README
  ? path.join(path.dirname(process.env.REDSEM_CLIENTS_README), "scripts", "redsem.lua")
  : path.join(__dirname, "..", "..", "scripts", "redsem.lua");
const scriptSource = fs.readFileSync(SCRIPT_FILE, "utf8");
/** The SHA-1 of the repository's script: what the package must run (EVALSHA). */
const SCRIPT_SHA = createHash("sha1").update(fs.readFileSync(SCRIPT_FILE)).digest("hex");

/**
 * A module command `[SEM.X, name, ...args]` as the tests send it by hand: as it is with the
 * module, else EVAL of the script (op X over the six keys of name).
 */
function semArgs(args, scripts = SCRIPTS) {
  if (!scripts) return args;
  const [command, name, ...rest] = args;
  const suffixes = ["owner", "counter", "permits", "limit", "wake"];
  const keys = [name, ...suffixes.map((suffix) => `${name}:${suffix}`)];
  return ["EVAL", scriptSource, 6, ...keys, command.slice("SEM.".length), ...rest];
}

/** INFO commandstats as { command: calls }. */
function commandCalls(info) {
  const calls = {};
  for (const match of info.matchAll(/^cmdstat_([^:]+):calls=(\d+)/gm)) {
    calls[match[1]] = Number(match[2]);
  }
  return calls;
}

/** What clients send when they connect or close, and the tests' own INFO. */
const HOUSEKEEPING = new Set([
  "info",
  "quit",
  "hello",
  "select",
  "client|setinfo",
  "client|setname",
]);

/** The commands counted in `after` and not in `before` (housekeeping left out). */
function callsSince(before, after) {
  const sent = {};
  for (const [command, calls] of Object.entries(after)) {
    if (HOUSEKEEPING.has(command)) continue;
    const more = calls - (before[command] || 0);
    if (more > 0) sent[command] = more;
  }
  return sent;
}

/** `promise` rejects with ModuleRequired, whose message names `what`. */
async function assertModuleRequired(promise, what) {
  const err = await promise.then(
    () => null,
    (error) => error,
  );
  assert.ok(err instanceof ModuleRequired, `expected ModuleRequired, got ${err}`);
  assert.ok(err instanceof SemaphoreError);
  assert.equal(err.name, "ModuleRequired");
  assert.equal(err.message, `${what} needs the redsem module loaded in the server`);
}

/**
 * The lowest first fair ticket of a fresh name granted after now: the server's clock now in
 * milliseconds × 1000 (taken by `time`: [seconds, micros]), and with the module at least its
 * fencing floor (INFO sem). A fresh name's first ticket is the clock of its grant, module and
 * script alike.
 */
function firstTicket(info, time) {
  const clock = Number(time[0]) * 1000000 + Math.floor(Number(time[1]) / 1000) * 1000;
  if (SCRIPTS) return clock;
  return Math.max(clock, Number(/sem_ticket_floor:(\d+)/.exec(info)[1]));
}

/**
 * `tickets` (in the order granted, of fresh names, after `first` from firstTicket) start at
 * the clock of their first grant, `first` or later (within a minute), and then are what the
 * module hands out: `exact` shifted to that start (one up per grant of a name). The script
 * takes max(counter + 1, now in ms × 1000) at each grant: they grow.
 */
function assertTickets(tickets, first, exact) {
  assert.ok(tickets.every(Number.isSafeInteger), String(tickets));
  assert.ok(tickets[0] >= first && tickets[0] < first + 60e6, `${tickets[0]} after ${first}`);
  if (!SCRIPTS) {
    assert.deepEqual(
      tickets,
      exact.map((t) => t - exact[0] + tickets[0]),
    );
    return;
  }
  for (let i = 1; i < tickets.length; i++) {
    assert.ok(tickets[i] > tickets[i - 1], `tickets ${tickets} grow`);
  }
}

/**
 * Sends the command `args` to the server at `port` from another process, while this one's
 * event loop stands still (what the server answers meanwhile on this process's connections
 * stays unread), and returns the server's answer as sent (RESP).
 */
function sendFromElsewhere(port, args) {
  const command = args.map((arg) => `$${Buffer.byteLength(String(arg))}\r\n${arg}\r\n`);
  const code = `const s = require("node:net").connect(${port}, "127.0.0.1");
    s.on("data", (d) => { process.stdout.write(d); s.destroy(); });
    s.write(require("node:fs").readFileSync(0));`;
  const input = `*${args.length}\r\n${command.join("")}`;
  return execFileSync(process.execPath, ["-e", code], { input }).toString();
}

module.exports = {
  sendFromElsewhere,
  SCRIPTS,
  SCRIPT_SHA,
  semArgs,
  commandCalls,
  callsSince,
  assertModuleRequired,
  firstTicket,
  assertTickets,
};
