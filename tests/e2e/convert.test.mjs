// convert: `tokenmill convert llama2c` against llama.cpp. The committed models/stories260K.gguf
// must make llama.cpp print the exact greedy text llama2.c prints (which proves the converter:
// metadata, vocabulary, tensor names and layouts, no RoPE permutation), and converting the
// llama2.c files again must reproduce it byte for byte. Bad inputs fail with a message.
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync, spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";

const root = path.resolve(import.meta.dirname, "../..");
const bin = path.join(root, "build/tokenmill");
const model = path.join(root, "models/stories260K.gguf");
// the llama2.c checkpoint lives in the shared folder beside the checkout (../shared/models)
const src = process.env.TM_LLAMA2C_DIR || path.join(root, "../shared/models");
const haveSrc = fs.existsSync(path.join(src, "stories260K.bin")) && fs.existsSync(path.join(src, "tok512.bin"));

test("llama.cpp greedy on models/stories260K.gguf equals llama2.c's text", () => {
  const out = execFileSync("node", [path.join(root, "tests/oracle/llama_greedy.mjs"), model, "-n", "200"], { cwd: root });
  const want = fs.readFileSync(path.join(root, "tests/data/expected/greedy-200.txt"));
  assert.equal(out.toString(), want.toString());
});

test("convert reproduces models/stories260K.gguf byte for byte", { skip: !haveSrc && `no llama2.c files in ${src}` }, () => {
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "tm-convert-"));
  const out = path.join(tmp, "s.gguf");
  execFileSync(bin, ["convert", "llama2c", path.join(src, "stories260K.bin"), path.join(src, "tok512.bin"), "-o", out, "--name", "stories260K"], { stdio: "pipe" });
  assert.ok(fs.readFileSync(out).equals(fs.readFileSync(model)));
  fs.rmSync(tmp, { recursive: true });
});

test("convert rejects bad input with a message", { skip: !haveSrc && `no llama2.c files in ${src}` }, () => {
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "tm-convert-"));
  const cut = path.join(tmp, "cut.bin");
  fs.writeFileSync(cut, fs.readFileSync(path.join(src, "stories260K.bin")).subarray(0, 5000));
  let r = spawnSync(bin, ["convert", "llama2c", cut, path.join(src, "tok512.bin"), "-o", path.join(tmp, "x.gguf")]);
  assert.equal(r.status, 1);
  assert.match(r.stderr.toString(), /truncated/);
  r = spawnSync(bin, ["convert", "llama2c", path.join(tmp, "missing.bin"), path.join(src, "tok512.bin"), "-o", path.join(tmp, "x.gguf")]);
  assert.equal(r.status, 1);
  assert.match(r.stderr.toString(), /missing\.bin/);
  r = spawnSync(bin, ["convert", "gpt2", "a", "b", "-o", "c"]);
  assert.equal(r.status, 2);
  assert.ok(!fs.existsSync(path.join(tmp, "x.gguf")));
  fs.rmSync(tmp, { recursive: true });
});
