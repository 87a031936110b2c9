// docs_map: docs/architecture.md's layout names every file under src/ in its own folder's
// table, and names no file that is gone, so the map a newcomer reads stays the tree they
// find. It reads the two and compares; nothing is built or run.
import { test } from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { root } from "./server.mjs";

// src/ -> Map(folder relative to the root, e.g. "src/engine/", -> Set of file names)
function srcFiles() {
  const out = new Map();
  const walk = (dir) => {
    for (const e of fs.readdirSync(path.join(root, dir), { withFileTypes: true })) {
      if (e.isDirectory()) walk(`${dir}${e.name}/`);
      else if (/\.[ch]$/.test(e.name)) {
        if (!out.has(dir)) out.set(dir, new Set());
        out.get(dir).add(e.name);
      }
    }
  };
  walk("src/");
  return out;
}

// The layout section: each "**`src/.../`**" heading opens a folder's part, whose files are the
// names in backquotes in its tables' first column (and on the heading's own line: main.c);
// the job column may name other files, and globs such as `sched*.c` are not names.
function mapFiles() {
  const doc = fs.readFileSync(path.join(root, "docs/architecture.md"), "utf8");
  const start = doc.indexOf("\n## Layout\n");
  assert.ok(start >= 0, "docs/architecture.md has a Layout section");
  const end = doc.indexOf("\n## ", start + 1);
  const section = doc.slice(start, end < 0 ? undefined : end);
  const out = new Map();
  let folder = null;
  for (const line of section.split("\n")) {
    const h = /^\*\*`(src\/(?:[a-z0-9_]+\/)?)`\*\*/.exec(line);
    if (h) folder = h[1];
    else if (/^\*\*/.test(line)) folder = null;   // "Outside src/"
    if (!folder) continue;
    if (!out.has(folder)) out.set(folder, new Set());
    const cell = h ? line : line.startsWith("|") ? line.split("|")[1] : "";
    for (const m of cell.matchAll(/`([A-Za-z0-9_]+\.[ch])`/g)) out.get(folder).add(m[1]);
  }
  return out;
}

test("docs/architecture.md lists every file in src/, each in its folder, and no file that is gone", () => {
  const have = srcFiles(), listed = mapFiles();
  const missing = [], gone = [];
  for (const [dir, names] of have)
    for (const n of names) if (!listed.get(dir)?.has(n)) missing.push(dir + n);
  for (const [dir, names] of listed)
    for (const n of names) if (!have.get(dir)?.has(n)) gone.push(dir + n);
  assert.deepEqual(missing, [], `src/ files the layout in docs/architecture.md does not list in their folder: ${missing.join(", ")}`);
  assert.deepEqual(gone, [], `files docs/architecture.md's layout lists that are not in src/: ${gone.join(", ")}`);
});
