// embeddings: POST /v1/embeddings on `tokenmill serve` against llama.cpp's embeddings
// (node-llama-cpp's createEmbeddingContext / getEmbeddingFor on the same GGUF), for the two
// poolings a GGUF declares that tokenmill's architectures take: last-token (Qwen3-Embedding's)
// and mean; through the openai SDK's embeddings.create, float and base64; the bounds and
// errors in OpenAI's shape; /v1/rerank on a Qwen3-Reranker-shaped GGUF against llama.cpp's
// ranking (createRankingContext / rank); both through a gateway equal to serve's.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import path from "node:path";
import fs from "node:fs";
import os from "node:os";
import { execFileSync } from "node:child_process";
import { getLlama } from "node-llama-cpp";
import OpenAI from "openai";
import { root, bin, startServer, startCluster, stopServers } from "./server.mjs";

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "tm-embed-"));
const mk = (name, ...args) => {
  const out = path.join(tmp, name);
  execFileSync(bin, ["mkmodel", "--arch", "qwen3", "--type", "f32", "--seed", "11", "--layers", "2", "--dim", "128",
    "--ffn", "256", "--heads", "4", "--kv-heads", "2", ...args, "-o", out], { stdio: "pipe" });
  return out;
};
const models = {};
let llama;

before(async () => {
  models.last = mk("last.gguf", "--pooling", "last");
  models.mean = mk("mean.gguf", "--pooling", "mean");
  models.rank = mk("rank.gguf", "--pooling", "rank");
  llama = await getLlama({ gpu: false, build: "never", logLevel: "fatal" });
});
after(async () => {
  await stopServers();
  fs.rmSync(tmp, { recursive: true, force: true });
});

const norm = (v) => {
  const n = Math.sqrt(v.reduce((s, x) => s + x * x, 0));
  return Array.from(v, (x) => x / n);
};
const cos = (a, b) => a.reduce((s, x, i) => s + x * b[i], 0) / Math.sqrt(a.reduce((s, x) => s + x * x, 0) * b.reduce((s, x) => s + x * x, 0));

async function post(url, body) {
  const res = await fetch(url + "/v1/embeddings", { method: "POST", headers: { "content-type": "application/json" },
    body: typeof body === "string" ? body : JSON.stringify(body) });
  return { status: res.status, body: await res.json() };
}

const texts = ["Once upon a time there was a little dog.", "hello", "The quick brown fox jumps over the lazy dog, twice over."];

for (const kind of ["last", "mean"]) {
  test(`${kind} pooling agrees with llama.cpp's embeddings (cosine >= 0.999), batched or alone`, async () => {
    const srv = await startServer(models[kind]);
    const m = await llama.loadModel({ modelPath: models[kind] });
    const ctx = await m.createEmbeddingContext({ contextSize: 512 });
    const ids = [];
    for (const t of texts) {
      const r = await fetch(srv.url + "/tokenize", { method: "POST", body: JSON.stringify({ content: t, add_special: true }) });
      ids.push((await r.json()).tokens);
    }
    // the three in one call (one step of the scheduler) and each alone, as text and as ids
    const all = await post(srv.url, { input: texts });
    assert.equal(all.status, 200, JSON.stringify(all.body));
    assert.equal(all.body.object, "list");
    assert.equal(all.body.usage.prompt_tokens, ids.reduce((s, x) => s + x.length, 0));
    const byIds = await post(srv.url, { input: ids });
    for (let i = 0; i < texts.length; i++) {
      const got = all.body.data[i].embedding;
      assert.equal(all.body.data[i].index, i);
      assert.equal(got.length, 128);
      assert.ok(Math.abs(got.reduce((s, x) => s + x * x, 0) - 1) < 1e-4, "L2-normalised");
      assert.deepEqual(byIds.body.data[i].embedding, got, "ids and text give one vector");
      const alone = await post(srv.url, { input: texts[i] });
      assert.deepEqual(alone.body.data[0].embedding, got, "batch-invariant");
      const want = norm((await ctx.getEmbeddingFor(ids[i])).vector);
      const c = cos(got, want);
      assert.ok(c >= 0.999, `${kind} input ${i}: cosine ${c}`);
    }
    await ctx.dispose();
    await m.dispose();
  });
}

