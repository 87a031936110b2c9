// qwen35_serve: a Qwen3.5 model (gguf-py's qwen35, tests/oracle/gguf_qwen35.py) through the real
// `tokenmill serve`. Its linear-attention layers carry a recurrent state per sequence that a
// block's KV cannot restore, so the server reuses no prefix (said on the start-up line): the
// same 300-token prompt sent again, prompts sharing 200 tokens sent together (batched in the same
// steps), and the same prompts after them all answer exactly what each answers alone on a fresh
// server, with no cached tokens. A worker refuses the model (no cluster for it yet).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";

import { bin, root, startServer, stopServers, postCompletion } from "./server.mjs";

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "tm-q35-"));
const vocab = path.join(tmp, "vocab.gguf"), model = path.join(tmp, "qwen35.gguf");
const python = ["python3", "/usr/bin/python3"].find((py) => spawnSync(py, ["-c", "import numpy"]).status === 0);
const skip = !fs.existsSync(path.join(root, "tests/data/llama.cpp/gguf-py")) ? "no tests/data/llama.cpp"
  : !python ? "no python3 with numpy" : false;

before(() => {
  if (skip) return;
  let r = spawnSync(bin, ["mkmodel", "--arch", "qwen3", "--preset", "tiny", "--layers", "1", "--vocab-size", "8192",
    "--type", "f32", "--seed", "1", "-o", vocab], { encoding: "utf8" });
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

async function complete(srv, prompt) {
  const j = await postCompletion(srv.url, { model: "m", prompt, max_tokens: 12, temperature: 0 });
  assert.equal(j.usage.prompt_tokens, prompt.length);
  return { text: j.choices[0].text, cached: j.usage.prompt_tokens_details?.cached_tokens ?? 0 };
}

test("qwen35 serve: no prefix reuse, answers equal each prompt alone (repeated, shared prefixes, batched)",
  { skip, timeout: 120000 }, async () => {
    const alone = [];
    for (const p of prompts) {   // each on a fresh server: nothing to reuse, nothing beside it
      const S = await startServer(model, ["--ctx", "512", "--model-name", "m"]);
      alone.push((await complete(S, p)).text);
      S.proc.kill("SIGTERM");
    }
    const S = await startServer(model, ["--ctx", "512", "--model-name", "m", "--max-seqs", "4"]);
    assert.match(S.log, /2 linear-attention layers|3 linear-attention layers/);
    assert.match(S.log, /no prefix reuse/);
    const again = [];
    for (const p of prompts) again.push(await complete(S, p));
    const together = await Promise.all(prompts.map((p) => complete(S, p)));
    const after2 = [];
    for (const p of prompts) after2.push(await complete(S, p));
    for (const [label, got] of [["sequential", again], ["batched", together], ["repeated", after2]])
      got.forEach((g, i) => {
        assert.equal(g.text, alone[i], `${label} prompt ${i}`);
        assert.equal(g.cached, 0, `${label} prompt ${i}: cached tokens`);
      });
  });

test("qwen35: a cluster worker refuses the model with a message", { skip }, () => {
  const r = spawnSync(bin, ["worker", "--role", "mixed", "-m", model, "--listen", "127.0.0.1:0", "--gateway", "127.0.0.1:1",
    "--cache", `dir:${path.join(tmp, "store")}`, "--threads", "1"], { encoding: "utf8", timeout: 30000 });
  assert.notEqual(r.status, 0);
  assert.match(r.stderr, /linear-attention layers \(qwen35\) runs in `tokenmill serve`, not in a cluster/);
});
