// shutdown: SIGTERM on a real `tokenmill serve` with 16 streams open across the four
// generating APIs, driven by the vendors' SDKs (openai@6: chat, completions, responses;
// @anthropic-ai/sdk: messages). The model is generated (qwen3 architecture, random weights, the
// Qwen2 vocabulary), greedy, so every run produces the same tokens.
//  - drain: the streams run to their max_tokens, each ends with its terminal event (finish
//    reason / response.incomplete / message_delta + message_stop), the process exits 0, and the
//    blocks of every prompt are in the block store afterwards (`tokenmill store ls`);
//  - drain deadline: streams far longer than --drain-timeout are cut with a proper ending
//    ("length", response.incomplete, Anthropic's overloaded_error event; non-streaming: a
//    truncated answer or a 503), while draining /health answers 503 "draining" and new requests
//    a 503 in the route's shape with Retry-After; exit 0;
//  - a second SIGTERM while draining exits at once with a non-zero status.
// Nothing here measures time: each stream is known to be running when the signal comes (it has
// produced a token and is far from its max_tokens), and waits are bounded by counts.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import OpenAI from "openai";
import Anthropic from "@anthropic-ai/sdk";

import { root, bin, startServer, stopServers } from "./server.mjs";
const vocab = path.join(root, "tests/data/llama.cpp/models/ggml-vocab-qwen2.gguf");
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "tm-shutdown-"));
const model = path.join(tmp, "q3.gguf");
const NAME = "tiny-qwen";
const KINDS = ["chat", "completions", "responses", "messages"];
const BLOCK = 128;   // tokens per KV block

before(() => {
  execFileSync(bin, ["mkmodel", "--arch", "qwen3", "--preset", "tiny", "--vocab", vocab, "--type", "q8_0",
    "--seed", "5", "-o", model], { stdio: "pipe" });
});

after(async () => {
  await stopServers();
  fs.rmSync(tmp, { recursive: true, force: true });
});

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const user = (content) => [{ role: "user", content }];
// A distinct prompt per stream (distinct from its first words on, so no two share a block).
const WORDS = "the quick brown fox jumps over the lazy dog while the cat watches from the warm windowsill";
const text = (i, words) => `Story ${i} of ${i * 7919}: ` + Array.from({ length: words }, (_, k) => WORDS.split(" ")[(k * (i + 3)) % 16]).join(" ");

async function start(args) {
  const S = await startServer(model, ["--model-name", NAME, "--max-seqs", "16", ...args]);
  S.exited = new Promise((resolve) => S.proc.on("exit", (code, signal) => resolve({ code, signal })));
  S.oai = new OpenAI({ baseURL: `${S.url}/v1`, apiKey: "unused", maxRetries: 0 });
  S.ant = new Anthropic({ baseURL: S.url, apiKey: "unused", maxRetries: 0 });
  return S;
}

async function metric(S, name) {
  const body = await (await fetch(`${S.url}/metrics`)).text();
  const m = new RegExp(`^${name} (\\S+)$`, "m").exec(body);
  return m ? Number(m[1]) : NaN;
}

// Opens one stream of the given API and reads it to its end. `started` resolves once it has
// produced generated output (so its prompt is computed); `result` says how it ended.
function openStream(S, kind, i, words, max) {
  let markStarted;
  const started = new Promise((r) => { markStarted = r; });
  const result = (async () => {
    const out = { kind, i, finish: null, reason: null, completion: null, prompt: null, stopped: false, error: null };
    try {
      if (kind === "chat") {
        const s = await S.oai.chat.completions.create({ model: NAME, messages: user(text(i, words)), max_tokens: max,
          temperature: 0, stream: true, stream_options: { include_usage: true } });
        for await (const c of s) {
          const ch = c.choices?.[0];
          if (ch && (ch.delta?.content || ch.delta?.reasoning_content || ch.delta?.tool_calls || ch.finish_reason)) markStarted();
          if (ch?.finish_reason) out.finish = ch.finish_reason;
          if (c.usage) { out.completion = c.usage.completion_tokens; out.prompt = c.usage.prompt_tokens; }
        }
      } else if (kind === "completions") {
        const s = await S.oai.completions.create({ model: NAME, prompt: text(i, words), max_tokens: max, temperature: 0,
          stream: true, stream_options: { include_usage: true } });
        for await (const c of s) {
          const ch = c.choices?.[0];
          if (ch && (ch.text || ch.finish_reason)) markStarted();
          if (ch?.finish_reason) out.finish = ch.finish_reason;
          if (c.usage) { out.completion = c.usage.completion_tokens; out.prompt = c.usage.prompt_tokens; }
        }
      } else if (kind === "responses") {
        const s = await S.oai.responses.create({ model: NAME, input: text(i, words), max_output_tokens: max,
          temperature: 0, stream: true });
        for await (const e of s) {
          if (e.type !== "response.created" && e.type !== "response.in_progress") markStarted();
          if (["response.completed", "response.incomplete", "response.failed"].includes(e.type)) {
            out.finish = e.type;
            out.reason = e.response.incomplete_details?.reason ?? null;
            out.completion = e.response.usage?.output_tokens;
            out.prompt = e.response.usage?.input_tokens;
          }
        }
      } else {
        const s = await S.ant.messages.create({ model: NAME, messages: user(text(i, words)), max_tokens: max,
          temperature: 0, stream: true });
        for await (const e of s) {
          if (e.type === "message_start") {   // input_tokens leaves out cache reads and writes
            out.prompt = e.message.usage.input_tokens + (e.message.usage.cache_read_input_tokens ?? 0) +
              (e.message.usage.cache_creation_input_tokens ?? 0);
            markStarted();
          }
          if (e.type === "message_delta") { out.finish = e.delta.stop_reason; out.completion = e.usage.output_tokens; }
          if (e.type === "message_stop") out.stopped = true;
        }
      }
    } catch (e) {
      out.error = e;
    }
    markStarted();   // a stream that failed early must not hold the test
    return out;
  })();
  return { started, result };
}

