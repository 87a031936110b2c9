// spec: speculative decoding through the server. A random-weight qwen3 Q8_0 model (its
// last-bit sensitivity shows any difference in arithmetic as different text) answers the
// same completions on a server without speculation and on servers drafting by prompt lookup
// (`--spec ngram`, the verify count adaptive and fixed), by its own first layers
// (`--draft-layers`) and by a one-layer draft model of the same vocabulary (`--draft`):
// greedy answers, alone and four at once, and a seeded sampled answer must be the same text,
// while /metrics shows drafts verified and accepted, and each response's usage (through the
// openai SDK, plain and streamed) counts its own drafts as OpenAI's accepted and rejected
// prediction tokens, also through a gateway whose decode worker speculates. After rejections the blocks written to
// the block store (keys and bytes) are those of a run without speculation. Bad speculation
// options, a draft of another vocabulary among them, are refused at start.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";

import OpenAI from "openai";

import { assertSameStores, bin, fetchMetrics, postCompletion, startCluster, startServer, stopServers } from "./server.mjs";

let dir, model, small, otherVocab, plain, adaptive, fixed, selfSpec, drafted;
const N = 4;
// prompts that quote themselves, as an agent quoting tool output does: prompt lookup drafts
const prompt = (c) => `tool output ${c}: ` + "alpha beta gamma delta ".repeat(4 + c) + "\nquote: alpha beta";

before(async () => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), "tm-spec-"));
  model = path.join(dir, "q3.gguf");
  const r = spawnSync(bin, ["mkmodel", "--arch", "qwen3", "--layers", "4", "--dim", "256", "--ffn", "512",
    "--heads", "4", "--kv-heads", "2", "--type", "q8_0", "--seed", "3", "-o", model], { encoding: "utf8" });
  assert.equal(r.status, 0, r.stderr);
  small = path.join(dir, "small.gguf");
  otherVocab = path.join(dir, "other.gguf");
  for (const [out, extra] of [[small, []], [otherVocab, ["--vocab-size", "300"]]]) {
    const q = spawnSync(bin, ["mkmodel", "--arch", "qwen3", "--layers", "1", "--dim", "256", "--ffn", "512",
      "--heads", "4", "--kv-heads", "2", "--type", "q8_0", "--seed", "5", ...extra, "-o", out], { encoding: "utf8" });
    assert.equal(q.status, 0, q.stderr);
  }
  const common = ["--threads", "2", "--max-seqs", "8", "--cache", "off"];
  [plain, adaptive, fixed, selfSpec, drafted] = await Promise.all([
    startServer(model, common),
    startServer(model, [...common, "--spec", "ngram"]),
    startServer(model, [...common, "--spec", "ngram", "--spec-max", "4", "--spec-fixed", "3"]),
    startServer(model, [...common, "--draft-layers", "2"]),
    startServer(model, [...common, "--draft", small, "--spec-max", "3"]),
  ]);
});

after(async () => {
  await stopServers();
  if (dir) fs.rmSync(dir, { recursive: true, force: true });
});

const MAX = 32;

async function complete(S, c, extra = { temperature: 0 }) {
  const j = await postCompletion(S.url, { model: "q3", prompt: prompt(c), max_tokens: MAX, ...extra });
  assert.equal(j.usage.completion_tokens, MAX);
  return j.choices[0].text;
}

test("greedy answers with prompt-lookup drafts equal those without, alone and concurrent", async () => {
  const want = [];
  for (let c = 0; c < N; c++) want.push(await complete(plain, c));
  for (const [name, S] of [["adaptive", adaptive], ["fixed K 3", fixed]]) {
    for (let c = 0; c < N; c++) assert.equal(await complete(S, c), want[c], `${name}, prompt ${c} alone`);
    const together = await Promise.all(Array.from({ length: N }, (_, c) => complete(S, c)));
    together.forEach((t, c) => assert.equal(t, want[c], `${name}, prompt ${c} concurrent`));
    const m = await fetchMetrics(S.url);
    assert.ok(m.tokenmill_spec_verified_tokens_total > 0, `${name}: no draft verified`);
    assert.ok(m.tokenmill_spec_accepted_tokens_total > 0, `${name}: no draft accepted`);
    assert.ok(m.tokenmill_spec_drafted_tokens_total >= m.tokenmill_spec_verified_tokens_total);
    assert.ok(m.tokenmill_spec_mean_accepted_length > 0);
    // accepted drafts took no step of their own
    assert.ok(m.tokenmill_engine_steps_total < m.tokenmill_generated_tokens_total, JSON.stringify(m));
  }
  const f = await fetchMetrics(fixed.url);
  assert.equal(f['tokenmill_spec_verify_count_total{k="4"}'], 0, "fixed K 3 verified 4");
  assert.ok(f['tokenmill_spec_verify_count_total{k="3"}'] > 0);
  const p = await fetchMetrics(plain.url);
  assert.equal(p.tokenmill_spec_drafted_tokens_total, 0);
});

