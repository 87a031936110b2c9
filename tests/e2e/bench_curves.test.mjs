// bench_curves: `tokenmill bench curves` on a generated qwen3 model: the JSON has one point per
// swept prefill step size and stream count, each with positive throughput and latency (no
// timing is compared: the machine is shared), per-user tokens/s is the aggregate over the
// streams, and --svg writes the four charts with a drawn line each. Bad lists exit 2.
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync, spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { bin, startServer, stopServers } from "./server.mjs";

after(stopServers);

test("bench curves: one point per swept value, JSON and SVG; serve --curves shows the decode curve", async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "tm-curves-"));
  try {
    const model = path.join(dir, "q3.gguf"), svg = path.join(dir, "curves.svg");
    execFileSync(bin, ["mkmodel", "--arch", "qwen3", "--preset", "tiny", "--type", "f16", "--seed", "5", "-o", model], { stdio: "pipe" });
    const out = execFileSync(bin, ["bench", "curves", "-m", model, "--threads", "1", "--prefill-steps", "16,64,128",
                                   "--steps", "2", "--streams", "1,4,8", "--tg", "8", "--svg", svg], { encoding: "utf8" });
    const r = JSON.parse(out);
    assert.deepEqual(r.prefill.map((p) => p.step_tokens), [16, 64, 128]);
    assert.deepEqual(r.decode.map((p) => p.streams), [1, 4, 8]);
    for (const p of r.prefill) assert.ok(p.tok_s > 0 && p.step_ms > 0, JSON.stringify(p));
    for (const p of r.decode) {
      assert.ok(p.tok_s > 0 && p.per_user_tok_s > 0 && p.step_ms > 0, JSON.stringify(p));
      assert.ok(Math.abs(p.per_user_tok_s * p.streams - p.tok_s) <= 1e-3 * p.tok_s + 0.01, JSON.stringify(p));
    }
    const s = fs.readFileSync(svg, "utf8");
    for (const id of ["prefill_throughput", "prefill_latency", "decode_aggregate", "decode_per_user"])
      assert.match(s, new RegExp(`data-chart="${id}"`));
    assert.equal((s.match(/<polyline /g) || []).length, 4);
    assert.equal((s.match(/<circle /g) || []).length, 12);
    // the status page places its users on the stored curve
    const json = path.join(dir, "curves.json");
    fs.writeFileSync(json, out);
    const S = await startServer(model, ["--curves", json]);
    const page = await (await fetch(`${S.url}/`)).text();
    assert.match(page, /data-chart="decode_curve"/);
    assert.match(page, /data-curve-at="0"/);
    const badCurves = spawnSync(bin, ["serve", "-m", model, "--port", "0", "--cache", "off", "--curves", svg], { encoding: "utf8" });
    assert.equal(badCurves.status, 2);
    assert.match(badCurves.stderr, /bad --curves/);
    // bad input: a clear message and exit 2
    for (const args of [["--streams", "0"], ["--prefill-steps", "16,x"], ["--streams", ""]]) {
      const bad = spawnSync(bin, ["bench", "curves", "-m", model, ...args], { encoding: "utf8" });
      assert.equal(bad.status, 2, args.join(" "));
      assert.match(bad.stderr, /tokenmill bench/);
    }
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
