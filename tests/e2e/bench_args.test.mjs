// bench_args: the bench scripts' option parser (bench/args.mjs). Its results in process, and
// through the scripts themselves: each answers --help with its options, and refuses an unknown
// option, a missing value, a non-number, a value outside the choices and a missing required
// option with one line and exit status 2, before starting anything.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { root } from "./server.mjs";
import { argsHelp, parseArgs } from "../../bench/args.mjs";

const table = [
  { name: "-m", key: "model", arg: "MODEL", help: "the model" },
  { name: "--reps", kind: "number", default: 3, help: "runs" },
  { name: "--kv-mib", kind: "number", default: 24, help: "pool" },
  { name: "--threads", alias: ["-t"], kind: "number", default: 2, help: "threads" },
  { name: "--seqs", kind: "list", of: "number", default: [1, 4], help: "sequences" },
  { name: "--bin", key: "bins", kind: "list", help: "builds" },
  { name: "--args", default: "", help: "passed through" },
  { name: "--no-llama", key: "llama", kind: "flag", value: false, default: true, help: "tokenmill only" },
  { name: "--serial", kind: "flag", help: "one at a time" },
  { name: "--quick", kind: "flag", sets: { reps: 1 }, help: "= --reps 1" },
];

test("bench/args: defaults, kinds, aliases, flags, later options win", () => {
  assert.deepEqual(parseArgs("t", table, []), { reps: 3, kvMib: 24, threads: 2, seqs: [1, 4], args: "", llama: true, serial: false });
  const o = parseArgs("t", table, ["-m", "x.gguf", "--kv-mib", "0.5", "-t", "1", "--seqs", "2,,8", "--bin", "a,b",
    "--args", "--no-overlap --x 1", "--no-llama", "--serial"]);
  assert.deepEqual(o, { model: "x.gguf", reps: 3, kvMib: 0.5, threads: 1, seqs: [2, 8], bins: ["a", "b"], args: "--no-overlap --x 1",
    llama: false, serial: true });
  assert.equal(parseArgs("t", table, ["--quick", "--reps", "5"]).reps, 5);
  assert.equal(parseArgs("t", table, ["--reps", "5", "--quick"]).reps, 1);
  const help = argsHelp("t", table);
  assert.match(help, /^usage: t \[options\]\n/);
  assert.match(help, /--threads, -t N +threads \(default 2\)/);
  assert.match(help, /--seqs N,N +sequences \(default 1,4\)/);
});

const run = (script, args) => spawnSync(process.execPath, [path.join(root, "bench", script), ...args],
  { encoding: "utf8", timeout: 60000 });

test("bench scripts: --help lists every option, exit 0", { timeout: 180000 }, () => {
  const scripts = fs.readdirSync(path.join(root, "bench")).filter((f) => f.endsWith(".mjs") &&
    /parseArgs\(/.test(fs.readFileSync(path.join(root, "bench", f), "utf8")) && f !== "args.mjs");
  assert.ok(scripts.length >= 13, scripts.join(" "));
  for (const s of scripts) {
    const r = run(s, ["--help"]);
    assert.equal(r.status, 0, `${s}: ${r.stderr}`);
    assert.match(r.stdout, new RegExp(`^usage: bench/${s.replace(".mjs", "")} \\[options\\]\\n`), s);
    assert.match(r.stdout, /\n {2}--\S+/, s);
  }
});

test("bench scripts: bad options are refused with exit status 2", { timeout: 120000 }, () => {
  const bad = [
    ["restart.mjs", ["-m", "x.gguf", "--bogus"], /^bench\/restart: unknown option --bogus/],
    ["restart.mjs", ["-m", "x.gguf", "--reps"], /^bench\/restart: --reps needs a value/],
    ["restart.mjs", ["-m", "x.gguf", "--reps", "many"], /^bench\/restart: --reps wants a number, not "many"/],
    ["restart.mjs", ["--reps", "2"], /^bench\/restart: -m is required/],
    ["cache_load.mjs", ["-m", "x.gguf", "--prompt", ""], /^bench\/cache_load: --prompt wants a number, not ""/],
    ["serve.mjs", ["--clients", "1,x"], /^bench\/serve: --clients wants a number, not "x"/],
    ["engine.mjs", ["--only", "both"], /^bench\/engine: --only is one of tokenmill, llama, not "both"/],
  ];
  for (const [s, args, re] of bad) {
    const r = run(s, args);
    assert.equal(r.status, 2, `${s} ${args.join(" ")}: ${r.stderr}`);
    assert.match(r.stderr, re);
  }
});
