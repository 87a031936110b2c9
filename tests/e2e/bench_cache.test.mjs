// bench_cache: a tiny run of bench/cache_agents (tokenmill with and without its caches beside
// llama.cpp's per-slot prompt caching) checks that the benchmark still runs end to end and
// that its figures mean what they say. Nothing here is timed: only the hit rates, which are
// deterministic for this workload, and the shape of the JSON report are checked.
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { root, bin } from "./server.mjs";
import { benchPresets } from "../../bench/models.mjs";

test("bench/cache_agents: tiny agent workload, tokenmill and llama.cpp, hit rates", { timeout: 180000 }, () => {
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "tm-bench-cache-test-"));
  try {
    const model = path.join(tmp, "small.gguf");
    execFileSync(bin, ["mkmodel", "--arch", "qwen3", "--preset", "small", "--type", "q8_0", "--seed", "3", "-o", model], { stdio: "ignore" });
    const out = path.join(tmp, "out.json");
    // 2 agents x 2 turns; system 300 tokens = 2 full blocks, each turn +130 tool +4 answer tokens
    const text = execFileSync(process.execPath, [path.join(root, "bench/cache_agents.mjs"), "-m", model, "--agents", "2", "--turns", "2",
      "--system", "300", "--tool", "130", "--answer", "4", "--threads", "1", "--llama-slots", "agents", "--wait-quiet", "0", "--json", out],
    { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, TM_BIN: bin } });
    assert.match(text, /tokenmill restarted/);
    assert.match(text, /llama\.cpp \/ tokenmill/);
    // the restarted run's block load time against recomputing a block's 128 tokens
    assert.match(text, /tokenmill restarted: a 128-token block loads in \d+\.\d+ ms of I\/O-thread time .*recomputing 128 tokens takes \d+\.\d+ ms/);
    const j = JSON.parse(fs.readFileSync(out, "utf8"));
    const run = Object.fromEntries(j.runs.map((r) => [r.key, r]));
    assert.deepEqual(Object.keys(run).sort(), ["ll-2", "ll-noreuse", "tm-nocache", "tm-ram", "tm-restart", "tm-store"]);
    for (const r of j.runs) {
      assert.ok(r.ttft_mean_ms > 0 && r.ttft_p99_ms > 0 && r.wall_s > 0, `${r.key}: timings present`);
      assert.equal(r.reps[0].prompt_tokens, 2 * (430 + 564), `${r.key}: prompt tokens`);
    }
    // nothing reused without caches; tokenmill reuses whole 128-token blocks only
    assert.equal(run["tm-nocache"].hit, 0);
    assert.equal(run["ll-noreuse"].hit, 0);
    // after a restart every full block below the last prompt token comes from the store:
    // turn 1 (430 tokens): 3 blocks, turn 2 (564 tokens): 4 blocks, for each agent
    assert.equal(run["tm-restart"].reps[0].cached_tokens, 2 * (3 + 4) * 128);
    assert.ok(run["tm-restart"].reps[0].store.blocks_loaded_total > 0, "restart loads blocks from the store");
    // llama.cpp, one slot per agent: turn 2 reuses its slot's whole previous prompt (430 tokens;
    // a little more if a generated token happens to equal the fixed answer id after it)
    const ll = run["ll-2"].reps[0].cached_tokens;
    assert.ok(ll >= 2 * 430 && ll <= 2 * 433, `llama.cpp reused ${ll} tokens`);
    assert.ok(run["tm-restart"].speedup > 0 && run["tm-restart"].ideal > 1);
  } finally {
    fs.rmSync(tmp, { recursive: true, force: true });
  }
});

test("bench/cache_agents: an unknown --preset is refused", () => {
  let err;
  try {
    execFileSync(process.execPath, [path.join(root, "bench/cache_agents.mjs"), "--preset", "nope"], { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] });
  } catch (e) { err = e; }
  assert.ok(err && err.status === 2, "exit status 2");
  // the message lists every preset bench/models.mjs knows
  assert.match(err.stderr, new RegExp(`unknown bench model preset 'nope' \\(${Object.keys(benchPresets).join(", ").replace(/\./g, "\\.")}\\)`));
});
