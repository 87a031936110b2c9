// window_cluster: the window cache across a split cluster (gateway, two prefill workers and a
// decode worker on one block store), on the generated gpt-oss model of window.test.mjs (6
// layers, a 48-token window on 3 of them: a bounded replay, over the last 128 positions, is
// not exact). A 300-token prompt is prefilled on prefill worker A, which keeps the window
// states at 128 and 256 and reports them to the gateway; the decode worker attaches the stored
// blocks up to 256 and needs the state there: the gateway fetches it from A and relays it. A is
// then drained (its states leave the directory with it) and the same prompt comes again: the
// other prefill worker needs the state at 256, which only the decode worker holds now: fetched
// the other way. Both answers equal `tokenmill serve`'s, top log-probabilities included, with
// the default bounded replay: no replay happened anywhere (without the fetches the
// log-probabilities differ).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";

import { startServer, startCluster, stopServers, fetchMetrics, postCompletion } from "./server.mjs";
import { makeWindowModel, WINDOW_MODEL_NAME, WINDOW_PROMPT, WINDOW_PROMPT_LEN } from "./window_model.mjs";

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "tm-wincluster-"));
const model = path.join(tmp, "gpt-oss.gguf");
const NAME = WINDOW_MODEL_NAME;

before(() => {
  makeWindowModel(model);
});

after(async () => {
  await stopServers();
  fs.rmSync(tmp, { recursive: true, force: true });
});

const L = WINDOW_PROMPT_LEN, PROMPT = WINDOW_PROMPT;
async function complete(url) {
  const j = await postCompletion(url, { model: NAME, prompt: PROMPT, max_tokens: 8, temperature: 0, logprobs: 3, ignore_eos: true });
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
  const { url } = await startCluster(model, ["prefill", "prefill", "decode"], { workerArgs: args, gatewayArgs: ["--model-name", NAME] });
  const fetches = async () => {
    const m = await fetchMetrics(url);
    return { ok: m['tokenmill_gateway_window_fetches_total{result="ok"}'], failed: m['tokenmill_gateway_window_fetches_total{result="failed"}'],
             bytes: m.tokenmill_gateway_window_fetch_bytes_total, entries: m.tokenmill_gateway_window_directory_entries };
  };
  const first = await complete(url);
  assert.equal(first.text, ref.text, "turn 1: the decode worker got the state at 256 from the prefill worker");
  assert.equal(first.top, ref.top);
  let f = await fetches();
  assert.equal(f.ok, 1);
  assert.equal(f.failed, 0);
  assert.ok(f.bytes > 0);
  assert.ok(f.entries >= 2, "the states at 128 and 256 are listed");

  // drain the prefill worker that did turn 1: its states go with it
  const workers = (await (await fetch(`${url}/admin/workers`)).json()).workers;
  const a = workers.find((w) => w.role === "prefill" && w.jobs > 0);
  assert.ok(a, JSON.stringify(workers));
  const r = await fetch(`${url}/admin/drain?worker=${encodeURIComponent(a.addr)}`, { method: "POST" });
  assert.equal(r.status, 200, await r.text());
  for (let k = 0; k < 1500; k++) {
    const ws = (await (await fetch(`${url}/admin/workers`)).json()).workers;
    if (ws.find((w) => w.addr === a.addr && (!w.up || w.draining))) break;
    await new Promise((res) => setTimeout(res, 20));
  }

  const again = await complete(url);
  assert.equal(again.text, ref.text, "turn 2: the other prefill worker got the state at 256 from the decode worker");
  assert.equal(again.top, ref.top);
  assert.equal(again.cached, L - 134);
  f = await fetches();
  assert.equal(f.ok, 2, "turn 2: one fetch, for the prefill (the decode worker holds the state already)");
  assert.equal(f.failed, 0);
});