test("a response's usage counts its drafts: accepted and rejected prediction tokens", async () => {
  const oai = new OpenAI({ baseURL: `${fixed.url}/v1`, apiKey: "unused", maxRetries: 0 });
  const delta = async (f) => {
    const m0 = await fetchMetrics(fixed.url);
    const usage = await f();
    const m1 = await fetchMetrics(fixed.url);
    const d = (k) => m1[k] - m0[k];
    return { usage, accepted: d("tokenmill_spec_accepted_tokens_total"),
      rejected: d("tokenmill_spec_verified_tokens_total") - d("tokenmill_spec_accepted_tokens_total") };
  };
  const plainRun = await delta(async () => (await oai.completions.create({ model: "q3", prompt: prompt(1), max_tokens: MAX, temperature: 0 })).usage);
  const streamed = await delta(async () => {
    let usage = null;
    const s = await oai.completions.create({ model: "q3", prompt: prompt(2), max_tokens: MAX, temperature: 0, stream: true,
      stream_options: { include_usage: true } });
    for await (const chunk of s) if (chunk.usage) usage = chunk.usage;
    return usage;
  });
  for (const [name, r] of [["plain", plainRun], ["streamed", streamed]]) {
    const det = r.usage.completion_tokens_details;
    assert.ok(r.accepted > 0 && r.rejected > 0, `${name}: ${JSON.stringify(r)}`);
    assert.equal(det.accepted_prediction_tokens, r.accepted, `${name}: accepted`);
    assert.equal(det.rejected_prediction_tokens, r.rejected, `${name}: rejected`);
  }
  const p = await postCompletion(plain.url, { model: "q3", prompt: prompt(1), max_tokens: 8, temperature: 0 });
  assert.deepEqual(p.usage.completion_tokens_details, { accepted_prediction_tokens: 0, rejected_prediction_tokens: 0 });
});

test("through a gateway, a speculating decode worker's drafts reach the response's usage", { timeout: 60000 }, async () => {
  const C = await startCluster(model, ["prefill", "decode"], { workerArgs: ["--spec", "ngram", "--spec-fixed", "3"] });
  const want = await complete(plain, 3);
  const j = await postCompletion(C.url, { model: "q3", prompt: prompt(3), max_tokens: MAX, temperature: 0 });
  assert.equal(j.choices[0].text, want);
  const det = j.usage.completion_tokens_details;
  assert.ok(det.accepted_prediction_tokens > 0 && det.accepted_prediction_tokens < MAX, JSON.stringify(j.usage));
  // the decode worker drafts and verifies as a serve with the same options does: the same counts
  const one = await postCompletion(fixed.url, { model: "q3", prompt: prompt(3), max_tokens: MAX, temperature: 0 });
  assert.deepEqual(det, one.usage.completion_tokens_details, `gateway ${JSON.stringify(j.usage)}, serve ${JSON.stringify(one.usage)}`);
});

test("greedy answers drafted by a model equal those without, alone and concurrent", async () => {
  const want = [];
  for (let c = 0; c < N; c++) want.push(await complete(plain, c));
  for (const [name, S] of [["--draft-layers 2", selfSpec], ["--draft", drafted]]) {
    assert.equal(await complete(S, 0), want[0], `${name}, prompt 0 alone`);
    const together = await Promise.all(Array.from({ length: N }, (_, c) => complete(S, c)));
    together.forEach((t, c) => assert.equal(t, want[c], `${name}, prompt ${c} concurrent`));
    const m = await fetchMetrics(S.url);
    assert.ok(m.tokenmill_spec_verified_tokens_total > 0, `${name}: no draft verified`);
    assert.ok(m.tokenmill_spec_drafted_tokens_total >= m.tokenmill_spec_verified_tokens_total);
  }
});

test("a seeded sampled answer is the same with speculation", async () => {
  const extra = { temperature: 0.9, top_p: 0.95, seed: 11, presence_penalty: 0.3 };
  for (let c = 0; c < 2; c++) {
    const want = await complete(plain, c, extra);
    assert.equal(await complete(adaptive, c, extra), want, `prompt ${c}`);
    assert.equal(await complete(selfSpec, c, extra), want, `prompt ${c}, --draft-layers`);
  }
});

test("the blocks stored after rejections equal those of a run without speculation", async () => {
  const dirs = [path.join(dir, "store-plain"), path.join(dir, "store-spec")];
  const servers = await Promise.all([
    startServer(model, ["--threads", "2", "--cache-dir", dirs[0]]),
    startServer(model, ["--threads", "2", "--cache-dir", dirs[1], "--spec", "ngram", "--spec-fixed", "4"]),
  ]);
  const body = { model: "q3", prompt: "tool output: " + "alpha beta gamma delta ".repeat(16), max_tokens: 96, temperature: 0 };
  const texts = [];
  for (const S of servers) {
    const j = await postCompletion(S.url, body);
    // a full block holds generated tokens: drafts were verified inside it
    const u = j.usage;
    assert.ok(Math.floor(u.prompt_tokens / 128) < Math.floor((u.prompt_tokens + u.completion_tokens - 1) / 128), JSON.stringify(u));
    texts.push(j.choices[0].text);
  }
  assert.equal(texts[1], texts[0]);
  const m = await fetchMetrics(servers[1].url);
  assert.ok(m.tokenmill_spec_accepted_tokens_total < m.tokenmill_spec_verified_tokens_total, "no draft was rejected");
  await assertSameStores(servers, dirs, 1);
});

test("bad speculation options are refused at start", () => {
  for (const [args, msg] of [
    [["--spec-fixed", "3"], /--spec-fixed needs --spec/],
    [["--spec", "ngram", "--spec-max", "2", "--spec-fixed", "3"], /above --spec-max/],
    [["--spec", "bogus"], /--spec/],
    [["--spec", "ngram", "--spec-max", "99"], /--spec-max/],
    [["--draft-layers", "4"], /the model has 4 layers/],
    [["--draft", "/nonexistent.gguf"], /nonexistent/],
    [["--draft", "OTHER"], /not the model's vocabulary/],
    [["--draft", "SMALL", "--draft-layers", "1"], /not both/],
  ]) {
    const argv = args.map((a) => (a === "OTHER" ? otherVocab : a === "SMALL" ? small : a));
    const r = spawnSync(bin, ["serve", "-m", model, "--port", "0", "--cache", "off", ...argv], { encoding: "utf8", timeout: 30000 });
    assert.notEqual(r.status, 0, args.join(" "));
    assert.match(r.stderr, msg);
  }
});