// The same over raw HTTP, for the wire's own ending (`data: [DONE]`): `started` once `events`
// SSE events came, `result` the whole body (or the error that cut it).
function rawStream(S, route, body, events) {
  let markStarted;
  const started = new Promise((r) => { markStarted = r; });
  const result = (async () => {
    let text = "";
    try {
      const res = await fetch(`${S.url}${route}`, { method: "POST", headers: { "content-type": "application/json" },
        body: JSON.stringify({ ...body, stream: true }) });
      const dec = new TextDecoder();
      for await (const chunk of res.body) {
        text += dec.decode(chunk, { stream: true });
        if (text.split("\n\n").length > events) markStarted();
      }
    } catch (e) {
      text += `\n[cut: ${e.message}]`;
    }
    markStarted();
    return text;
  })();
  return { started, result };
}

// 16 streams, four of each API; resolves once every one has produced output.
async function open16(S, words, max) {
  const streams = [];
  for (let i = 0; i < 16; i++) streams.push(openStream(S, KINDS[i % 4], i, words, max));
  await Promise.all(streams.map((s) => s.started));
  return streams;
}

const describe = (o) => JSON.stringify({ ...o, error: o.error ? `${o.error.constructor.name}: ${o.error.message}` : null });

test("SIGTERM drains 16 streams: each ends normally, exit 0, the prompts' blocks are in the store", { timeout: 300000 }, async () => {
  const store = path.join(tmp, "store-drain");
  const MAX = 150;
  const S = await start(["--ctx", "1024", "--cache-dir", store, "--drain-timeout", "600"]);
  const streams = await open16(S, 180, MAX);
  // every stream is running (none can be near 150 tokens while the last one just started) and
  // its prompt's blocks went to the write-behind queue; a block the queue had to drop under
  // load is not expected in the store
  const dropped = await metric(S, "tokenmill_store_writes_dropped_total");
  S.proc.kill("SIGTERM");
  const outs = await Promise.all(streams.map((s) => s.result));
  for (const o of outs) {
    assert.equal(o.error, null, describe(o));
    assert.equal(o.completion, MAX, describe(o));
    if (o.kind === "chat" || o.kind === "completions") assert.equal(o.finish, "length", describe(o));
    if (o.kind === "responses") assert.deepEqual([o.finish, o.reason], ["response.incomplete", "max_output_tokens"], describe(o));
    if (o.kind === "messages") assert.ok(o.finish === "max_tokens" && o.stopped, describe(o));
    assert.ok(o.prompt >= BLOCK, describe(o));
  }
  assert.deepEqual(await S.exited, { code: 0, signal: null });
  const ls = execFileSync(bin, ["store", "ls", `dir:${store}`], { encoding: "utf8" }).split("\n").filter(Boolean);
  const promptBlocks = outs.reduce((n, o) => n + Math.floor(o.prompt / BLOCK), 0);
  assert.ok(ls.length >= promptBlocks - dropped, `${ls.length} blocks in the store, ${promptBlocks} prompt blocks, ${dropped} dropped`);
  // and no more than every computed position could fill (prompt + generated - the last token)
  const allBlocks = outs.reduce((n, o) => n + Math.floor((o.prompt + o.completion - 1) / BLOCK), 0);
  assert.ok(ls.length <= allBlocks, `${ls.length} blocks, at most ${allBlocks} computed`);
});

