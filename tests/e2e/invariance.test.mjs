// invariance: greedy answers of `tokenmill serve` do not depend on what else the server is
// running. A random-weight qwen3 Q8_0 model (these amplify last-bit differences, so any
// batch-dependent arithmetic shows up as different text) answers 6 prompts of different
// lengths one at a time, then all 6 at once (the scheduler batches them in steps whose
// make-up depends on timing), twice: every answer must be the same text each time.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";

import { bin, postCompletion, startServer, stopServers } from "./server.mjs";

let S, dir;
const N = 6;
const prompt = (c) => `prompt ${c}: ` + "word ".repeat(12 * c + 3 * (c % 2));

before(async () => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), "tm-invariance-"));
  const model = path.join(dir, "q3.gguf");
  const r = spawnSync(bin, ["mkmodel", "--arch", "qwen3", "--layers", "4", "--dim", "256", "--ffn", "512",
    "--heads", "4", "--kv-heads", "2", "--type", "q8_0", "--seed", "3", "-o", model], { encoding: "utf8" });
  assert.equal(r.status, 0, r.stderr);
  S = await startServer(model, ["--threads", "2", "--max-seqs", "8", "--cache", "off"]);
});

after(async () => {
  await stopServers();
  if (dir) fs.rmSync(dir, { recursive: true, force: true });
});

async function complete(c) {
  return (await postCompletion(S.url, { model: "q3", prompt: prompt(c), max_tokens: 80, temperature: 0 })).choices[0].text;
}

test("greedy answers are the same alone and under concurrent load", async () => {
  const alone = [];
  for (let c = 0; c < N; c++) alone.push(await complete(c));
  for (let run = 0; run < 2; run++) {
    const together = await Promise.all(Array.from({ length: N }, (_, c) => complete(c)));
    together.forEach((t, c) => assert.equal(t, alone[c], `run ${run}, prompt ${c}: concurrent answer differs from alone`));
  }
});
