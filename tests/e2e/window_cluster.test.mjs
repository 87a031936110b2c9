// window_cluster: the window cache across a split cluster (gateway + prefill worker + decode
// worker on one block store), on the generated gpt-oss model of window.test.mjs (6 layers, a
// 48-token window on 3 of them: a bounded replay, over the last 128 positions, is not exact).
// A 300-token prompt is prefilled on the prefill worker, which keeps the window state at 128 and
// 256 and reports them to the gateway; the decode worker attaches the stored blocks up to 256
// and needs the state there: the gateway fetches it from the prefill worker and relays it. Sent
// again, the prefill worker needs the state at 256, now last reported by the decode worker:
// fetched the other way. Both answers equal `tokenmill serve`'s, top log-probabilities
// included, with the default bounded replay: no replay happened anywhere.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";

import { bin, startServer, startCluster, stopServers, fetchMetrics } from "./server.mjs";

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "tm-wincluster-"));
const model = path.join(tmp, "gpt-oss.gguf");
const NAME = "tiny-oss";

before(() => {
  execFileSync(bin, ["mkmodel", "--arch", "gpt-oss", "--preset", "gpt-oss-20b", "--layers", "6", "--dim", "128",
    "--ffn", "128", "--heads", "2", "--kv-heads", "1", "--head-dim", "64", "--experts", "4", "--experts-used", "2",
    "--expert-ffn", "128", "--window", "48", "--vocab-size", "4096", "--type", "q8_0", "--seed", "11", "-o", model],
  { stdio: "pipe" });
});

after(async () => {
  await stopServers();
  fs.rmSync(tmp, { recursive: true, force: true });
});

const L = 300;
const PROMPT = Array.from({ length: L }, (_, i) => 300 + ((i * 7919) % 3000));
async function complete(url) {
  const r = await fetch(`${url}/v1/completions`, {
    method: "POST", headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: NAME, prompt: PROMPT, max_tokens: 8, temperature: 0, logprobs: 3, ignore_eos: true }),
  });
  const j = await r.json();
  assert.equal(r.status, 200, JSON.stringify(j));
  return { text: j.choices[0].text, top: JSON.stringify(j.choices[0].logprobs.top_logprobs),
           cached: j.usage.prompt_tokens_details.cached_tokens };
}

test("window states travel between workers: split answers equal serve with bounded replay", { timeout: 240000 }, async () => {
  const dir = path.join(tmp, "serve-store");
  fs.mkdirSync(dir);
  const S = await startServer(model, ["--ctx", "512", "--max-seqs", "2", "--model-name", NAME, "--cache-dir", dir]);
  const ref = await complete(S.url);
  await stopServers();

  const args = ["--ctx", "512", "--max-seqs", "2"];
  const { url } = await startCluster(model, ["prefill", "decode"], { workerArgs: args, gatewayArgs: ["--model-name", NAME] });
  const first = await complete(url);
  assert.equal(first.text, ref.text, "turn 1: the decode worker got the state at 256 from the prefill worker");
  assert.equal(first.top, ref.top);
  let m = await fetchMetrics(url);
  assert.equal(m['tokenmill_gateway_window_fetches_total{result="ok"}'], 1);
  assert.equal(m['tokenmill_gateway_window_fetches_total{result="failed"}'], 0);
  assert.ok(m.tokenmill_gateway_window_fetch_bytes_total > 0);
  assert.ok(m.tokenmill_gateway_window_directory_entries >= 2, "the states at 128 and 256 are listed");

  const again = await complete(url);
  assert.equal(again.text, ref.text, "turn 2: the prefill worker got the state at 256 back");
  assert.equal(again.top, ref.top);
  assert.equal(again.cached, L - 134);
  m = await fetchMetrics(url);
  assert.equal(m['tokenmill_gateway_window_fetches_total{result="ok"}'], 3, "turn 2: one fetch for the prefill, one for the decode");
  assert.equal(m['tokenmill_gateway_window_fetches_total{result="failed"}'], 0);
});
