// spec_dsv4_mtp: `--spec mtp` on a DeepSeek V4 target with its MTP block given as an MTP-only
// file (`--draft FILE`, the companion llama.cpp's converter writes with --mtp; here
// tests/oracle/gguf_dsv4.py --mtp of the serving tests' model). Greedy answers equal those
// without speculation, alone and four at once, with the adaptive draft length and with three
// drafts verified every step (the MTP KV rolled back with every rejection), and on a decode
// worker behind a gateway; /metrics counts MTP drafts verified (random weights: drafts are
// rarely accepted, so the test asks for drafts verified, not accepted). Mismatched files are
// refused at start-up naming what is wrong. The block's arithmetic is oracle_dsv4_mtp's. The pair
// `mkmodel --arch deepseek4 --mtp-out` writes serves the same way.
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";

import { bin, root, startServer, startCluster, stopServers, postCompletion, fetchMetrics } from "./server.mjs";
import { dsv4Model, skip } from "./dsv4_model.mjs";
import { oracleFiles, rng } from "./oracle_common.mjs";

after(async () => {
  await stopServers();
});

const r = rng(5);
const PROMPTS = [40, 25, 60, 9].map((n) => Array.from({ length: n }, () => 10 + r(7900)));
const MAX = 12;
const common = ["--threads", "1", "--max-seqs", "4", "--cache", "off", "--ctx", "512", "--model-name", "m"];

async function ask(url, c) {
  const j = await postCompletion(url, { model: "m", prompt: PROMPTS[c], max_tokens: MAX, ignore_eos: true, temperature: 0 });
  return { text: j.choices[0].text, usage: j.usage };
}

test("deepseek4 --spec mtp with an MTP-only file: greedy answers equal those without, alone, concurrent and on a " +
  "decode worker", { skip, timeout: 180000 }, async () => {
  const t = dsv4Model();
  const mtp = dsv4Model("f32", ["--mtp"], "-mtp");
  const [plain, adaptive, fixed] = await Promise.all([
    startServer(t, common),
    startServer(t, [...common, "--draft", mtp, "--spec", "mtp"]),
    startServer(t, [...common, "--draft", mtp, "--spec", "mtp", "--spec-fixed", "3"]),
  ]);
  assert.match(fixed.log, /speculative drafts by the MTP block of .* \(blk\.4, 4 streams of 128, window 16\)/);
  const want = [];
  for (let c = 0; c < PROMPTS.length; c++) want.push((await ask(plain.url, c)).text);
  for (const [name, S] of [["adaptive", adaptive], ["verify 3", fixed]]) {
    assert.equal((await ask(S.url, 0)).text, want[0], `${name}, prompt 0 alone`);
    const together = await Promise.all(PROMPTS.map((_, c) => ask(S.url, c)));
    together.forEach((x, c) => assert.equal(x.text, want[c], `${name}, prompt ${c} concurrent`));
    const m = await fetchMetrics(S.url);
    const src = (stage) => m[`tokenmill_spec_source_${stage}_tokens_total{source="mtp"}`];
    assert.ok(src("drafted") > 0, `${name}: no MTP draft`);
    assert.ok(src("verified") > 0, `${name}: no MTP draft verified`);
    assert.equal(src("verified"), m.tokenmill_spec_verified_tokens_total, `${name}: drafts from another source`);
    if (name === "verify 3") assert.ok(src("verified") >= 3 * PROMPTS.length, `${name}: ${src("verified")} verified`);
  }
  assert.equal((await fetchMetrics(plain.url)).tokenmill_spec_drafted_tokens_total, 0);
  const C = await startCluster(t, ["prefill", "decode"], { workerArgs: ["--threads", "1", "--draft", mtp, "--spec", "mtp", "--spec-fixed", "3"] });
  const j = await postCompletion(C.url, { model: path.basename(t, ".gguf"), prompt: PROMPTS[2], max_tokens: MAX, ignore_eos: true, temperature: 0 });
  assert.equal(j.choices[0].text, want[2], "on a decode worker");
  const det = j.usage.completion_tokens_details;
  assert.ok(det.accepted_prediction_tokens + det.rejected_prediction_tokens > 0, JSON.stringify(j.usage));
});

