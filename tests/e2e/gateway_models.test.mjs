// gateway_models: one `tokenmill gateway` serving two generated models (-m a=A.gguf -m b=B.gguf:
// a qwen3 with the Qwen2 vocabulary, a llama with the Llama 3 vocabulary) over two mixed
// workers, one per model (-m a=A.gguf, -m b=B.gguf), driven by the openai SDK. Each request
// goes to a worker of its own model (the answer equals `serve`'s of that model, greedy; the
// other model's worker gets no job), an unknown model is OpenAI's 404 (NotFoundError),
// /v1/models lists both and GET /v1/models/{id} answers one, /tokenize routes by model,
// embeddings.create equals serve's (the workers compute, the gateway pools as serve does), and
// /admin/workers names each worker's model. A worker of a model the gateway does not serve is
// refused, and its log says which ones it does.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync, spawn } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import OpenAI from "openai";
import { root, bin, startServer, startCluster, stopServers, twoTinyModels } from "./server.mjs";

const V = path.join(root, "tests/data/llama.cpp/models");
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "tm-gwmodels-"));
const C = path.join(tmp, "c.gguf");
const common = ["--ctx", "512", "--max-seqs", "2", "--kv-mib", "32"];
let A, B, G, S, gw, ref;

before(async () => {
  [A, B] = twoTinyModels(tmp);
  execFileSync(bin, ["mkmodel", "--arch", "qwen3", "--preset", "tiny", "--vocab", path.join(V, "ggml-vocab-qwen2.gguf"),
    "--type", "q8_0", "--seed", "7", "-o", C], { stdio: "pipe" });
  G = await startCluster([`a=${A}`, `b=${B}`], ["mixed", "mixed"], {
    workerModels: [`a=${A}`, `b=${B}`], workerArgs: common, gatewayArgs: ["--ctx", "512", "--register", "127.0.0.1:0"] });
  S = await startServer(`a=${A}`, ["-m", `b=${B}`, ...common]);   // the reference: both models in one serve
  gw = new OpenAI({ baseURL: `${G.url}/v1`, apiKey: "x", maxRetries: 0 });
  ref = new OpenAI({ baseURL: `${S.url}/v1`, apiKey: "x", maxRetries: 0 });
});
after(async () => {
  await stopServers();
  fs.rmSync(tmp, { recursive: true, force: true });
});

