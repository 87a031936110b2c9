// arch_serve: the families of model_<family>.c through the real `tokenmill serve` with the
// block store: generated phi3 (fused QKV and gate-up, partial RoPE, LongRoPE's long factors at
// its 8192-token trained context), mistral3 (YaRN, the attention temperature), glm4moe (biased
// Q/K/V, half-rotated heads, a dense lead, sigmoid-routed and shared experts), mistral4
// (deepseek2's latent attention: its blocks hold the latent once, V is K) and gemma3 (a
// 32-position window on 5 of its 6 layers: the window layers' state comes from the window cache,
// in RAM, from the store's directory, and handed to the decode worker) models. A 300-token prompt computes two full blocks;
// sent again it attaches them and answers as the first time; after a restart the blocks come
// from the store, with the same answer, and so does a gateway with a prefill and a decode
// worker. A chat request renders the family's bundled template
// (Phi-3.5, Ministral 3) through the Jinja interpreter (which jinja.test.mjs compares byte for
// byte with @huggingface/jinja). gemma4 (window and global layers of different head sizes and
// kv heads; with experts; with per-layer embeddings and shared KV layers) is served the same way, and a gemma4 model on Gemma 4's own vocabulary answers a
// chat request through the bundled Gemma 4 template, its turn markers one token each.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync, spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";

import { bin, root, startServer as startServerOf, startCluster, stopServers, completeCached, assertCachedAndRestored }
  from "./server.mjs";

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "tm-arch-"));
const FAMILIES = {
  phi3: ["--arch", "phi3", "--ctx", "8192"],
  mistral3: ["--arch", "mistral3", "--ctx", "4096"],
  gemma3: ["--arch", "gemma3", "--ctx", "65536", "--window", "32", "--layers", "6"],
  // window layers of 4 kv heads of 32 beside a global one of 1 of 64, each in its own K/V rows
  gemma4: ["--arch", "gemma4", "--ctx", "65536", "--window", "32", "--layers", "6", "--heads", "8", "--kv-heads", "4",
    "--head-dim", "32"],
  // the 26B-A4B's experts beside the dense FFN; E2B's per-layer embeddings and 2 shared KV
  // layers (window layers 6 and 7 attend over layer 4's K/V; the pool keeps none of theirs)
  "gemma4-moe": ["--arch", "gemma4", "--ctx", "65536", "--window", "32", "--layers", "6", "--heads", "8", "--kv-heads", "4",
    "--head-dim", "32", "--experts", "8", "--experts-used", "2", "--expert-ffn", "64"],
  "gemma4-e": ["--arch", "gemma4", "--ctx", "65536", "--window", "32", "--layers", "8", "--heads", "8", "--kv-heads", "4",
    "--head-dim", "32", "--per-layer-embd", "16", "--shared-kv-layers", "2"],
  glm4moe: ["--arch", "glm4moe", "--ctx", "4096"],
  mistral4: ["--arch", "mistral4", "--ctx", "4096", "--dim", "256", "--heads", "4", "--q-lora", "64", "--kv-lora", "128",
    "--nope-dim", "32", "--rope-dim", "32", "--v-dim", "32", "--experts", "8", "--experts-used", "2", "--expert-ffn", "128"],
};
const modelOf = (fam) => path.join(tmp, `${fam}.gguf`);
const store = path.join(tmp, "store");
const templates = path.join(root, "tests/data/llama.cpp/models/templates");
const TEMPLATES = { phi3: "microsoft-Phi-3.5-mini-instruct.jinja", mistral3: "mistralai-Ministral-3-14B-Reasoning-2512.jinja" };
const NAME = "phi3-test";
const PROMPT = Array.from({ length: 300 }, (_, i) => 300 + ((i * 7919) % 3000));
const startServer = (model, args = []) => startServerOf(model, ["--ctx", "512", "--max-seqs", "2", "--model-name", NAME,
  "--cache-dir", store, ...args]);

before(() => {
  fs.mkdirSync(store);
  for (const [fam, args] of Object.entries(FAMILIES))
    execFileSync(bin, ["mkmodel", "--layers", "3", ...args, "--vocab-size", "4096", "--type", "q8_0", "--seed", "3",
      "-o", modelOf(fam)], { stdio: "ignore" });
});

after(async () => {
  await stopServers();
  fs.rmSync(tmp, { recursive: true, force: true });
});

