// mtp: multi-token prediction layers (DeepSeek-V3's MTP, llama.cpp's "nextn" layers). A small
// random-weight deepseek2 model (V3-like: q-LoRA, sigmoid router with groups, a shared expert,
// a leading dense layer) written by `mkmodel --nextn 1` and the same model without the MTP
// layer: both give the same log-probs (tokenmill eval), llama.cpp (node-llama-cpp 3.21.1) loads
// the MTP file and agrees with it; through the server, greedy answers drafted by the MTP layer
// (`--spec mtp`, `--spec ngram` with it, and the MTP layer beside a draft model, here the model's
// first layer) equal those without speculation, alone and four at once, and /metrics counts the
// drafts verified by source. With random weights the MTP layer's drafts are rarely accepted: the
// test asks for drafts verified, not accepted. `--spec mtp` on a model without MTP layers is
// refused at start.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";

import { bin, root, fetchMetrics, postCompletion, startServer, stopServers } from "./server.mjs";

let dir, plainFile, mtpFile, plain, mtp, both, withDraft;
const SHAPE = ["--arch", "deepseek2", "--layers", "2", "--dim", "256", "--ffn", "512", "--heads", "4", "--q-lora", "64",
  "--kv-lora", "128", "--nope-dim", "32", "--rope-dim", "32", "--v-dim", "32", "--experts", "8", "--experts-used", "2",
  "--expert-ffn", "128", "--shared-experts", "1", "--dense-layers", "1", "--router", "sigmoid", "--expert-groups", "4",
  "--groups-used", "2", "--routed-scale", "2.5", "--untied", "--seed", "7"];
const N = 4, MAX = 24;
const prompt = (c) => `tool output ${c}: ` + "alpha beta gamma delta ".repeat(2 + c) + "\nquote: alpha";

function mkmodel(out, extra) {
  const r = spawnSync(bin, ["mkmodel", ...SHAPE, ...extra, "-o", out], { encoding: "utf8" });
  assert.equal(r.status, 0, r.stderr);
}

before(async () => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), "tm-mtp-"));
  plainFile = path.join(dir, "plain.gguf");
  mtpFile = path.join(dir, "mtp.gguf");
  mkmodel(plainFile, ["--type", "f32"]);
  mkmodel(mtpFile, ["--type", "f32", "--nextn", "1"]);
  const common = ["--threads", "2", "--max-seqs", "8", "--cache", "off"];
  [plain, mtp, both, withDraft] = await Promise.all([
    startServer(mtpFile, common),
    startServer(mtpFile, [...common, "--spec", "mtp"]),
    startServer(mtpFile, [...common, "--spec", "ngram", "--spec-max", "3"]),
    /* a fixed count: every request drafts from its best source whatever the drafts' cost */
    startServer(mtpFile, [...common, "--spec", "mtp", "--draft-layers", "1", "--spec-fixed", "2"]),
  ]);
});

after(async () => {
  await stopServers();
  if (dir) fs.rmSync(dir, { recursive: true, force: true });
});

const input = { seqs: [[1, 20, 30, 40, 50, 60, 70, 80]], top: 3, greedy: 6, batched: false };

function evalWith(cmd, args) {
  const f = path.join(dir, "in.json");
  fs.writeFileSync(f, JSON.stringify(input));
  const r = spawnSync(cmd, [...args, "--input", f], { encoding: "utf8", timeout: 120000 });
  assert.equal(r.status, 0, r.stderr);
  return JSON.parse(r.stdout).seqs[0];
}

