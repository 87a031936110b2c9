// multimodel: one `tokenmill serve` of two generated models (-m a=A.gguf -m b=B.gguf: a qwen3
// with the Qwen2 vocabulary, a llama of another width with the Llama 3 vocabulary), driven by
// the openai and anthropic SDKs. Each API routes by "model": the answer of a model served
// beside another equals its answer when served alone (greedy, the same seed), an unknown
// model is a 404 in each API's own shape, /v1/models lists both and GET /v1/models/{id}
// answers one; tokenize and embeddings route too; /metrics labels each model's figures and
// the status page is per model; the start-up line says how the KV cap is split; bad -m
// combinations are refused.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import OpenAI from "openai";
import Anthropic from "@anthropic-ai/sdk";
import { bin, startServer, stopServers, twoTinyModels } from "./server.mjs";

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "tm-multi-"));
const common = ["--ctx", "512", "--max-seqs", "2", "--kv-mib", "64"];
let A, B, S, solo, oai, ant;

before(async () => {
  [A, B] = twoTinyModels(tmp);
  S = await startServer(`a=${A}`, ["-m", `b=${B}`, ...common]);
  solo = await startServer(B, [...common, "--kv-mib", "32", "--model-name", "b"]);
  oai = new OpenAI({ baseURL: `${S.url}/v1`, apiKey: "x", maxRetries: 0 });
  ant = new Anthropic({ baseURL: S.url, apiKey: "x", maxRetries: 0 });
});
after(async () => {
  await stopServers();
  fs.rmSync(tmp, { recursive: true, force: true });
});

