// qwen35_serve: a Qwen3.5 model (gguf-py's qwen35, tests/oracle/gguf_qwen35.py) through the real
// `tokenmill serve` and a split cluster. Its linear-attention layers carry a recurrent state per
// sequence that a block's KV cannot restore: the state at every 128-token block end is kept in
// the window cache, so a prompt that attaches cached blocks continues from the state where they
// end. Every answer (text and top log-probabilities) equals the same prompt's alone on a fresh
// server: the same 300-token prompt sent again (256 cached), prompts sharing 200 tokens (128
// cached, 256 for the one that crossed 256 itself), those sent together (batched in the same
// steps). After a restart the blocks are in the store but no state is: nothing can continue
// them, so the prompt is computed whole (0 cached) rather than loaded; prompts sharing a prefix
// sent together cold share it in flight. Through a gateway with a prefill and a decode worker,
// the decode worker attaches the stored blocks and gets the state where they end from the
// prefill worker (a window-state fetch), with the same answer.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";

import { root, startServer, startCluster, stopServers, postCompletion, fetchMetrics } from "./server.mjs";

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "tm-q35-"));
const vocab = path.join(tmp, "vocab.gguf"), model = path.join(tmp, "qwen35.gguf");
const python = ["python3", "/usr/bin/python3"].find((py) => spawnSync(py, ["-c", "import numpy"]).status === 0);
const skip = !fs.existsSync(path.join(root, "tests/data/llama.cpp/gguf-py")) ? "no tests/data/llama.cpp"
  : !python ? "no python3 with numpy" : false;

before(() => {
  if (skip) return;
  let r = spawnSync(path.join(root, "build/tokenmill"), ["mkmodel", "--arch", "qwen3", "--preset", "tiny", "--layers", "1",
    "--vocab-size", "8192", "--type", "f32", "--seed", "1", "-o", vocab], { encoding: "utf8" });
  assert.equal(r.status, 0, r.stderr);
  r = spawnSync(python, [path.join(root, "tests/oracle/gguf_qwen35.py"), "--shape", "qwen35", "--vocab", vocab,
    "-o", model], { encoding: "utf8" });
  assert.equal(r.status, 0, r.stderr);
});

after(async () => {
  await stopServers();
  fs.rmSync(tmp, { recursive: true, force: true });
});

let seed = 3;
const rnd = (n) => { seed = (seed * 1103515245 + 12345) % 2147483648; return seed % n; };
const ids = (n) => Array.from({ length: n }, () => 10 + rnd(7900));
const shared = ids(200);
const prompts = [ids(300), [...shared, ...ids(40)], [...shared, ...ids(90)], [...shared, ...ids(7)]];

async function complete(url, prompt) {
  const j = await postCompletion(url, { model: "m", prompt, max_tokens: 6, temperature: 0, logprobs: 3, ignore_eos: true });
  assert.equal(j.usage.prompt_tokens, prompt.length);
  return { text: j.choices[0].text, top: JSON.stringify(j.choices[0].logprobs.top_logprobs),
           cached: j.usage.prompt_tokens_details?.cached_tokens ?? 0 };
}
const wm = async (url, name) => (await fetchMetrics(url))[`tokenmill_window_${name}`];

const alone = [];
async function reference() {   // each prompt on a fresh server: nothing to reuse, nothing beside it
  if (alone.length) return;
  for (const p of prompts) {
    const S = await startServer(model, ["--ctx", "512", "--model-name", "m"]);
    alone.push(await complete(S.url, p));
    await stopServers();
  }
}

test("qwen35 serve: prefixes reused from the cached recurrent state answer as cold runs; a restart computes whole",
  { skip, timeout: 180000 }, async () => {
    await reference();
    const store = path.join(tmp, "store");
    fs.mkdirSync(store);
    const args = ["--ctx", "512", "--model-name", "m", "--max-seqs", "4", "--cache-dir", store];
    let S = await startServer(model, args);
    assert.match(S.log, /3 linear-attention layers keep a recurrent state of [0-9.]+ MiB per sequence, cached at block ends/);
    const expect = (label, got, i, cached) => {
      assert.equal(got.text, alone[i].text, `${label} prompt ${i}`);
      assert.equal(got.top, alone[i].top, `${label} prompt ${i}: top log-probabilities`);
      if (cached !== undefined) assert.equal(got.cached, cached, `${label} prompt ${i}: cached tokens`);
    };
    // one after another: the first of each prefix computes it, the later ones continue its state
    const seq = [];
    for (const p of prompts) seq.push(await complete(S.url, p));
    [0, 0, 128, 128].forEach((c, i) => expect("sequential", seq[i], i, c));
    assert.equal(await wm(S.url, "puts_total"), 4, "states at 128 and 256 of prompt 0, 128 of the shared prefix, 256 of prompt 2");
    assert.equal(await wm(S.url, "hits_total"), 2);
    // again, one after another and all together: every prefix is cached now
    for (let i = 0; i < prompts.length; i++) expect("repeated", await complete(S.url, prompts[i]), i, [256, 128, 256, 128][i]);
    const together = await Promise.all(prompts.map((p) => complete(S.url, p)));
    together.forEach((g, i) => expect("batched", g, i, [256, 128, 256, 128][i]));
    assert.equal(await wm(S.url, "misses_total"), 0);
    await stopServers();

    // a restart: blocks in the store, no state in RAM: computed whole, counted as such
    S = await startServer(model, args);
    expect("after a restart", await complete(S.url, prompts[0]), 0, 0);
    assert.equal(await wm(S.url, "hits_total"), 0);
    expect("after a restart, again", await complete(S.url, prompts[0]), 0, 256);
    // the prompts sharing a prefix, cold and together: whoever computes the shared block
    // first, the others continue its state (in flight) or compute it too, with the same answers
    const cold = await Promise.all(prompts.slice(1).map((p) => complete(S.url, p)));
    cold.forEach((g, i) => {
      expect("cold, together", g, i + 1);
      assert.ok(g.cached === 0 || g.cached === 128, `cold, together, prompt ${i + 1}: ${g.cached} cached`);
    });
    assert.equal(await wm(S.url, "misses_total"), 0);
    await stopServers();
  });

test("qwen35 cluster: the decode worker continues the prefill worker's state", { skip, timeout: 180000 }, async () => {
  await reference();
  const { url } = await startCluster(model, ["prefill", "decode"], { workerArgs: ["--ctx", "512", "--max-seqs", "2"],
    gatewayArgs: ["--model-name", "m"] });
  const first = await complete(url, prompts[0]);
  assert.equal(first.text, alone[0].text);
  assert.equal(first.top, alone[0].top, "the state at 256 came from the prefill worker");
  const m = await fetchMetrics(url);
  assert.equal(m['tokenmill_gateway_window_fetches_total{result="ok"}'], 1);
  const again = await complete(url, prompts[0]);
  assert.equal(again.text, alone[0].text);
  assert.equal(again.top, alone[0].top);
  assert.equal(again.cached, 256);
});