test("drain deadline: streams cut with a terminal event, 503 for new requests, /health draining, exit 0", { timeout: 300000 }, async () => {
  const MAX = 4000;   // far more than the drain deadline leaves time for
  const S = await start(["--ctx", "4096", "--drain-timeout", "3", "--max-seqs", "20"]);   // every request runs at once
  const streams = await open16(S, 40, MAX);
  // two raw streams (their last bytes are checked) and two non-streaming requests, all accepted
  // before the signal (counted by the scheduler)
  const raws = [
    rawStream(S, "/v1/chat/completions", { model: NAME, messages: user(text(102, 40)), max_tokens: MAX, temperature: 0 }, 2),
    rawStream(S, "/v1/completions", { model: NAME, prompt: text(103, 40), max_tokens: MAX, temperature: 0 }, 1),
  ];
  await Promise.all(raws.map((r) => r.started));
  const chatWhole = S.oai.chat.completions.create({ model: NAME, messages: user(text(100, 40)), max_tokens: MAX, temperature: 0 })
    .then((r) => ({ r }), (error) => ({ error }));
  const msgWhole = S.ant.messages.create({ model: NAME, messages: user(text(101, 40)), max_tokens: MAX, temperature: 0 })
    .then((r) => ({ r }), (error) => ({ error }));
  for (let k = 0; k < 3000 && !(await metric(S, "tokenmill_requests_total") >= 20); k++) await sleep(10);
  assert.equal(await metric(S, "tokenmill_requests_total"), 20);
  S.proc.kill("SIGTERM");

  // draining: /health says so (polled until the signal is taken), new requests get a 503
  let health;
  for (let k = 0; k < 3000; k++) {
    health = await fetch(`${S.url}/health`);
    if (health.status !== 200) break;
    await sleep(10);
  }
  assert.equal(health.status, 503);
  assert.equal((await health.json()).status, "draining");
  await assert.rejects(S.oai.chat.completions.create({ model: NAME, messages: user("late"), max_tokens: 4 }), (e) => {
    assert.equal(e.status, 503);
    assert.equal(e.headers.get("retry-after"), "1");
    assert.match(e.error.message, /shutting down/);
    return true;
  });
  await assert.rejects(S.ant.messages.create({ model: NAME, messages: user("late"), max_tokens: 4 }), (e) => {
    assert.equal(e.status, 503);
    assert.equal(e.type, "overloaded_error");
    assert.equal(e.headers.get("retry-after"), "1");
    return true;
  });
  const late = await fetch(`${S.url}/v1/completions`, { method: "POST", headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: NAME, prompt: "late", max_tokens: 4 }) });
  assert.equal(late.status, 503);
  assert.equal(late.headers.get("retry-after"), "1");
  assert.equal((await late.json()).error.type, "server_error");

  // the deadline: every stream still ends with its API's terminal event
  const outs = await Promise.all(streams.map((s) => s.result));
  for (const o of outs) {
    if (o.kind === "messages") {
      assert.ok(o.error instanceof Anthropic.APIError, describe(o));
      assert.equal(o.error.type, "overloaded_error", describe(o));
      continue;
    }
    assert.equal(o.error, null, describe(o));
    assert.ok(o.completion > 0 && o.completion < MAX, describe(o));
    if (o.kind === "responses") assert.equal(o.finish, "response.incomplete", describe(o));
    else assert.equal(o.finish, "length", describe(o));
  }
  for (const r of raws) {
    const body = await r.result;
    assert.ok(body.endsWith('"finish_reason":"length"}]}\n\ndata: [DONE]\n\n'), body.slice(-300));
  }
  const cw = await chatWhole;
  assert.equal(cw.error, undefined, String(cw.error));
  assert.equal(cw.r.choices[0].finish_reason, "length");
  assert.ok(cw.r.usage.completion_tokens < MAX);
  const mw = await msgWhole;
  assert.ok(mw.error instanceof Anthropic.APIError, String(mw.error));
  assert.equal(mw.error.status, 503);
  assert.equal(mw.error.type, "overloaded_error");
  assert.equal(mw.error.headers.get("retry-after"), "1");
  assert.deepEqual(await S.exited, { code: 0, signal: null });
});

test("a second SIGTERM while draining exits at once, non-zero", { timeout: 120000 }, async () => {
  const S = await start(["--ctx", "4096", "--drain-timeout", "86400"]);
  const s = openStream(S, "chat", 0, 40, 4000);
  await s.started;
  S.proc.kill("SIGTERM");
  for (let k = 0; k < 3000 && (await fetch(`${S.url}/health`)).status === 200; k++) await sleep(10);
  S.proc.kill("SIGTERM");
  const { code, signal } = await S.exited;   // a day of drain otherwise: the test's timeout would end it
  assert.equal(signal, null);
  assert.equal(code, 128 + os.constants.signals.SIGTERM);
  await s.result;
});
