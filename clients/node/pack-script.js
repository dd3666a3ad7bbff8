"use strict";
// npm pack's lifecycle (package.json: prepack, postpack). The script has one source,
// clients/scripts/redsem.lua, outside this package's directory, which npm pack does not
// follow: `copy` puts a copy beside redsem.js for the tarball (git-ignored), `clean` removes it
// again, so a checkout never runs a stale copy (redsem.js reads ../scripts/redsem.lua there).
// Packing a directory without ../scripts (an unpacked tarball) keeps the copy it has.

const fs = require("node:fs");
const path = require("node:path");

const source = path.join(__dirname, "..", "scripts", "redsem.lua");
const copy = path.join(__dirname, "redsem.lua");

switch (process.argv[2]) {
  case "copy":
    if (fs.existsSync(source)) fs.copyFileSync(source, copy);
    else if (!fs.existsSync(copy)) throw new Error(`${source} is missing: nothing to pack`);
    break;
  case "clean":
    if (fs.existsSync(source)) fs.rmSync(copy, { force: true });
    break;
  default:
    throw new Error("usage: node pack-script.js copy|clean");
}