test("openai SDK embeddings.create: float and base64, dimensions, errors", async () => {
  const srv = await startServer(models.last, ["--ctx", "512"]);
  const client = new OpenAI({ baseURL: srv.url + "/v1", apiKey: "x" });
  const f = await client.embeddings.create({ model: "last", input: ["a dog", "a cat"], encoding_format: "float" });
  assert.equal(f.data.length, 2);
  assert.equal(f.data[0].embedding.length, 128);
  // the SDK decodes base64 itself (its default when encoding_format is not given)
  const b = await client.embeddings.create({ model: "last", input: ["a dog", "a cat"] });
  for (let i = 0; i < 2; i++)
    for (let d = 0; d < 128; d++) assert.ok(Math.abs(b.data[i].embedding[d] - f.data[i].embedding[d]) < 1e-6);
  const raw = await post(srv.url, { input: "a dog", encoding_format: "base64" });
  const buf = Buffer.from(raw.body.data[0].embedding, "base64");
  assert.equal(buf.length, 128 * 4);
  assert.ok(Math.abs(buf.readFloatLE(0) - f.data[0].embedding[0]) < 1e-6);
  // Matryoshka (qwen3 with last-token pooling): the first N components, renormalised
  const d = await client.embeddings.create({ model: "last", input: "a dog", dimensions: 64, encoding_format: "float" });
  assert.equal(d.data[0].embedding.length, 64);
  const want = norm(f.data[0].embedding.slice(0, 64));
  for (let i = 0; i < 64; i++) assert.ok(Math.abs(d.data[0].embedding[i] - want[i]) < 1e-5);
  // errors: 400s in OpenAI's shape naming the field
  for (const [body, param] of [[{ input: "" }, "input"], [{ input: [] }, "input"], [{ input: ["x", ""] }, "input[1]"],
    [{ input: [[1, 1 << 20]] }, "input[0][1]"], [{ input: 5 }, "input"], [{ input: "x", dimensions: 8 }, "dimensions"],
    [{ input: "x", dimensions: 129 }, "dimensions"], [{ input: "x", encoding_format: "hex" }, "encoding_format"],
    [{ input: Array(2049).fill("x") }, "input"], [{ input: "x", extra: 1 }, "extra"],
    [{ input: Array(600).fill(7) }, "input"], [{ input: ["x", Array(512).fill(7)] }, "input[1]"]]) {
    const e = await post(srv.url, body);
    assert.equal(e.status, 400, JSON.stringify(body).slice(0, 80));
    assert.equal(e.body.error.param, param, JSON.stringify(e.body));
    assert.equal(e.body.error.type, "invalid_request_error");
    if ([body.input, body.input?.[1]].some((x) => Array.isArray(x) && x.length >= 512 && typeof x[0] === "number")) assert.equal(e.body.error.code, "context_length_exceeded");
  }
  assert.equal((await post(srv.url, { input: "x", model: "nope" })).status, 404);
  await assert.rejects(client.embeddings.create({ model: "last", input: "" }), (err) => err.status === 400);
});

test("a model without Matryoshka refuses dimensions; a chat model (no pooling key) is pooled by the mean", async () => {
  const srv = await startServer(models.mean);
  const e = await post(srv.url, { input: "x", dimensions: 64 });
  assert.equal(e.status, 400);
  assert.match(e.body.error.message, /Matryoshka/);
  const ok = await post(srv.url, { input: "x", dimensions: 128 });
  assert.equal(ok.status, 200);
  const chat = await startServer(path.join(root, "models/stories260K.gguf"));
  const r = await post(chat.url, { input: ["Once upon a time", "Once"] });
  assert.equal(r.status, 200);
  assert.equal(r.body.data[0].embedding.length, 64);
  assert.notDeepEqual(r.body.data[0].embedding, r.body.data[1].embedding);
});

