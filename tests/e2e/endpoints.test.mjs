// endpoints: the routes and options that clients written for other servers expect, on one
// `tokenmill serve` of models/stories260K.gguf and (where the gateway answers them itself) on a
// gateway without workers:
//  - POST /tokenize and /detokenize in llama.cpp server's shapes, token for token against
//    llama.cpp (node-llama-cpp, vocabulary only);
//  - CORS (--cors-origin): preflights answered, the headers on answers, errors and streams,
//    only for the origins named (the gateway: any);
//  - Anthropic prompt caching: cache_control on every block type, usage's
//    cache_creation_input_tokens (the full blocks a request wrote) beside cache reads, on serve
//    and through a gateway with a mixed worker.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import path from "node:path";
import fs from "node:fs";
import os from "node:os";
import { execFileSync } from "node:child_process";
import { getLlama } from "node-llama-cpp";
import Anthropic from "@anthropic-ai/sdk";
import { root, bin, startServer, startCluster, stopServers } from "./server.mjs";

const stories = path.join(root, "models/stories260K.gguf");
let srv, gw, vocab;

before(async () => {
  srv = await startServer(stories, ["--cors-origin", "https://app.example", "--cors-origin", "http://localhost:5173",
    "--api-key", "k"]);
  gw = await startCluster(stories, [], { gatewayArgs: ["--register", "127.0.0.1:0", "--cors-origin", "*"] });
  const llama = await getLlama({ gpu: false, build: "never", logLevel: "fatal" });
  vocab = await llama.loadModel({ modelPath: stories, vocabOnly: true });
});
after(stopServers);

async function post(url, route, body, headers = { authorization: "Bearer k" }) {
  const res = await fetch(url + route, { method: "POST", headers: { "content-type": "application/json", ...headers },
    body: typeof body === "string" ? body : JSON.stringify(body) });
  return { status: res.status, headers: res.headers, body: await res.json() };
}

test("/tokenize and /detokenize answer in llama.cpp's shapes, on serve and on the gateway", async () => {
  const texts = ["Once upon a time, there was a little dog.", "  two  spaces\nand a line", "é ü 日本"];
  for (const url of [srv.url, gw.url]) {
    for (const text of texts) {
      const want = Array.from(vocab.tokenize(text, false));
      const r = await post(url, "/tokenize", { content: text });
      assert.equal(r.status, 200, JSON.stringify(r.body));
      assert.deepEqual(r.body.tokens, want, text);
      const d = await post(url, "/detokenize", { tokens: want });
      assert.equal(d.status, 200);
      // SPM writes the space it put before the text back, as llama.cpp's /detokenize does
      assert.equal(d.body.content, " " + text);
    }
    // add_special: BOS first; with_pieces: ids and pieces, a piece not valid UTF-8 as bytes
    // (llama.cpp's README example, 'á' on this very vocabulary)
    const p = await post(url, "/tokenize", { content: "Once á", add_special: true, with_pieces: true });
    assert.deepEqual(p.body.tokens, [{ id: 1, piece: "<s>" }, { id: 403, piece: " Once" }, { id: 410, piece: " " },
      { id: 198, piece: [195] }, { id: 164, piece: [161] }]);
    const d = await post(url, "/detokenize", { tokens: [1, 403, 198, 164] });
    assert.equal(d.body.content, "<s> Onceá");
    // a mixed array: add_special applies to the leading string only
    const m = await post(url, "/tokenize", { content: ["Once", 5, "Once"], add_special: true });
    assert.deepEqual(m.body.tokens, [1, 403, 5, 403]);
    // bad input: 400s in OpenAI's shape naming the field
    for (const [route, body, param] of [["/detokenize", { tokens: [1, 512] }, "tokens[1]"],
      ["/detokenize", { tokens: "1" }, "tokens"], ["/tokenize", {}, "content"], ["/tokenize", { content: [-1] }, "content[0]"],
      ["/tokenize", { content: "x", with_pieces: 1 }, "with_pieces"], ["/tokenize", { content: "x", extra: 1 }, "extra"]]) {
      const e = await post(url, route, body);
      assert.equal(e.status, 400, JSON.stringify(body));
      assert.equal(e.body.error.param, param);
    }
    assert.equal((await post(url, "/tokenize", "{")).status, 400);
  }
});

test("CORS: preflights, and the allow header on answers, errors and streams of the origins named", async () => {
  const pre = (url, origin, route = "/v1/chat/completions") => fetch(url + route, { method: "OPTIONS",
    headers: { origin, "access-control-request-method": "POST", "access-control-request-headers": "authorization, content-type" } });
  let r = await pre(srv.url, "https://app.example");
  assert.equal(r.status, 204);
  assert.equal(r.headers.get("access-control-allow-origin"), "https://app.example");
  assert.match(r.headers.get("access-control-allow-methods"), /POST/);
  assert.match(r.headers.get("access-control-allow-headers"), /authorization/i);
  assert.ok(Number(r.headers.get("access-control-max-age")) > 0);
  r = await pre(srv.url, "https://evil.example");
  assert.equal(r.status, 403);
  assert.equal(r.headers.get("access-control-allow-origin"), null);
  r = await pre(gw.url, "https://anyone.example", "/tokenize");
  assert.equal(r.status, 204);
  assert.equal(r.headers.get("access-control-allow-origin"), "*");

  const origin = { origin: "http://localhost:5173" };
  // an answer, an error of a handler (no key), an error of the layer (unknown path), a stream
  const answers = [
    await post(srv.url, "/tokenize", { content: "x" }, { ...origin, authorization: "Bearer k" }),
    await post(srv.url, "/tokenize", { content: "x" }, origin),
    await post(srv.url, "/nowhere", {}, origin),
  ];
  assert.deepEqual(answers.map((a) => a.status), [200, 401, 404]);
  for (const a of answers) assert.equal(a.headers.get("access-control-allow-origin"), "http://localhost:5173");
  const s = await fetch(srv.url + "/v1/completions", { method: "POST", headers: { ...origin, authorization: "Bearer k" },
    body: JSON.stringify({ prompt: "Once", max_tokens: 2, stream: true }) });
  assert.equal(s.headers.get("access-control-allow-origin"), "http://localhost:5173");
  assert.match(await s.text(), /\[DONE\]/);
  // an origin not named gets no allow header (the browser keeps the answer from the page)
  const o = await post(srv.url, "/tokenize", { content: "x" }, { origin: "https://evil.example", authorization: "Bearer k" });
  assert.equal(o.status, 200);
  assert.equal(o.headers.get("access-control-allow-origin"), null);
});