test("mismatched or malformed MTP files are refused at start naming what is wrong", { skip, timeout: 180000 }, () => {
  const t = dsv4Model();
  const script = path.join(root, "tests/oracle/gguf_dsv4.py");
  const files = oracleFiles([script, path.join(root, "tests/oracle/gguf_common.py")]);
  const otherVocab = files.cached("dsv4-mtp-vocab4096", (out) => {
    const res = spawnSync(bin, ["mkmodel", "--arch", "qwen3", "--preset", "tiny", "--layers", "1", "--vocab-size", "4096",
      "--type", "f32", "--seed", "2", "-o", out], { encoding: "utf8" });
    assert.equal(res.status, 0, res.stderr);
  });
  const vocabMtp = files.cached("dsv4-mtp-othervocab", (out) => {
    const res = spawnSync(files.python, [script, "--vocab", otherVocab, "--mtp", "-o", out], { encoding: "utf8" });
    assert.equal(res.status, 0, res.stderr);
  });
  const cases = [
    [["--draft", dsv4Model("f32", ["--mtp", "--dim", "64"], "-mtp-dim64"), "--spec", "mtp"], /does not fit the model: its block takes 4 streams of 64 \(4 x 64\), the model's are 4 of 128/],
    [["--draft", dsv4Model("f32", ["--mtp", "--hc", "2"], "-mtp-hc2"), "--spec", "mtp"], /does not fit the model: its block takes 2 streams of 128/],
    [["--draft", vocabMtp, "--spec", "mtp"], /not the model's vocabulary/],
    [["--draft", t, "--spec", "mtp"], /--spec mtp: --draft .* is not an MTP-only file/],
    [["--draft", dsv4Model("f32", ["--mtp", "--mtp-hash"], "-mtp-hash"), "--spec", "mtp"], /hash_layer_count 5: the MTP block blk\.4 is hash-routed/],
    [["--spec", "mtp"], /the model has no MTP layers .*a deepseek4 model's MTP block is a file of its own: --draft FILE/],
    [["--draft", dsv4Model("f32", ["--mtp"], "-mtp"), "--spec", "dspark"], /is a deepseek4 MTP-only file: --spec mtp drafts with it/],
  ];
  for (const [args, msg] of cases) {
    const res = spawnSync(bin, ["serve", "-m", t, "--port", "0", ...common, ...args], { encoding: "utf8", timeout: 60000 });
    assert.notEqual(res.status, 0, args.join(" "));
    assert.match(res.stderr, msg, args.join(" "));
  }
  const res = spawnSync(bin, ["serve", "-m", dsv4Model("f32", ["--mtp"], "-mtp"), "--port", "0", ...common], { encoding: "utf8", timeout: 60000 });
  assert.notEqual(res.status, 0);
  assert.match(res.stderr, /a deepseek4 MTP-only file \(the MTP block alone\) is not a model to run/);
});

test("mkmodel --arch deepseek4 --mtp-out: serve --draft FILE --spec mtp answers as without speculation", { skip, timeout: 180000 }, async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "tm-dsv4-mtp-"));
  try {
    const t = path.join(dir, "t.gguf"), mtp = path.join(dir, "mtp.gguf");
    const res = spawnSync(bin, ["mkmodel", "--arch", "deepseek4", "--vocab-size", "8192", "--type", "q8_0", "--seed", "6",
      "--threads", "2", "-o", t, "--mtp-out", mtp], { encoding: "utf8" });
    assert.equal(res.status, 0, res.stderr);
    const [plain, adaptive, fixed] = await Promise.all([
      startServer(t, common),
      startServer(t, [...common, "--draft", mtp, "--spec", "mtp"]),
      startServer(t, [...common, "--draft", mtp, "--spec", "mtp", "--spec-fixed", "3"]),
    ]);
    const want = await Promise.all(PROMPTS.map((_, c) => ask(plain.url, c)));
    for (const [name, S] of [["adaptive", adaptive], ["verify 3", fixed]]) {
      const got = await Promise.all(PROMPTS.map((_, c) => ask(S.url, c)));
      got.forEach((x, c) => assert.equal(x.text, want[c].text, `${name}, prompt ${c}`));
    }
    const m = await fetchMetrics(fixed.url);
    assert.ok(m['tokenmill_spec_source_verified_tokens_total{source="mtp"}'] >= 3 * PROMPTS.length, "verify 3: MTP drafts verified");
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