const user = (content) => [{ role: "user", content }];
const post = async (url, route, body) => {
  const res = await fetch(url + route, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
  return { status: res.status, body: await res.json() };
};

test("the start-up lines name both models and how the KV cap is split", () => {
  assert.match(S.log, /2 models: the KV cap of 64 MiB split evenly, 32 MiB each/);
  assert.match(S.log, /model a \(qwen3, /);
  assert.match(S.log, /model b \(llama, /);
});

test("/v1/models lists both; GET /v1/models/{id} answers one, an unknown id OpenAI's 404", async () => {
  const list = [];
  for await (const m of oai.models.list()) list.push(m.id);
  assert.deepEqual(list, ["a", "b"]);
  const b = await oai.models.retrieve("b");
  assert.equal(b.id, "b");
  assert.equal(b.template, "llama3");
  await assert.rejects(oai.models.retrieve("nope"), (e) => e.status === 404 && e.code === "model_not_found");
});

test("each API routes by model: b served beside a answers as b served alone", async () => {
  const solos = new OpenAI({ baseURL: `${solo.url}/v1`, apiKey: "x", maxRetries: 0 });
  const soloAnt = new Anthropic({ baseURL: solo.url, apiKey: "x", maxRetries: 0 });
  const chat = { model: "b", messages: user("Tell me a story"), max_tokens: 12, temperature: 0, seed: 3 };
  const [x, y] = [await oai.chat.completions.create(chat), await solos.chat.completions.create(chat)];
  assert.equal(x.model, "b");
  assert.equal(x.choices[0].message.content, y.choices[0].message.content);
  assert.equal(x.usage.prompt_tokens, y.usage.prompt_tokens);
  // a, the default (no model named), is another model: another prompt length (its vocabulary and template)
  const xa = await oai.chat.completions.create({ ...chat, model: "a" });
  assert.equal(xa.model, "a");
  assert.notEqual(xa.usage.prompt_tokens, x.usage.prompt_tokens);
  // streamed
  let streamed = "";
  for await (const ch of await oai.chat.completions.create({ ...chat, stream: true })) streamed += ch.choices[0]?.delta?.content ?? "";
  assert.equal(streamed, y.choices[0].message.content);
  // Completions and Responses
  const cp = { model: "b", prompt: "Once upon a time", max_tokens: 8, temperature: 0 };
  assert.equal((await oai.completions.create(cp)).choices[0].text, (await solos.completions.create(cp)).choices[0].text);
  const rp = { model: "b", input: "hello there", max_output_tokens: 8, temperature: 0 };
  const [rx, ry] = [await oai.responses.create(rp), await solos.responses.create(rp)];
  assert.equal(rx.model, "b");
  assert.equal(rx.output_text, ry.output_text);
  // Anthropic Messages
  const mp = { model: "b", max_tokens: 10, temperature: 0, messages: user("hi there") };
  const [mx, my] = [await ant.messages.create(mp), await soloAnt.messages.create(mp)];
  assert.equal(mx.model, "b");
  assert.deepEqual(mx.content, my.content);
  const all = (u) => u.input_tokens + u.cache_read_input_tokens;   // (a cached prefix is not input_tokens)
  assert.equal(all(mx.usage), all(my.usage));
  const ct = await ant.messages.countTokens({ model: "b", messages: user("hi there") });
  assert.equal(ct.input_tokens, all(mx.usage));
});

test("an unknown model is a 404 in each API's own shape", async () => {
  for (const call of [
    () => oai.chat.completions.create({ model: "c", messages: user("hi"), max_tokens: 2 }),
    () => oai.completions.create({ model: "c", prompt: "hi", max_tokens: 2 }),
    () => oai.responses.create({ model: "c", input: "hi", max_output_tokens: 2 }),
    () => oai.embeddings.create({ model: "c", input: "hi" }),
  ])
    await assert.rejects(call(), (e) => e.status === 404 && e.code === "model_not_found" && e.error.param === "model");
  await assert.rejects(ant.messages.create({ model: "c", max_tokens: 2, messages: user("hi") }),
    (e) => e.status === 404 && e.error.type === "error" && e.error.error.type === "not_found_error");
  const t = await post(S.url, "/tokenize", { model: "c", content: "hi" });
  assert.equal(t.status, 404);
  assert.equal(t.body.error.code, "model_not_found");
});

test("tokenize and embeddings route by model", async () => {
  const text = "Hello world, multi-model";
  const ta = await post(S.url, "/tokenize", { model: "a", content: text });
  const tb = await post(S.url, "/tokenize", { model: "b", content: text });
  const ts = await post(solo.url, "/tokenize", { content: text });
  assert.deepEqual(tb.body.tokens, ts.body.tokens);
  assert.notDeepEqual(ta.body.tokens, tb.body.tokens);
  const d = await post(S.url, "/detokenize", { model: "b", tokens: tb.body.tokens });
  assert.equal(d.body.content, text);
  const eb = await oai.embeddings.create({ model: "b", input: "hello" });
  assert.equal(eb.model, "b");
  assert.equal(eb.data[0].embedding.length, 96);
  const ea = await oai.embeddings.create({ model: "a", input: "hello" });
  assert.equal(ea.model, "a");
  assert.notEqual(ea.data[0].embedding.length, 96);
});

test("/metrics labels each model's figures (one HELP per family), the status page is per model", async () => {
  await oai.chat.completions.create({ model: "b", messages: user("count me"), max_tokens: 2 });
  const text = await (await fetch(`${S.url}/metrics`)).text();
  const reqs = (m) => Number(new RegExp(`^tokenmill_requests_total\\{model="${m}"\\} (\\d+)$`, "m").exec(text)[1]);
  assert.ok(reqs("b") > reqs("a") && reqs("a") >= 1, text.slice(0, 400));
  assert.equal(text.match(/^# HELP tokenmill_requests_total /gm).length, 1);
  assert.match(text, /^tokenmill_requests_finished_total\{model="b",reason="stop"\} \d+$/m);
  assert.match(text, /^tokenmill_time_to_first_token_seconds_bucket\{model="a",le="\+Inf"\} \d+$/m);
  assert.match(text, /^tokenmill_http_connections \d+/m);   // the server's own figures stay unlabelled
  for (const line of text.split("\n").filter((l) => l && !l.startsWith("#")))
    assert.match(line, /^[a-z_:]+(\{[^}]*\})? \S+$/, line);
  const page = await (await fetch(`${S.url}/status?model=b`)).text();
  assert.match(page, /<h1>tokenmill: b<\/h1>/);
  assert.match(page, /href="\/status\?model=a">a<\/a>/);
  assert.equal((await fetch(`${S.url}/status?model=zz`)).status, 404);
});

test("bad -m combinations are refused with a message", () => {
  const cases = [
    [["-m", A, "-m", A], /two models are named 'a': name them apart with -m NAME=FILE/],
    [["-m", `x=${A}`, "-m", `x=${B}`], /two models are named 'x'/],
    [["-m", `x=${A}`, "-m", `y=${B}`, "--model-name", "z"], /--model-name names the one model/],
    [["-m", "x="], /-m x=: no file after the name/],
  ];
  for (const [args, re] of cases) {
    const r = spawnSync(bin, ["serve", ...args, "--port", "0", "--cache", "off"], { encoding: "utf8", timeout: 30000 });
    assert.equal(r.status, 2, r.stderr);
    assert.match(r.stderr, re);
  }
});