test("Anthropic prompt caching: cache_control on every block; cache writes and reads in usage", async () => {
  const ant = new Anthropic({ baseURL: srv.url, apiKey: "k", maxRetries: 0 });
  const cc = { type: "ephemeral" };
  const ok = await ant.messages.create({ model: "stories260K", max_tokens: 2,
    system: [{ type: "text", text: "You tell stories.", cache_control: cc }],
    tools: [{ name: "f", input_schema: { type: "object" }, cache_control: cc }],
    messages: [
      { role: "user", content: [{ type: "text", text: "Hi", cache_control: { type: "ephemeral", ttl: "1h" } }] },
      { role: "assistant", content: [{ type: "tool_use", id: "t1", name: "f", input: {}, cache_control: cc }] },
      { role: "user", content: [{ type: "tool_result", tool_use_id: "t1", cache_control: cc,
        content: [{ type: "text", text: "done", cache_control: cc }] }] }] });
  assert.equal(ok.type, "message");
  for (const [bad, where] of [[{ type: "persistent" }, "cache_control.type"], [{ type: "ephemeral", ttl: "2h" }, "cache_control.ttl"]]) {
    await assert.rejects(ant.messages.create({ model: "stories260K", max_tokens: 2,
      messages: [{ role: "user", content: [{ type: "text", text: "Hi", cache_control: bad }] }] }),
    (e) => e.status === 400 && e.message.includes(`messages[0].content[0].${where}`));
  }

  // every full 128-token block of a prompt is kept: the first request writes them, the second reads them
  const text = "Once upon a time there was a little girl who liked to play in the park with her dog. ".repeat(16);
  const body = { model: "stories260K", max_tokens: 2, temperature: 0,
    messages: [{ role: "user", content: [{ type: "text", text, cache_control: cc }] }] };
  const n = (await ant.messages.countTokens({ model: body.model, messages: body.messages })).input_tokens;
  assert.ok(n > 256, `${n} prompt tokens`);
  const full = Math.floor(n / 128) * 128;
  const first = (await ant.messages.create(body)).usage;
  assert.deepEqual([first.cache_read_input_tokens, first.cache_creation_input_tokens, first.input_tokens], [0, full, n - full]);
  const second = (await ant.messages.create(body)).usage;
  assert.ok(second.cache_read_input_tokens >= 128);
  assert.equal(second.cache_creation_input_tokens, Math.max(0, full - second.cache_read_input_tokens));
  assert.equal(second.input_tokens + second.cache_creation_input_tokens + second.cache_read_input_tokens, n);
  let start = null;
  for await (const ev of await ant.messages.create({ ...body, stream: true })) if (ev.type === "message_start") start = ev.message.usage;
  assert.deepEqual(start, { ...second, output_tokens: start.output_tokens });

  // through a gateway and a mixed worker: the same fields, from the worker's cached count
  const cl = await startCluster(stories, ["mixed"]);
  const viaGw = new Anthropic({ baseURL: cl.url, apiKey: "k", maxRetries: 0 });
  const g1 = (await viaGw.messages.create(body)).usage;
  assert.deepEqual([g1.cache_read_input_tokens, g1.cache_creation_input_tokens, g1.input_tokens], [0, full, n - full]);
  const g2 = (await viaGw.messages.create(body)).usage;
  assert.ok(g2.cache_read_input_tokens >= 128, JSON.stringify(g2));
  assert.equal(g2.input_tokens + g2.cache_creation_input_tokens + g2.cache_read_input_tokens, n);
});

test("--ctx defaults to the model's trained context when its KV fits, and says so", async () => {
  const d = fs.mkdtempSync(path.join(os.tmpdir(), "tm-ctx-"));
  try {
    const model = path.join(d, "long.gguf");
    execFileSync(bin, ["mkmodel", "--arch", "qwen3", "--preset", "tiny", "--type", "f16", "--seed", "5", "--ctx", "16384",
      "-o", model], { stdio: "pipe" });
    const s = await startServer(model, ["--cache", "off"], { ready: false });
    assert.match(s.log, /context 16384 tokens: the model's trained context/);
    const m = await (await fetch(s.url + "/v1/models")).json();
    assert.equal(m.data[0].context_length, 16384);
    const small = await startServer(model, ["--cache", "off", "--kv-mib", "1"], { ready: false });
    assert.match(small.log, /context 4096 tokens, not the model's 16384: .* --kv-mib 1/);
  } finally { fs.rmSync(d, { recursive: true, force: true }); }
});