test("rerank: Qwen3-Reranker-style scores equal llama.cpp's ranking, sorted, top_n, return_documents; errors", async () => {
  const srv = await startServer(models.rank);
  const m = await llama.loadModel({ modelPath: models.rank });
  const ctx = await m.createRankingContext({ contextSize: 512 });   // the GGUF's own rerank template
  const query = "a dog", documents = ["dogs bark at night", "cats meow", "a dog runs in the park", "stocks fell"];
  const want = [];
  for (const d of documents) want.push(await ctx.rank(query, d));
  const rr = async (route, body) => {
    const res = await fetch(srv.url + route, { method: "POST", body: JSON.stringify(body) });
    return { status: res.status, body: await res.json() };
  };
  const all = await rr("/v1/rerank", { query, documents });
  assert.equal(all.status, 200, JSON.stringify(all.body));
  assert.equal(all.body.results.length, documents.length);
  for (const x of all.body.results) assert.ok(Math.abs(x.relevance_score - want[x.index]) < 1e-4, `${x.index}: ${x.relevance_score} vs ${want[x.index]}`);
  const order = want.map((w, i) => [w, i]).sort((a, b) => b[0] - a[0]).map((x) => x[1]);
  assert.deepEqual(all.body.results.map((x) => x.index), order);
  assert.ok(all.body.usage.prompt_tokens > 0);
  const top = await rr("/rerank", { query, documents, top_n: 2, return_documents: true });
  assert.deepEqual(top.body.results.map((x) => [x.index, x.document.text]), order.slice(0, 2).map((i) => [i, documents[i]]));
  for (const [body, param] of [[{ documents }, "query"], [{ query, documents: [] }, "documents"],
    [{ query, documents: ["a", 5] }, "documents[1]"], [{ query, documents, top_n: 0 }, "top_n"]]) {
    const e = await rr("/v1/rerank", body);
    assert.equal(e.status, 400, JSON.stringify(body));
    assert.equal(e.body.error.param, param);
  }
  // a model that is no reranker says so; a reranker gives no embeddings
  const chat = await startServer(models.mean);
  const no = await fetch(chat.url + "/v1/rerank", { method: "POST", body: JSON.stringify({ query, documents }) });
  assert.equal(no.status, 400);
  assert.match((await no.json()).error.message, /cannot rerank/);
  assert.equal((await post(srv.url, { input: "x" })).status, 400);
  await ctx.dispose();
  await m.dispose();
});

// through a gateway, the vectors come from a worker of the model and the answers are serve's:
// embeddings (last-token pooling) and rerank, each model on its own worker
test("the gateway serves embeddings and rerank as serve does, on the workers of each model", async () => {
  const gw = await startCluster([`last=${models.last}`, `rank=${models.rank}`], ["mixed", "mixed"], {
    workerModels: [`last=${models.last}`, `rank=${models.rank}`], gatewayArgs: ["--register", "127.0.0.1:0"] });
  const srv = await startServer(`last=${models.last}`, ["-m", `rank=${models.rank}`]);
  const ask = async (url, route, body) => {
    const res = await fetch(url + route, { method: "POST", body: JSON.stringify(body) });
    return { status: res.status, body: await res.json() };
  };
  const close = (a, b, what) => a.forEach((x, i) => assert.ok(Math.abs(x - b[i]) < 1e-5, `${what}[${i}]: ${x} vs ${b[i]}`));
  const eb = { model: "last", input: ["hello world", "a second input"] };
  const [eg, es] = [await ask(gw.url, "/v1/embeddings", eb), await ask(srv.url, "/v1/embeddings", eb)];
  assert.equal(eg.status, 200, JSON.stringify(eg.body));
  assert.deepEqual(eg.body.usage, es.body.usage);
  eg.body.data.forEach((d, i) => close(d.embedding, es.body.data[i].embedding, `embedding ${i}`));
  const rb = { model: "rank", query: "what is a fox", documents: ["a fox is an animal", "paris is a city", "foxes"], top_n: 2 };
  const [rg, rs] = [await ask(gw.url, "/v1/rerank", rb), await ask(srv.url, "/v1/rerank", rb)];
  assert.equal(rg.status, 200, JSON.stringify(rg.body));
  assert.deepEqual(rg.body.results.map((x) => x.index), rs.body.results.map((x) => x.index));
  close(rg.body.results.map((x) => x.relevance_score), rs.body.results.map((x) => x.relevance_score), "score");
  // the reranker is no embedding model, through the gateway as on serve
  const bad = { model: "rank", input: "x" };
  const [bg, bs] = [await ask(gw.url, "/v1/embeddings", bad), await ask(srv.url, "/v1/embeddings", bad)];
  assert.equal(bg.status, bs.status);
  assert.deepEqual(bg.body, bs.body);
  await stopServers();
});