const workers = async () => (await (await fetch(`${G.url}/admin/workers`)).json());
const post = async (url, route, body) => {
  const res = await fetch(url + route, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
  return { status: res.status, body: await res.json() };
};

test("each worker says its model; /v1/models lists both, GET /v1/models/{id} one, an unknown id a 404", async () => {
  const a = await workers();
  assert.deepEqual(a.workers.map((w) => [w.name, w.model, w.up]).sort(), [["mixed0", "a", true], ["mixed1", "b", true]]);
  assert.deepEqual(a.models.map((m) => m.id), ["a", "b"]);
  const list = [];
  for await (const m of gw.models.list()) list.push(m.id);
  assert.deepEqual(list, ["a", "b"]);
  assert.equal((await gw.models.retrieve("b")).id, "b");
  await assert.rejects(gw.models.retrieve("nope"), (e) => e instanceof OpenAI.NotFoundError && e.code === "model_not_found");
});

test("chat on each model runs on that model's worker and answers as serve does", async () => {
  const messages = [{ role: "user", content: "Name three colours." }];
  for (const model of ["a", "b", "a"]) {
    const before_ = await workers();
    const r = await gw.chat.completions.create({ model, messages, max_tokens: 12, temperature: 0 });
    const want = await ref.chat.completions.create({ model, messages, max_tokens: 12, temperature: 0 });
    assert.equal(r.model, model);
    assert.equal(r.choices[0].message.content, want.choices[0].message.content, model);
    assert.deepEqual(r.usage, want.usage, model);
    const after_ = await workers();
    for (const w of after_.workers) {
      const jobs0 = before_.workers.find((x) => x.name === w.name).jobs;
      if (w.model === model) assert.ok(w.jobs > jobs0, `${w.name} (${w.model}) got no job for ${model}`);
      else assert.equal(w.jobs, jobs0, `${w.name} (${w.model}) got a job for ${model}`);
    }
  }
  // the two models answer apart (else the check above proves little)
  const ra = await gw.completions.create({ model: "a", prompt: "Once upon a time", max_tokens: 8, temperature: 0 });
  const rb = await gw.completions.create({ model: "b", prompt: "Once upon a time", max_tokens: 8, temperature: 0 });
  assert.notEqual(ra.choices[0].text, rb.choices[0].text);
});

test("an unknown model is OpenAI's 404 through the SDK, on chat and completions", async () => {
  const check = (e) => e instanceof OpenAI.NotFoundError && e.code === "model_not_found" && /nope/.test(e.message);
  await assert.rejects(gw.chat.completions.create({ model: "nope", messages: [{ role: "user", content: "hi" }], max_tokens: 2 }), check);
  await assert.rejects(gw.completions.create({ model: "nope", prompt: "hi", max_tokens: 2 }), check);
});

test("/tokenize and /detokenize route by model, as serve's", async () => {
  const text = "Hello world, tokenmill";
  for (const model of ["a", "b"]) {
    const t = await post(G.url, "/tokenize", { model, content: text, with_pieces: true });
    assert.equal(t.status, 200);
    assert.deepEqual(t.body, (await post(S.url, "/tokenize", { model, content: text, with_pieces: true })).body, model);
    const ids = t.body.tokens.map((x) => x.id);
    const d = await post(G.url, "/detokenize", { model, tokens: ids });
    assert.equal(d.status, 200);
    assert.equal(d.body.content, text);
  }
  const u = await post(G.url, "/tokenize", { model: "nope", content: "hi" });
  assert.equal(u.status, 404);
  assert.equal(u.body.error.code, "model_not_found");
});

test("embeddings.create through the gateway equals serve's, per model, float and base64; rerank answers as serve", async () => {
  for (const model of ["a", "b"]) {
    const input = ["hello world", "the quick brown fox"];
    const got = await gw.embeddings.create({ model, input });
    const want = await ref.embeddings.create({ model, input });
    assert.equal(got.model, model);
    assert.deepEqual(got.usage, want.usage, model);
    assert.equal(got.data.length, 2);
    got.data.forEach((d, i) => {
      assert.equal(d.embedding.length, want.data[i].embedding.length);
      d.embedding.forEach((x, k) => assert.ok(Math.abs(x - want.data[i].embedding[k]) < 1e-6, `${model}[${i}][${k}]`));
    });
    const b64 = await post(G.url, "/v1/embeddings", { model, input: "hello world", encoding_format: "base64" });
    assert.equal(b64.status, 200);
    const f = new Float32Array(new Uint8Array(Buffer.from(b64.body.data[0].embedding, "base64")).buffer);
    assert.ok(f.every((x, k) => Math.abs(x - want.data[0].embedding[k]) < 1e-6), `${model} base64`);
  }
  await assert.rejects(gw.embeddings.create({ model: "nope", input: "hi" }), (e) => e instanceof OpenAI.NotFoundError);
  // neither model is a reranker: the gateway's answer is serve's 400, not a 501
  const body = { model: "a", query: "q", documents: ["x", "y"] };
  const [rg, rs] = [await post(G.url, "/v1/rerank", body), await post(S.url, "/v1/rerank", body)];
  assert.equal(rg.status, 400);
  assert.deepEqual(rg.body, rs.body);
});

test("a worker of a model the gateway does not serve is refused, told which ones it does", async () => {
  const env = G.env;   // the cluster's key
  const p = spawn(bin, ["worker", "--role", "mixed", "-m", `c=${C}`, "--gateway", G.register, "--threads", "1", ...common],
    { stdio: ["ignore", "ignore", "pipe"], env });
  let log = "";
  p.stderr.on("data", (d) => { log += d; });
  try {
    for (let k = 0; k < 1500 && !/refused by the gateway/.test(log); k++) await new Promise((r) => setTimeout(r, 20));
    assert.match(log, /refused by the gateway [^:]+:\d+: it serves the model 'c', which this gateway does not serve \(it serves 'a', 'b'\)/);
    assert.equal((await workers()).workers.length, 2);
  } finally {
    p.kill("SIGKILL");
  }
});

// `store stat` on a store holding the blocks of two models of one geometry (a and c: the same
// shape, other weights): one block-size line per model's pool, each saying which
test("store stat: one block-size line per pool when the store holds two models' blocks", async () => {
  const dir = fs.mkdtempSync(path.join(tmp, "store-"));
  const srv = await startServer(`a=${A}`, ["-m", `c=${C}`, ...common, "--cache", `dir:${dir}`]);
  const c = new OpenAI({ baseURL: `${srv.url}/v1`, apiKey: "x", maxRetries: 0 });
  const prompt = "the quick brown fox jumps over the lazy dog and runs away ".repeat(20);
  for (const model of ["a", "c"]) await c.completions.create({ model, prompt, max_tokens: 2, temperature: 0 });
  await stopServers();   // a clean shutdown finishes the write-behind (the cluster is not needed after this)
  const stat = execFileSync(bin, ["store", "stat", `dir:${dir}`], { encoding: "utf8" });
  const lines = stat.split("\n").filter((l) => /^  [\d.]+ KiB: /.test(l));
  assert.equal(lines.length, 2, stat);
  const pools = lines.map((l) => /: \d+ blocks \(pool ([0-9a-f]{8})\)$/.exec(l)?.[1]);
  assert.ok(pools[0] && pools[1] && pools[0] !== pools[1], stat);
  assert.equal(lines[0].replace(/: \d+ blocks.*/, ""), lines[1].replace(/: \d+ blocks.*/, ""));   // one geometry
});
