// window: the window cache of sliding-window models through the real `tokenmill serve`, on a
// generated gpt-oss model (6 layers, a 48-token window on the even ones: an exact replay spans
// 48 + 2 * 47 = 142 positions, more than the one block a bounded replay recomputes). A
// 300-token prompt computes two full blocks and captures the window state at 128 and 256.
// Sent again, it attaches the blocks and the state at 256 and answers exactly as the first time;
// after a restart (states gone, blocks in the store) the same request replays: bounded by
// default, exact with --window-replay exact (then the answer is again the first one); a state
// older than --window-ttl is not used. Cached tokens count at most L - 134 in every API.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";

import { bin, startServer as startServerOf, stopServers, fetchMetrics, postCompletion } from "./server.mjs";
import { makeWindowModel, WINDOW_MODEL_NAME, WINDOW_PROMPT, WINDOW_PROMPT_LEN } from "./window_model.mjs";

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "tm-window-"));
const model = path.join(tmp, "gpt-oss.gguf");
const store = path.join(tmp, "store");
const NAME = WINDOW_MODEL_NAME;
const startServer = (args = [], dir = store) => startServerOf(model, ["--ctx", "512", "--max-seqs", "2",
  "--model-name", NAME, "--cache-dir", dir, ...args]);

before(() => {
  fs.mkdirSync(store);
  makeWindowModel(model);
});

after(async () => {
  await stopServers();
  fs.rmSync(tmp, { recursive: true, force: true });
});

const L = WINDOW_PROMPT_LEN, PROMPT = WINDOW_PROMPT;
async function complete(srv) {
  const j = await postCompletion(srv.url, { model: NAME, prompt: PROMPT, max_tokens: 8, temperature: 0 });
  assert.equal(j.usage.prompt_tokens, L);
  return { text: j.choices[0].text, cached: j.usage.prompt_tokens_details.cached_tokens };
}
const wm = async (srv, name) => (await fetchMetrics(srv.url))[`tokenmill_window_${name}`];

test("window cache: a hit is identical to no cache, a restart replays (bounded, exact), TTL", { timeout: 240000 }, async () => {
  let S = await startServer();
  assert.match(S.log, /3 window layers \(window 48\) keep a ring of 54 positions per sequence/);
  const first = await complete(S);
  assert.equal(first.cached, 0);
  assert.equal(await wm(S, "puts_total"), 2);   // the states at 128 and 256
  assert.equal(await wm(S, "entries"), 2);
  const again = await complete(S);
  assert.equal(again.text, first.text, "with the window state, the answer is the uncached one");
  assert.equal(again.cached, L - 134, "256 attached, counted as at most L - 134");
  assert.equal(await wm(S, "hits_total"), 1);
  assert.equal(await wm(S, "misses_total"), 0);
  await stopServers();

  // a restart: the blocks are in the store, the window states are gone
  S = await startServer();
  const bounded = await complete(S);
  assert.equal(bounded.cached, L - 134);
  assert.equal(await wm(S, "misses_total"), 1);
  assert.equal(await wm(S, "replays_bounded_total"), 1);
  assert.equal(await wm(S, "replay_tokens_total"), 128);
  assert.equal(await wm(S, "replays_exact_total"), 0);
  await stopServers();

  S = await startServer(["--window-replay", "exact"]);
  const exact = await complete(S);
  assert.equal(exact.text, first.text, "exact replay answers as without any cache");
  assert.equal(await wm(S, "replays_exact_total"), 1);
  assert.equal(await wm(S, "replay_tokens_total"), 142);
  await stopServers();

  // --window-ttl: a state older than it is a miss (and dropped); an empty store, so that the
  // first request computes everything and keeps its states
  const store2 = path.join(tmp, "store2");
  fs.mkdirSync(store2);
  S = await startServer(["--window-ttl", "0.5"], store2);
  await complete(S);
  assert.equal(await wm(S, "puts_total"), 2);
  await new Promise((r) => setTimeout(r, 1500));
  await complete(S);
  assert.equal(await wm(S, "expired_total"), 1);
  assert.equal(await wm(S, "hits_total"), 0);
  assert.equal(await wm(S, "replays_bounded_total"), 1);
  await stopServers();
});

test("--window-replay and --window-mib refuse bad values", () => {
  for (const args of [["--window-replay", "maybe"], ["--window-mib", "-1"], ["--window-ttl", "0"]]) {
    let err = null;
    try {
      execFileSync(bin, ["serve", "-m", model, "--port", "0", ...args], { stdio: "pipe", timeout: 20000 });
    } catch (e) { err = e; }
    assert.ok(err && err.status === 2, `${args.join(" ")}: exit ${err?.status}`);
  }
});