test("the MTP layer leaves the model's log-probs as without it; llama.cpp loads the file and agrees", () => {
  const a = evalWith(bin, ["eval", "-m", plainFile, "-t", "2"]);
  const b = evalWith(bin, ["eval", "-m", mtpFile, "-t", "2"]);
  assert.deepEqual(b, a, "the MTP file's log-probs differ from the plain file's");
  const l = evalWith("node", [path.join(root, "tests/oracle/llama_eval.mjs"), "-m", mtpFile, "--threads", "2"]);
  assert.deepEqual(l.greedy, b.greedy, "greedy continuation differs from llama.cpp's");
  l.top.forEach((row, i) => {
    assert.equal(row[0][0], b.top[i][0][0], `position ${i}: top token`);
    assert.ok(Math.abs(row[0][1] - b.top[i][0][1]) < 0.02, `position ${i}: ${row[0][1]} vs ${b.top[i][0][1]}`);
  });
});

async function complete(S, c) {
  const j = await postCompletion(S.url, { model: "mtp", prompt: prompt(c), max_tokens: MAX, temperature: 0 });
  assert.equal(j.usage.completion_tokens, MAX);
  return j.choices[0].text;
}

test("greedy answers drafted by the MTP layer equal those without, alone and concurrent", async () => {
  const want = [];
  for (let c = 0; c < N; c++) want.push(await complete(plain, c));
  for (const [name, S] of [["--spec mtp", mtp], ["--spec ngram with MTP", both], ["MTP and a draft model", withDraft]]) {
    for (let c = 0; c < 2; c++) assert.equal(await complete(S, c), want[c], `${name}, prompt ${c} alone`);
    const together = await Promise.all(Array.from({ length: N }, (_, c) => complete(S, c)));
    together.forEach((t, c) => assert.equal(t, want[c], `${name}, prompt ${c} concurrent`));
  }
  const m = await fetchMetrics(mtp.url);
  assert.ok(m.tokenmill_spec_drafted_tokens_total > 0, "no MTP draft");
  assert.ok(m.tokenmill_spec_verified_tokens_total > 0, "no MTP draft verified");
  assert.ok(m.tokenmill_spec_verifies_total > 0);
  assert.ok(m.tokenmill_spec_drafted_tokens_total >= m.tokenmill_spec_verified_tokens_total);
  assert.ok(m.tokenmill_spec_accepted_tokens_total <= m.tokenmill_spec_verified_tokens_total);
  const src = (stage, s) => m[`tokenmill_spec_source_${stage}_tokens_total{source="${s}"}`];
  assert.equal(src("verified", "mtp"), m.tokenmill_spec_verified_tokens_total, "--spec mtp: drafts from another source");
  assert.equal(src("drafted", "ngram") + src("drafted", "model"), 0);
  /* both drafting models drafted and were verified: a request tries the cheaper MTP layer
   * first, and the draft model once the MTP layer's drafts were rejected */
  const w = await fetchMetrics(withDraft.url);
  const wsrc = (stage, s) => w[`tokenmill_spec_source_${stage}_tokens_total{source="${s}"}`];
  assert.ok(wsrc("verified", "mtp") > 0 && wsrc("verified", "model") > 0,
    `verified: mtp ${wsrc("verified", "mtp")}, model ${wsrc("verified", "model")}`);
  assert.equal(wsrc("drafted", "ngram"), 0);
  assert.equal(wsrc("verified", "mtp") + wsrc("verified", "model"), w.tokenmill_spec_verified_tokens_total);
  assert.equal(wsrc("accepted", "mtp") + wsrc("accepted", "model"), w.tokenmill_spec_accepted_tokens_total);
  const p = await fetchMetrics(plain.url);
  assert.equal(p.tokenmill_spec_drafted_tokens_total, 0);
});

test("--spec mtp is refused on a model without MTP layers", () => {
  for (const [model, args, msg] of [
    [plainFile, ["--spec", "mtp"], /no MTP layers/],
  ]) {
    const r = spawnSync(bin, ["serve", "-m", model, "--port", "0", "--cache", "off", ...args], { encoding: "utf8", timeout: 30000 });
    assert.notEqual(r.status, 0, args.join(" "));
    assert.match(r.stderr, msg);
  }
});
