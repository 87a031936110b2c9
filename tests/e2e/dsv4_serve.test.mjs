// dsv4_serve: DeepSeek V4 (`deepseek4`, the gguf-py model of dsv4_model.mjs) through the real
// `tokenmill serve` and a split cluster. A 300-token prompt crosses two 128-token blocks, the
// 16-position window, the indexer's top-k and several compression groups. Its greedy answer and
// top log-probabilities (printed as shortest round-trip numbers: equal text means equal floats)
// computed cold are the reference; the same prompt answers bit-identically when its two blocks
// are attached from the pool (and the rest copied from the tail the first request left), when
// another prompt continues the two blocks differently, when they are loaded from the block
// store after a restart, and
// when a prefill worker computes it and hands it to a decode worker. Prompts sharing a
// 200-token prefix (one block and 72 rows), sent together (batched in the same steps, the shared block computed in
// flight) and streamed, answer what each answers alone on a fresh server.
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";

import { bin, startServer, startCluster, stopServers, postCompletion, fetchMetrics } from "./server.mjs";
import { dsv4Model, skip } from "./dsv4_model.mjs";
import { rng } from "./oracle_common.mjs";

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "tm-dsv4-"));
after(async () => {
  await stopServers();
  fs.rmSync(tmp, { recursive: true, force: true });
});

const r = rng(11);
const ids = (n) => Array.from({ length: n }, () => 10 + r(7900));
const LONG = ids(300);
const LONG2 = [...LONG.slice(0, 256), ...ids(30)];   // LONG's two blocks, then other tokens
const shared = ids(200);
const SHARED = [[...shared, ...ids(40)], [...shared, ...ids(7)]];
const ARGS = ["--ctx", "512", "--model-name", "m", "--max-seqs", "4"];

async function complete(url, prompt, extra = {}) {
  const j = await postCompletion(url, { model: "m", prompt, max_tokens: 6, temperature: 0, logprobs: 3, ignore_eos: true,
    ...extra });
  assert.equal(j.usage.prompt_tokens, prompt.length);
  return { text: j.choices[0].text, top: JSON.stringify(j.choices[0].logprobs.top_logprobs),
           cached: j.usage.prompt_tokens_details?.cached_tokens ?? 0 };
}

async function streamed(url, prompt) {
  const res = await fetch(`${url}/v1/completions`, { method: "POST", headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: "m", prompt, max_tokens: 6, temperature: 0, ignore_eos: true, stream: true }) });
  assert.equal(res.status, 200);
  let text = "";
  for (const line of (await res.text()).split("\n")) {
    if (!line.startsWith("data: ") || line === "data: [DONE]") continue;
    text += JSON.parse(line.slice(6)).choices?.[0]?.text ?? "";
  }
  return text;
}

test("deepseek4 serve: prefix reuse from the pool and from the store after a restart is bit-identical to a cold run; " +
  "shared prefixes batched and streamed answer as alone", { skip, timeout: 60000 }, async () => {
  const model = dsv4Model();
  const alone = [];
  for (const p of [LONG2, ...SHARED]) {   // each on a fresh server: nothing to reuse, nothing beside it
    const S = await startServer(model, ARGS);
    alone.push(await complete(S.url, p));
    await stopServers();
  }
  const dir = path.join(tmp, "store");
  fs.mkdirSync(dir);
  let S = await startServer(model, [...ARGS, "--cache-dir", dir]);
  assert.match(S.log, /\(deepseek4, 4 layers, ctx 512, KV f32, \d+ blocks of 1408.0 KiB per 128 tokens, a row per position/);
  // the compressed layout's block by hand: two ratio-4 layers of 32 entries of 64 and 32 indexer
  // entries of 64, one ratio-128 entry of 64: 8256 values, 16,512 bytes in F16
  assert.match(S.log, /compressed layout \(not built[^)]*\) would keep 16\.1 KiB per 128-token block in F16 \(the pool's rows: 1408\.0 KiB in F32\), window states of 8\.0 KiB/);
  const cold = await complete(S.url, LONG);
  assert.equal(cold.cached, 0);
  const warm = await complete(S.url, LONG);
  assert.equal(warm.cached, LONG.length - 1, "two blocks attached from the pool, the rest copied from the kept tail");
  assert.equal(warm.text, cold.text);
  assert.equal(warm.top, cold.top, "logprobs after attaching the pool's blocks and the tail's rows");
  const branch = await complete(S.url, LONG2);
  assert.equal(branch.cached, 256, "LONG's two blocks attached");
  assert.equal(branch.text, alone[0].text);
  assert.equal(branch.top, alone[0].top, "logprobs of another continuation of the attached blocks");

  const together = await Promise.all(SHARED.map((p) => complete(S.url, p)));
  together.forEach((g, i) => assert.equal(g.top, alone[i + 1].top, `batched prompt ${i}`));
  const streams = await Promise.all(SHARED.map((p) => streamed(S.url, p)));
  streams.forEach((t, i) => assert.equal(t, alone[i + 1].text, `streamed prompt ${i}`));
  await stopServers();   // SIGTERM: the queued blocks are written
  const stat = spawnSync(bin, ["store", "stat", `dir:${dir}`], { encoding: "utf8" });
  assert.equal(stat.status, 0, stat.stderr);
  assert.match(stat.stdout, /1408\.0 KiB: 4 layers x 1 kv head x 704, V is K \(latent\), f32: \d+ blocks/, "block size from the headers");

  S = await startServer(model, [...ARGS, "--cache-dir", dir]);
  const restored = await complete(S.url, LONG);
  assert.equal(restored.cached, 256, "two blocks loaded from the store");
  assert.equal(restored.text, cold.text);
  assert.equal(restored.top, cold.top, "logprobs after loading the blocks from the store");
  await stopServers();
});

test("deepseek4 cluster: a prefill worker hands the prompt to a decode worker; the answer is the cold run's",
  { skip, timeout: 60000 }, async () => {
    const model = dsv4Model();
    const S = await startServer(model, ARGS);
    const ref = await complete(S.url, LONG);
    await stopServers();
    const { url } = await startCluster(model, ["prefill", "decode"], { workerArgs: ["--ctx", "512", "--max-seqs", "2"],
      gatewayArgs: ["--model-name", "m"] });
    const split = await complete(url, LONG);
    assert.equal(split.text, ref.text);
    assert.equal(split.top, ref.top, "logprobs on the decode worker after the handoff");
    // the decode worker had the whole prompt in place: two stored blocks and the 44 rows after
    // them from the handoff's tail (not computed again); heartbeats bring the count
    let inTok = 0;
    for (let k = 0; k < 100 && !inTok; k++) {
      const m = await fetchMetrics(url);
      for (const [key, v] of Object.entries(m))
        if (key.startsWith("tokenmill_worker_handoff_tokens_total") && key.includes('side="receive"')) inTok += v;
      if (!inTok) await new Promise((res) => setTimeout(res, 50));
    }
    assert.equal(inTok, LONG.length, "positions in place on the decode worker before it decoded");
    const again = await complete(url, LONG);
    assert.ok(again.cached >= 256, `${again.cached} cached tokens`);
    assert.equal(again.top, ref.top, "logprobs with the blocks attached on the workers");
  });
