// tenancy: who may share cached KV blocks, and for how long they are kept, through the real
// `tokenmill serve`. A cache hit is a timing side channel, so requests with different
// `cache_salt` values, or under different API keys, never hit each other's blocks; the traffic
// class (`cache_class` field or `x-cache-class` header, one of the --retention names) sets the
// TTL the request's blocks are stored with (read back with `tokenmill store ls`). The model is
// the generated tiny qwen3 of apis.test.mjs; prompts are long enough (> 300 tokens) for two
// full 128-token blocks.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import OpenAI from "openai";

import { root, bin, startServer as startServerOf, stopServers } from "./server.mjs";
const vocab = path.join(root, "tests/data/llama.cpp/models/ggml-vocab-qwen2.gguf");
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "tm-tenancy-"));
const model = path.join(tmp, "q3.gguf");
const NAME = "tiny-qwen";
const startServer = (args = []) => startServerOf(model, ["--ctx", "512", "--max-seqs", "4", "--model-name", NAME, ...args]);

let S;
before(async () => {
  execFileSync(bin, ["mkmodel", "--arch", "qwen3", "--preset", "tiny", "--vocab", vocab, "--type", "q8_0",
    "--seed", "5", "-o", model], { stdio: "pipe" });
  S = await startServer();
});

after(async () => {
  await stopServers();
  fs.rmSync(tmp, { recursive: true, force: true });
});

const LONG = "The quick brown fox jumps over the lazy dog while the cat watches from the warm windowsill. ".repeat(16);
const user = (content) => [{ role: "user", content }];
const call = (srv, p, body, headers = {}) => fetch(`${srv.url}${p}`, {
  method: "POST", headers: { "content-type": "application/json", ...headers }, body: JSON.stringify(body),
});

// One request per route with the given extra fields; returns [status, json].
const ROUTES = {
  chat: (extra, text = LONG) => ["/v1/chat/completions", { model: NAME, messages: user(text), max_tokens: 2, temperature: 0, ...extra }],
  responses: (extra, text = LONG) => ["/v1/responses", { model: NAME, input: text, max_output_tokens: 2, temperature: 0, store: false, ...extra }],
  messages: (extra, text = LONG) => ["/v1/messages", { model: NAME, messages: user(text), max_tokens: 2, temperature: 0, ...extra }],
  completions: (extra, text = LONG) => ["/v1/completions", { model: NAME, prompt: text, max_tokens: 2, temperature: 0, ...extra }],
};
const cachedOf = (route, j) => route === "responses" ? j.usage.input_tokens_details.cached_tokens
  : route === "messages" ? j.usage.cache_read_input_tokens : j.usage.prompt_tokens_details.cached_tokens;
async function send(srv, route, extra = {}, headers = {}, text = LONG) {
  const [p, body] = ROUTES[route](extra, text);
  const r = await call(srv, p, body, headers);
  return [r.status, await r.json()];
}
async function cached(srv, route, extra = {}, headers = {}, text = LONG) {
  const [st, j] = await send(srv, route, extra, headers, text);
  assert.equal(st, 200, JSON.stringify(j));
  return cachedOf(route, j);
}

test("cache_salt: the same salt hits, another salt (or none) does not, on every route", async () => {
  for (const route of Object.keys(ROUTES)) {
    const salt = `salt-${route}`, text = `${route}: ${LONG}`;   // chat and responses render alike
    assert.equal(await cached(S, route, { cache_salt: salt }, {}, text), 0, route);
    const again = await cached(S, route, { cache_salt: salt }, {}, text);
    assert.ok(again >= 256, `${route}: same salt cached ${again}`);   // blocks, and the rows kept after them
    assert.equal(await cached(S, route, { cache_salt: `${salt}-other` }, {}, text), 0, `${route}: other salt`);
    assert.equal(await cached(S, route, {}, {}, text), 0, `${route}: no salt`);
  }
  // through the vendor SDK, as vLLM clients send it
  const oai = new OpenAI({ baseURL: `${S.url}/v1`, apiKey: "unused", maxRetries: 0 });
  const body = { model: NAME, messages: user("SDK. " + LONG), max_tokens: 2, temperature: 0, cache_salt: "sdk" };
  await oai.chat.completions.create(body);
  assert.ok((await oai.chat.completions.create(body)).usage.prompt_tokens_details.cached_tokens >= 256);
  assert.equal((await oai.chat.completions.create({ ...body, cache_salt: "sdk2" })).usage.prompt_tokens_details.cached_tokens, 0);
});

