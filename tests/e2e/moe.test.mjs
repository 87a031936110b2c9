// moe: mixture-of-experts models (qwen3moe: 16 experts, 4 per token, the Qwen2 vocabulary;
// deepseek2 with latent attention for the block store)
// through the real `tokenmill serve` process and the openai SDK: greedy answers that do not
// depend on what else the step carries, the expert load on /metrics, `tokenmill bench`'s
// expert figures, KV blocks of a MoE model served from the block store after a restart, and
// mkmodel's refusals of bad expert options.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync, spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import OpenAI from "openai";

import { root, bin, startServer, stopServers } from "./server.mjs";

const vocab = path.join(root, "tests/data/llama.cpp/models/ggml-vocab-qwen2.gguf");
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "tm-moe-"));
const model = path.join(tmp, "moe.gguf");
const NAME = "tiny-moe";
const skip = !fs.existsSync(bin) ? "build/tokenmill not built"
  : !fs.existsSync(vocab) ? "no tests/data/llama.cpp (scripts/fetch-testdata.sh)" : false;

let S, oai;
before(async () => {
  if (skip) return;
  execFileSync(bin, ["mkmodel", "--arch", "qwen3moe", "--preset", "tiny", "--experts", "16", "--experts-used", "4",
    "--expert-ffn", "256", "--vocab", vocab, "--type", "q8_0", "--seed", "7", "-o", model], { stdio: "pipe" });
  S = await startServer(model, ["--ctx", "512", "--max-seqs", "8", "--threads", "2", "--model-name", NAME]);
  oai = new OpenAI({ baseURL: `${S.url}/v1`, apiKey: "unused", maxRetries: 0 });
});

after(async () => {
  await stopServers();
  fs.rmSync(tmp, { recursive: true, force: true });
});

const ask = (content, max_tokens = 12) => oai.chat.completions.create({
  model: NAME, messages: [{ role: "user", content }], max_tokens, temperature: 0 });

test("serve: a MoE model answers, and greedy text alone equals greedy text among 6 others", { skip }, async () => {
  const alone = await ask("Tell me about mixtures of experts.");
  assert.equal(alone.choices[0].message.role, "assistant");
  assert.ok(alone.usage.completion_tokens > 0 && alone.usage.prompt_tokens > 5);
  const prompts = ["One", "Two words", "A somewhat longer third prompt here", "Four", "Five five", "Six"];
  const [again, ...others] = await Promise.all([ask("Tell me about mixtures of experts."),
    ...prompts.map((p) => ask(p, 20))]);
  assert.equal(again.choices[0].message.content, alone.choices[0].message.content);
  assert.equal(again.usage.completion_tokens, alone.usage.completion_tokens);
  for (const o of others) assert.ok(o.usage.completion_tokens > 0);
});

test("metrics: tokens per expert of every layer over the window, and the imbalance", { skip }, async () => {
  await ask("Count the experts.", 4);
  const text = await (await fetch(`${S.url}/metrics`)).text();
  const steps = Number(/^tokenmill_moe_window_steps (\d+)$/m.exec(text)?.[1]);
  assert.ok(steps > 0 && steps <= 128, `window steps ${steps}`);
  for (const layer of [0, 1]) {
    const counts = [...text.matchAll(new RegExp(`^tokenmill_moe_expert_tokens\\{layer="${layer}",expert="(\\d+)"\\} (\\d+)$`, "gm"))];
    assert.equal(counts.length, 16, `layer ${layer}: one line per expert`);
    const sum = counts.reduce((a, m) => a + Number(m[2]), 0);
    // every token of the window went to 4 experts
    assert.ok(sum > 0 && sum % 4 === 0, `layer ${layer}: ${sum} routed tokens`);
    const im = Number(new RegExp(`^tokenmill_moe_imbalance\\{layer="${layer}",groups="8"\\} (\\S+)$`, "m").exec(text)?.[1]);
    assert.ok(im >= 1 && im <= 8, `layer ${layer}: imbalance ${im}`);
  }
});

test("bench: the expert figures of a MoE model, also over a file of real prompts", { skip }, () => {
  const prompts = path.join(root, "bench/moe_prompts.txt");
  const out = execFileSync(bin, ["bench", "-m", model, "--pp", "32", "--tg", "4", "--seqs", "2", "--reps", "1",
    "--threads", "1", "--groups", "4", "--prompts", prompts], { encoding: "utf8" });
  const j = JSON.parse(out);
  assert.equal(j.moe.experts, 16);
  assert.equal(j.moe.used, 4);
  assert.equal(j.moe.groups, 4);
  assert.equal(j.moe.imbalance.length, 2);
  assert.ok(j.moe.imbalance.every((x) => x >= 1 && x <= 4));
  assert.ok(j.moe.active_weight_bytes < j.weight_bytes);
  // the real prompts: every non-empty line prefilled once, its tokens' routing alone
  const lines = fs.readFileSync(prompts, "utf8").split("\n").filter((l) => l.trim()).length;
  const p = j.moe_prompts;
  assert.equal(p.prompts, lines);
  assert.ok(p.tokens > 4 * lines, `${p.tokens} tokens`);
  assert.equal(p.groups, 4);
  assert.equal(p.imbalance.length, 2);
  assert.ok(p.imbalance.every((x) => x >= 1 && x <= 4), JSON.stringify(p));
  assert.ok(p.imbalance_overall >= 1 && p.imbalance_overall <= p.imbalance_max + 1e-9);
  assert.notDeepEqual(p.imbalance, j.moe.imbalance, "counted over the prompts only");
  // a file without a prompt is refused with a message
  const empty = path.join(tmp, "empty.txt");
  fs.writeFileSync(empty, "\n  \n");
  const r = spawnSync(bin, ["bench", "-m", model, "--pp", "0", "--tg", "0", "--prompts", empty], { encoding: "utf8" });
  assert.equal(r.status, 1);
  assert.match(r.stderr, /has no prompt/);
});

