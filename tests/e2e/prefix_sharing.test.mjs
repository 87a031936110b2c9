// prefix_sharing: agent traffic on the real `tokenmill serve` (a generated qwen3 model), driven by the
// real `openai` client: concurrent requests with a shared 1,000-token prefix report every
// full block of it as cached but for one request (computed once, whether a request attached
// it from the cache or while another was computing it; the rows of its partial last block too
// when a running request had them), with the same greedy text as the
// same requests one at a time; `--step-ms` sizes steps by the learned step time and
// /metrics shows that model's error; a bad `--step-ms` is refused at start.
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { spawnSync, execFileSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import OpenAI from "openai";
import { root, bin, startServer, stopServers, fetchMetrics } from "./server.mjs";

after(stopServers);

const metrics = (url) => fetchMetrics(url);

const N = 6, PREFIX = 1000, SHARED = 896;   // 7 full 128-token blocks of the prefix
const prefix = Array.from({ length: PREFIX }, (_, i) => (i * 7 + 3) % 1000);
const prompts = Array.from({ length: N }, (_, k) => [...prefix, ...Array.from({ length: 40 }, (_, i) => (k * 97 + i * 13) % 1000)]);

test("a shared prefix sent by concurrent agents is computed once; greedy text as one at a time", async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "tm-ttft-"));
  const model = path.join(dir, "q3.gguf");
  execFileSync(bin, ["mkmodel", "--arch", "qwen3", "--preset", "tiny", "--type", "f16", "--seed", "5", "-o", model], { stdio: "pipe" });
  const ask = (c, prompt) => c.completions.create({ model: "q3", prompt, max_tokens: 6, temperature: 0, ignore_eos: true });
  // one at a time, on its own server
  const A = await startServer(model, ["--model-name", "q3", "--ctx", "2048", "--cache", "off"]);
  const ca = new OpenAI({ baseURL: `${A.url}/v1`, apiKey: "x", maxRetries: 0 });
  const serial = [];
  for (const p of prompts) serial.push(await ask(ca, p));
  assert.deepEqual(serial.map((r) => r.usage.prompt_tokens_details.cached_tokens), [0, ...Array(N - 1).fill(SHARED)]);
  // all at once, with a step time target
  const B = await startServer(model, ["--model-name", "q3", "--ctx", "2048", "--cache", "off", "--max-seqs", "4", "--step-ms", "20"]);
  const cb = new OpenAI({ baseURL: `${B.url}/v1`, apiKey: "x", maxRetries: 0 });
  const together = await Promise.all(prompts.map((p) => ask(cb, p)));
  // a request that found the prefix's partial last block computed by a running one copied its
  // rows too (PREFIX cached), else it attached the full blocks (SHARED)
  const cached = together.map((r) => r.usage.prompt_tokens_details.cached_tokens).sort((x, y) => x - y);
  assert.equal(cached[0], 0);
  for (const c of cached.slice(1)) assert.ok(c === SHARED || c === PREFIX, `cached ${c}`);
  for (let k = 0; k < N; k++) assert.equal(together[k].choices[0].text, serial[k].choices[0].text, `request ${k}`);
  const ma = await metrics(A.url), mb = await metrics(B.url);
  const rows = cached.reduce((a, c) => a + c, 0) - (N - 1) * SHARED;   // copied below a block boundary
  assert.equal(mb.tokenmill_prefill_tokens_total + rows, ma.tokenmill_prefill_tokens_total);
  assert.equal(mb.tokenmill_cached_prompt_tokens_total, (N - 1) * SHARED + rows);
  assert.ok(mb.tokenmill_shared_prompt_tokens_total <= mb.tokenmill_cached_prompt_tokens_total);
  assert.equal(mb.tokenmill_step_target_seconds, 0.02);
  assert.equal(ma.tokenmill_step_target_seconds, 0);
  // the step-time model learns from every step, with or without a target
  for (const m of [ma, mb]) {
    assert.ok(m.tokenmill_step_model_predictions_total > 0);
    // real steps never take exactly the predicted time: the error sums grow with every step
    assert.ok(m.tokenmill_step_model_abs_error_seconds_total > 0 && m.tokenmill_step_model_rel_error_total > 0);
  }
  fs.rmSync(dir, { recursive: true });
});

test("a bad --step-ms is refused with a message", () => {
  for (const v of ["abc", "0", "-5", "1e9"]) {
    const r = spawnSync(bin, ["serve", "-m", path.join(root, "models/stories260K.gguf"), "--port", "0", "--step-ms", v], { encoding: "utf8" });
    assert.equal(r.status, 2, v);
    assert.match(r.stderr, /--step-ms/);
  }
});