test("API keys: tenants under different keys never share blocks", async () => {
  const K = await startServer(["--api-key", "key-a", "--api-key", "key-b"]);
  const A = { authorization: "Bearer key-a" }, B = { authorization: "Bearer key-b" };
  const Bx = { "x-api-key": "key-b" };   // the same tenant, Anthropic's header
  for (const route of Object.keys(ROUTES)) {
    const text = `${route}: ${LONG}`;
    assert.equal(await cached(K, route, {}, A, text), 0, route);
    assert.ok(await cached(K, route, {}, A, text) >= 256, `${route}: key A hits its own blocks`);
    assert.equal(await cached(K, route, {}, B, text), 0, `${route}: key B does not hit key A's blocks`);
    assert.ok(await cached(K, route, {}, Bx, text) >= 256, `${route}: key B hits its own (either header)`);
    // the same cache_salt under two keys is still two tenants
    assert.equal(await cached(K, route, { cache_salt: "shared" }, A, text), 0);
    assert.ok(await cached(K, route, { cache_salt: "shared" }, A, text) >= 256);
    assert.equal(await cached(K, route, { cache_salt: "shared" }, B, text), 0, `${route}: salt does not cross keys`);
  }
  const [st] = await send(K, "chat", {}, { authorization: "Bearer nope" });
  assert.equal(st, 401);
});

test("wrong types of cache_salt / cache_class: 400 in each vendor's shape", async () => {
  for (const route of Object.keys(ROUTES)) {
    for (const [field, value] of [["cache_salt", 42], ["cache_salt", { a: 1 }], ["cache_class", 7]]) {
      const [st, j] = await send(S, route, { [field]: value });
      assert.equal(st, 400, `${route} ${field}`);
      if (route === "messages") {
        assert.equal(j.type, "error");
        assert.equal(j.error.type, "invalid_request_error");
        assert.match(j.error.message, new RegExp(field));
      } else {
        assert.equal(j.error.type, "invalid_request_error");
        assert.equal(j.error.param, field);
        assert.ok("code" in j.error);
      }
    }
  }
});

test("cache_class: configured classes accepted (field or header), unknown ones 400", async () => {
  for (const route of Object.keys(ROUTES)) {
    let [st, j] = await send(S, route, { cache_class: "agent" }, {}, "short agent turn");
    assert.equal(st, 200, `${route}: ${JSON.stringify(j)}`);
    [st, j] = await send(S, route, { cache_class: "chat" }, {}, "short chat turn");
    assert.equal(st, 200, route);
    [st, j] = await send(S, route, {}, { "x-cache-class": "agent" }, "short header turn");
    assert.equal(st, 200, route);
    [st, j] = await send(S, route, { cache_class: "batch" }, {}, "short");
    assert.equal(st, 400, route);
    const err = route === "messages" ? (assert.equal(j.type, "error"), j.error) : j.error;
    assert.equal(err.type, "invalid_request_error");
    assert.match(err.message, /batch/);
    assert.match(err.message, /'agent'/, "the message lists the classes");
    if (route !== "messages") assert.equal(err.param, "cache_class");
    [st, j] = await send(S, route, {}, { "x-cache-class": "batch" }, "short");
    assert.equal(st, 400, `${route}: unknown header class`);
    if (route !== "messages") assert.equal(j.error.param, "x-cache-class");
  }
  // a class added with --retention is accepted there
  const R = await startServer(["--retention", "batch=1h"]);
  const [st] = await send(R, "chat", { cache_class: "batch" }, {}, "short");
  assert.equal(st, 200);
});

test("cache_class sets the TTL the request's blocks are stored with (tokenmill store ls)", async () => {
  const dir = fs.mkdtempSync(path.join(tmp, "store-"));
  const R = await startServer(["--cache-dir", dir, "--retention", "agent=1h,chat=7d"]);
  const ls = () => execFileSync(bin, ["store", "ls", `dir:${dir}`], { encoding: "utf8" }).split("\n")
    .filter((l) => /^\d+ [0-9a-f]{64} /.test(l)).map((l) => Number(l.split(" ")[4]));   // expiry in s
  const waitFor = async (n) => {
    for (let i = 0; i < 200; i++) {
      const e = ls();
      if (e.length >= n) return e;
      await new Promise((r) => setTimeout(r, 25));
    }
    return ls();
  };
  assert.equal(await cached(R, "chat", { cache_class: "agent" }, {}, `agent: ${LONG}`), 0);
  let exp = await waitFor(2);
  assert.equal(exp.length, 2, "two full blocks written behind");
  assert.ok(exp.every((e) => e > 3500 && e <= 3600), `agent blocks expire in ~1h: ${exp}`);
  assert.equal(await cached(R, "messages", {}, { "x-cache-class": "chat" }, `chat: ${LONG}`), 0);
  exp = await waitFor(4);
  assert.equal(exp.length, 4);
  assert.equal(exp.filter((e) => e > 7 * 86400 - 100).length, 2, `chat blocks expire in ~7d: ${exp}`);
});