test("mkmodel: bad expert options are refused with a message", { skip: !fs.existsSync(bin) && "build/tokenmill not built" }, () => {
  const run = (...a) => spawnSync(bin, ["mkmodel", ...a, "--type", "f32", "--seed", "1", "-o", path.join(tmp, "x.gguf")],
    { encoding: "utf8" });
  let r = run("--arch", "qwen3moe", "--preset", "tiny", "--experts", "4", "--experts-used", "5");
  assert.equal(r.status, 2);
  assert.match(r.stderr, /--experts-used 5 is more than --experts 4/);
  r = run("--arch", "qwen3", "--preset", "tiny", "--experts", "4");
  assert.equal(r.status, 2);
  assert.match(r.stderr, /for --arch qwen3moe/);
  assert.ok(!fs.existsSync(path.join(tmp, "x.gguf")));
});

// last: it stops the shared server
test("cache: after a restart, a MoE model's prompt blocks come from the block store, same answer", { skip }, async () => {
  const dir = fs.mkdtempSync(path.join(tmp, "store-"));
  const args = ["--ctx", "1024", "--threads", "2", "--model-name", NAME, "--cache-dir", dir];
  const long = "Experts route tokens by a learned gate, each token to a few of them. ".repeat(30);
  const once = async () => {
    const srv = await startServer(model, args);
    const c = new OpenAI({ baseURL: `${srv.url}/v1`, apiKey: "unused", maxRetries: 0 });
    const r = await c.chat.completions.create({ model: NAME, messages: [{ role: "user", content: long }], max_tokens: 8,
      temperature: 0 });
    await stopServers();   // a clean shutdown finishes the write-behind
    return r;
  };
  const cold = await once(), warm = await once();
  assert.ok(cold.usage.prompt_tokens > 256, `prompt of ${cold.usage.prompt_tokens} tokens`);
  assert.equal(cold.usage.prompt_tokens_details?.cached_tokens ?? 0, 0);
  assert.ok(warm.usage.prompt_tokens_details.cached_tokens >= 256, `cached ${warm.usage.prompt_tokens_details.cached_tokens}`);
  assert.equal(warm.choices[0].message.content, cold.choices[0].message.content);
});

// the block store with latent attention: a pool row is the latent plus the RoPE key, one per
// token and layer, stored once (V is K); blocks written by one server are read back by the
// next, from a directory store and from an erasure-coded one, and `store stat` reads their size
// from the blocks' headers (no model)
test("cache: a deepseek2 (latent attention) model's blocks come back from the store after a restart (dir and ec)", { skip: !fs.existsSync(bin) && "build/tokenmill not built" }, async () => {
  const ds = path.join(tmp, "ds.gguf");
  execFileSync(bin, ["mkmodel", "--arch", "deepseek2", "--preset", "tiny", "--q-lora", "64", "--kv-lora", "128",
    "--nope-dim", "32", "--rope-dim", "32", "--v-dim", "32", "--experts", "8", "--experts-used", "2", "--expert-ffn", "256",
    "--shared-experts", "1", "--dense-layers", "1", "--router", "sigmoid", "--expert-groups", "4", "--groups-used", "2",
    "--rope-scaling", "yarn", "--type", "q8_0", "--seed", "3", "-o", ds], { stdio: "pipe" });
  // 2 layers x (kv_lora 128 + rope 32) x f16 x 128 tokens, once: 80 KiB (K and V would be 160)
  const kib = "80.0";
  const prompt = "the quick brown fox jumps over the lazy dog and runs away ".repeat(20);
  const once = async (cache) => {
    const srv = await startServer(ds, ["--ctx", "1024", "--threads", "2", "--model-name", "ds", "--cache", cache]);
    assert.match(srv.log, new RegExp(`KV f16, \\d+ blocks of ${kib} KiB per 128 tokens, latent: V is K`));
    const c = new OpenAI({ baseURL: `${srv.url}/v1`, apiKey: "unused", maxRetries: 0 });
    const r = await c.completions.create({ model: "ds", prompt, max_tokens: 8, temperature: 0 });
    await stopServers();
    return r;
  };
  const cached = (u) => u.prompt_tokens_details?.cached_tokens ?? 0;
  const dir = fs.mkdtempSync(path.join(tmp, "store-ds-"));
  const ec = `ec:2+1:${[0, 1, 2].map((i) => fs.mkdtempSync(path.join(tmp, `store-ds-ec${i}-`))).join(",")}`;
  let first;
  for (const spec of [`dir:${dir}`, ec]) {
    const cold = await once(spec), warm = await once(spec);
    assert.ok(cold.usage.prompt_tokens > 256, `prompt of ${cold.usage.prompt_tokens} tokens`);
    assert.equal(cached(cold.usage), 0, spec);
    assert.ok(cached(warm.usage) >= 256, `${spec}: cached ${cached(warm.usage)}`);
    assert.equal(warm.choices[0].text, cold.choices[0].text, spec);
    first ??= cold.choices[0].text;
    assert.equal(cold.choices[0].text, first, "the same answer from either store");
    const stat = execFileSync(bin, ["store", "stat", spec], { encoding: "utf8" });
    assert.match(stat, new RegExp(`^  ${kib} KiB: 2 layers x 1 kv head x 160, V is K \\(latent\\), f16: \\d+ blocks$`, "m"), stat);
  }
});