const complete = (srv) => completeCached(srv, NAME, PROMPT);
// usage counts at most L - 134 cached tokens of a prompt of L on a model with window layers
// (window.test.mjs): two attached blocks show as that many
const cachedMin = (fam) => (FAMILIES[fam].includes("--window") ? PROMPT.length - 134 : 256);

for (const fam of Object.keys(FAMILIES))
test(`${fam} served: cached blocks in RAM and from the store answer as the uncached prompt`, { timeout: 120000 }, async () => {
  const first = await assertCachedAndRestored(() => startServer(modelOf(fam)), complete, cachedMin(fam));
  // split: a prefill and a decode worker behind a gateway answer as the one process
  const C = await startCluster(modelOf(fam), ["prefill", "decode"], { gatewayArgs: ["--model-name", NAME] });
  const split = await complete(C);
  assert.equal(split.text, first.text, "gateway + workers answer as serve");
  await stopServers();
});

test("gemma3 with every layer a window one (fewer than its period of 6) is refused at load, naming why", () => {
  const f = path.join(tmp, "gemma3-all-window.gguf");
  execFileSync(bin, ["mkmodel", "--arch", "gemma3", "--layers", "3", "--vocab-size", "512", "--type", "q8_0", "--seed", "1",
    "-o", f], { stdio: "ignore" });
  const r = spawnSync(bin, ["run", "-m", f, "-p", "hi", "-n", "1"], { encoding: "utf8" });
  assert.notEqual(r.status, 0);
  assert.match(r.stderr, /every one of the 3 layers is a sliding-window layer/);
});

for (const [fam, name] of Object.entries(TEMPLATES))
test(`${fam} served: a chat request through the bundled ${name}`, { skip: !fs.existsSync(templates) && "no bundled templates",
  timeout: 60000 }, async () => {
  const S = await startServer(modelOf(fam), ["--template-file", path.join(templates, name)]);
  const r = await fetch(`${S.url}/v1/chat/completions`, { method: "POST", headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: NAME, max_tokens: 4, temperature: 0,
      messages: [{ role: "system", content: "Be brief." }, { role: "user", content: "Hello there" }] }) });
  assert.equal(r.status, 200, await r.clone().text());
  const j = await r.json();
  assert.ok(j.usage.prompt_tokens > 10);
  assert.equal(j.choices[0].message.role, "assistant");
  await stopServers();
});

const gemma4Vocab = path.join(root, "tests/data/llama.cpp/models/ggml-vocab-gemma-4.gguf");
test("gemma4 served on Gemma 4's vocabulary: a chat request through the bundled Gemma 4 template",
  { skip: (!fs.existsSync(templates) || !fs.existsSync(gemma4Vocab)) && "no bundled templates or vocabulary", timeout: 60000 },
  async () => {
    const f = path.join(tmp, "gemma4-vocab.gguf");
    execFileSync(bin, ["mkmodel", "--arch", "gemma4", "--layers", "6", "--dim", "128", "--heads", "4", "--kv-heads", "4",
      "--head-dim", "32", "--window", "32", "--ctx", "65536", "--vocab", gemma4Vocab, "--type", "q8_0", "--seed", "3",
      "-o", f], { stdio: "ignore" });
    const S = await startServer(f, ["--template-file", path.join(templates, "google-gemma-4-31B-it.jinja")]);
    const messages = [{ role: "system", content: "Be brief." }, { role: "user", content: "Hello there" }];
    const r = await fetch(`${S.url}/v1/chat/completions`, { method: "POST", headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: NAME, max_tokens: 4, temperature: 0, messages }) });
    assert.equal(r.status, 200, await r.clone().text());
    const j = await r.json();
    assert.equal(j.choices[0].message.role, "assistant");
    // the prompt as `tokenmill template` renders and tokenizes it: <|turn> and <turn|> are single
    // tokens of the vocabulary, so the two short turns and the model's opening take few tokens
    const conv = path.join(tmp, "conv.json");
    fs.writeFileSync(conv, JSON.stringify({ messages, add_generation_prompt: true }));
    const { ids, text } = JSON.parse(execFileSync(bin, ["template", "-m", f, "--input", conv, "--template-file",
      path.join(templates, "google-gemma-4-31B-it.jinja")], { encoding: "utf8" }));
    assert.ok(text.startsWith("<bos><|turn>system\nBe brief.<turn|>\n<|turn>user\nHello there<turn|>\n<|turn>model\n"), text);
    assert.equal(j.usage.prompt_tokens, ids.length);
    assert.ok(ids.length > 10 && ids.length < 30, `${ids.length} prompt tokens`);
    await stopServers();
  });
