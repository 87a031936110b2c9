// cli_required: every subcommand's required options come from its option table, so a missing
// one gets the same line from the parser, the synopsis after it, and exit 2, before any file
// is opened.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { bin } from "./server.mjs";

test("a missing required option: one uniform message, the usage, exit 2", () => {
  const cases = [
    [["run", "-p", "x"], "run", "-m/--model"],
    [["run", "-m", "none.gguf"], "run", "-p/--prompt"],
    [["serve"], "serve", "-m/--model"],
    [["gateway", "--listen", "127.0.0.1:0"], "gateway", "-m/--model"],
    [["worker", "--role", "decode", "--listen", "127.0.0.1:0"], "worker", "-m/--model"],
    [["worker", "-m", "none.gguf", "--listen", "127.0.0.1:0"], "worker", "--role"],
    [["tokenize", "hello"], "tokenize", "-m/--model"],
    [["template", "-m", "none.gguf"], "template", "--input"],
    [["eval", "--input", "none.json"], "eval", "-m/--model"],
    [["bench"], "bench", "-m/--model"],
    [["bench", "curves"], "bench curves", "-m/--model"],
    [["bench", "profile"], "bench profile", "-m/--model"],
    [["mkmodel", "--arch", "llama", "--type", "f32", "--seed", "1"], "mkmodel", "-o/--output"],
    [["mkmodel", "--arch", "llama", "--type", "f32", "-o", "none.gguf"], "mkmodel", "--seed"],
    [["convert", "llama2c", "a.bin", "b.bin"], "convert", "-o/--output"],
  ];
  for (const [args, prog, opt] of cases) {
    const r = spawnSync(bin, args, { encoding: "utf8", timeout: 20000 });
    assert.equal(r.status, 2, args.join(" "));
    assert.equal(r.stderr.split("\n")[0], `tokenmill ${prog}: ${opt} is required`, args.join(" "));
    assert.match(r.stderr, new RegExp(`^usage: tokenmill ${prog} `, "m"), args.join(" "));
  }
});

test("a vocabulary that cannot be read: the subcommand, the path and why, exit 1", () => {
  for (const [args, prog] of [
    [["tokenize", "-m", "/nonexistent.gguf", "x"], "tokenize"],
    [["tokenize", "-m", bin, "x"], "tokenize"],
    [["grammar", "bench", "--json", "-m", "/nonexistent.gguf"], "grammar"],
  ]) {
    const r = spawnSync(bin, args, { encoding: "utf8", timeout: 20000 });
    assert.equal(r.status, 1, args.join(" "));
    const path = args[args.indexOf("-m") + 1];
    assert.ok(r.stderr.startsWith(`tokenmill ${prog}: ${path}: `), `${args.join(" ")}: ${r.stderr}`);
  }
});
