// serve: the real `tokenmill serve` process on models/stories260K.gguf (and a generated qwen3
// model), driven by the real `openai` npm client and by raw HTTP: /v1/completions
// non-streaming and streaming with usage, stop sequences, seeds, greedy text equal to
// llama.cpp's (and `tokenmill run` when available), 32 concurrent streams, disconnects
// releasing KV blocks (checked on /metrics), 1,000 malformed requests that leave the server
// up, 413 for oversize bodies, 401 with API keys. Each server listens on a free port
// (--port 0, read back from its "listening on" line) and is killed at the end.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawnSync, execFileSync } from "node:child_process";
import fs from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import OpenAI from "openai";

import { root, bin, startServer, stopServers, fetchMetrics } from "./server.mjs";
const stories = path.join(root, "models/stories260K.gguf");


const metrics = (url) => fetchMetrics(url);

async function waitFor(fn, ms = 5000) {
  const t0 = Date.now();
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() - t0 > ms) return v;
    await new Promise((r) => setTimeout(r, 20));
  }
}

let S;       // stories260K server
let client;  // openai client on it

before(async () => {
  S = await startServer(stories, ["--max-seqs", "8"]);
  client = new OpenAI({ baseURL: `${S.url}/v1`, apiKey: "unused", maxRetries: 0 });
});

after(stopServers);

test("completions: non-streaming text, usage, finish_reason", async () => {
  const r = await client.completions.create({ model: "stories260K", prompt: "Once upon a time", max_tokens: 20, temperature: 0 });
  assert.equal(r.object, "text_completion");
  assert.equal(r.model, "stories260K");
  assert.equal(r.choices.length, 1);
  assert.ok(r.choices[0].text.startsWith(", there was a little girl"), r.choices[0].text);
  assert.equal(r.choices[0].finish_reason, "length");
  assert.equal(r.usage.completion_tokens, 20);
  assert.ok(r.usage.prompt_tokens >= 4);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + 20);
  assert.equal(typeof r.usage.prompt_tokens_details.cached_tokens, "number");
  const models = await client.models.list();
  assert.deepEqual(models.data.map((m) => m.id), ["stories260K"]);
});

test("completions: streaming equals non-streaming, usage chunk, [DONE]", async () => {
  const body = { model: "stories260K", prompt: "The cat", max_tokens: 40, temperature: 0 };
  const full = await client.completions.create(body);
  const stream = await client.completions.create({ ...body, stream: true, stream_options: { include_usage: true } });
  let text = "", finish = null, usage = null, chunks = 0;
  for await (const c of stream) {
    chunks++;
    if (c.usage) usage = c.usage;
    for (const ch of c.choices) {
      text += ch.text;
      if (ch.finish_reason) finish = ch.finish_reason;
    }
  }
  assert.ok(chunks >= 2);  // tokens that arrive together share a chunk
  assert.equal(text, full.choices[0].text);
  assert.equal(finish, full.choices[0].finish_reason);
  assert.deepEqual(usage, full.usage);
  // raw SSE ends with [DONE]
  const raw = await (await fetch(`${S.url}/v1/completions`, { method: "POST", body: JSON.stringify({ ...body, max_tokens: 3, stream: true }) })).text();
  assert.match(raw, /^data: \{/);
  assert.ok(raw.endsWith("data: [DONE]\n\n"));
});

test("completions: stop sequences end the text before them", async () => {
  const free = await client.completions.create({ prompt: "Once upon a time", max_tokens: 30, temperature: 0 });
  const t = free.choices[0].text;
  const at = t.indexOf("girl");
  assert.ok(at > 0, t);
  for (const stream of [false, true]) {
    const req = { prompt: "Once upon a time", max_tokens: 30, temperature: 0, stop: ["girl", "zzz"], stream };
    let text = "", finish;
    if (stream) {
      for await (const c of await client.completions.create(req)) for (const ch of c.choices) { text += ch.text; finish = ch.finish_reason ?? finish; }
    } else {
      const r = await client.completions.create(req);
      text = r.choices[0].text;
      finish = r.choices[0].finish_reason;
    }
    assert.equal(text, t.slice(0, at), `stream=${stream}`);
    assert.equal(finish, "stop");
  }
});

test("completions: seeds reproduce sampled text; n choices; logprobs", async () => {
  const req = { prompt: "Lily", max_tokens: 30, temperature: 1, top_p: 1, seed: 42 };
  const a = await client.completions.create(req);
  const b = await client.completions.create(req);
  const c = await client.completions.create({ ...req, seed: 43 });
  assert.equal(a.choices[0].text, b.choices[0].text);
  assert.notEqual(a.choices[0].text, c.choices[0].text);
  const n = await client.completions.create({ ...req, n: 3 });
  assert.equal(n.choices.length, 3);
  assert.deepEqual(n.choices.map((x) => x.index), [0, 1, 2]);
  assert.equal(n.choices[0].text, a.choices[0].text);  // choice i uses seed + i
  assert.equal(n.usage.completion_tokens, 90);
  const lp = await client.completions.create({ prompt: "Once", max_tokens: 5, temperature: 0, logprobs: 2 });
  const l = lp.choices[0].logprobs;
  assert.equal(l.tokens.length, 5);
  assert.equal(l.tokens.join(""), lp.choices[0].text);
  for (let i = 0; i < 5; i++) {
    assert.ok(l.token_logprobs[i] <= 0);
    assert.equal(Object.keys(l.top_logprobs[i]).length, 2);
    assert.equal(Math.max(...Object.values(l.top_logprobs[i])), l.token_logprobs[i]);
  }
});

test("greedy through the server equals llama.cpp's text (and tokenmill run)", async () => {
  const want = fs.readFileSync(path.join(root, "tests/data/expected/greedy-200.txt"), "utf8");
  const r = await client.completions.create({ prompt: [1], max_tokens: 200, temperature: 0 });  // BOS only
  assert.equal(r.choices[0].text, want);
  const prompt = "Once upon a time, there was a little girl named Lily.";
  const run = spawnSync(bin, ["run", "-m", stories, "-p", prompt, "-n", "60", "--temp", "0"], { encoding: "utf8" });
  if (run.status !== 0) return;  // `tokenmill run` not in this build yet
  const s = await client.completions.create({ prompt, max_tokens: 60, temperature: 0 });
  assert.equal(s.choices[0].text, run.stdout);
});

test("32 concurrent streaming clients all complete", async () => {
  const one = async (i) => {
    let text = "", finish = null, usage = null;
    const stream = await client.completions.create({ prompt: `Tom and Sue ${i}`, max_tokens: 24, temperature: 0.8, seed: i,
      stream: true, stream_options: { include_usage: true }, ignore_eos: true });
    for await (const c of stream) {
      if (c.usage) usage = c.usage;
      for (const ch of c.choices) { text += ch.text; finish = ch.finish_reason ?? finish; }
    }
    return { text, finish, usage };
  };
  const res = await Promise.all(Array.from({ length: 32 }, (_, i) => one(i)));
  for (const r of res) {
    assert.equal(r.finish, "length");
    assert.equal(r.usage.completion_tokens, 24);
    assert.ok(r.text.length > 0);
  }
  const m = await waitFor(async () => { const m = await metrics(S.url); return m.tokenmill_running_sequences === 0 ? m : null; });
  assert.ok(m, "sequences still running");
  assert.equal(m.tokenmill_kv_blocks_used, 0);
});

test("a client that disconnects mid-stream frees its KV blocks at once", async () => {
  const before = await metrics(S.url);
  const stream = await client.completions.create({ prompt: "Once upon a time", max_tokens: 450, temperature: 0, stream: true, ignore_eos: true });
  let n = 0;
  for await (const c of stream) {
    if (++n === 3) break;  // leaving the loop aborts the HTTP request
  }
  const m = await waitFor(async () => {
    const m = await metrics(S.url);
    return m.tokenmill_kv_blocks_used === 0 && m.tokenmill_running_sequences === 0 ? m : null;
  }, 3000);
  assert.ok(m, "blocks not freed after the disconnect");
  assert.equal(m['tokenmill_requests_finished_total{reason="cancelled"}'], before['tokenmill_requests_finished_total{reason="cancelled"}'] + 1);
  assert.ok(m.tokenmill_generated_tokens_total - before.tokenmill_generated_tokens_total < 400, "generation went on after the disconnect");
  assert.ok(m.tokenmill_http_disconnects_total >= 1);
});

test("/metrics: Prometheus text with counters, gauges and latency histograms", async () => {
  const r = await fetch(`${S.url}/metrics`);
  assert.match(r.headers.get("content-type"), /^text\/plain; version=0\.0\.4/);
  const text = await r.text();
  for (const name of ["tokenmill_time_to_first_token_seconds", "tokenmill_inter_token_latency_seconds", "tokenmill_engine_step_duration_seconds"]) {
    assert.match(text, new RegExp(`# TYPE ${name} histogram`));
    assert.match(text, new RegExp(`${name}_bucket\\{le="\\+Inf"\\} \\d+`));
  }
  const m = await metrics(S.url);
  assert.ok(m.tokenmill_time_to_first_token_seconds_count > 0);
  assert.equal(m['tokenmill_time_to_first_token_seconds_bucket{le="+Inf"}'], m.tokenmill_time_to_first_token_seconds_count);
  assert.ok(m.tokenmill_inter_token_latency_seconds_count > 0);
  assert.ok(m.tokenmill_generated_tokens_total > 0 && m.tokenmill_prompt_tokens_total > 0);
  assert.ok(m.tokenmill_engine_steps_total > 0 && m.tokenmill_cpu_gap_seconds_total > 0 && m.tokenmill_sampling_seconds_total > 0);
  assert.equal(m.tokenmill_kv_blocks_total, m.tokenmill_kv_blocks_used + m.tokenmill_kv_blocks_cached + m.tokenmill_kv_blocks_free);
  assert.equal(m.tokenmill_queue_depth, 0);
  assert.ok(m['tokenmill_http_requests_total{code="2xx"}'] > 0);
});

test("bad requests get OpenAI-shaped errors", async () => {
  const post = async (body, headers = {}) => {
    const r = await fetch(`${S.url}/v1/completions`, { method: "POST", body, headers });
    return { status: r.status, json: await r.json() };
  };
  const cases = [
    ["{bad", 400], ["[]", 400], [JSON.stringify({ prompt: 5 }), 400], [JSON.stringify({ prompt: "x", max_tokens: "a" }), 400],
    [JSON.stringify({ prompt: "x", temperature: 9 }), 400], [JSON.stringify({ prompt: "x", foo: 1 }), 400],
    [JSON.stringify({ prompt: [99999] }), 400], [JSON.stringify({ prompt: "x", model: "gpt-4o" }), 404], [JSON.stringify({}), 400],
  ];
  for (const [body, status] of cases) {
    const r = await post(body);
    assert.equal(r.status, status, body);
    assert.equal(typeof r.json.error.message, "string");
    assert.ok("type" in r.json.error && "param" in r.json.error && "code" in r.json.error);
  }
  const long = await post(JSON.stringify({ prompt: Array(600).fill(5) }));
  assert.equal(long.status, 400);
  assert.match(long.json.error.message, /512/);
  assert.match(long.json.error.message, /600/);
  await assert.rejects(client.completions.create({ model: "nope", prompt: "x" }), (e) => e.status === 404);
  const nf = await fetch(`${S.url}/v1/nothing`);
  assert.equal(nf.status, 404);
  const wrongMethod = await fetch(`${S.url}/v1/completions`);
  assert.equal(wrongMethod.status, 405);
});

function rawHttp(port, data, closeEarly) {
  return new Promise((resolve) => {
    const s = net.connect(port, "127.0.0.1");
    let got = "";
    s.on("data", (d) => { got += d; });
    s.on("error", () => resolve(got));
    s.on("close", () => resolve(got));
    s.setTimeout(2000, () => s.destroy());
    s.write(data, () => { if (closeEarly) s.destroy(); else s.end(); });
  });
}

test("1,000 malformed or truncated requests, then a valid one succeeds", async () => {
  const valid = JSON.stringify({ model: "stories260K", prompt: "Once upon a time", max_tokens: 4, temperature: 0, stop: ["x"], stream: false });
  const bad = [];
  for (let i = 0; i < 1000; i++) {
    const k = i % 10;
    if (k === 0) bad.push({ body: valid.slice(0, i % valid.length) });                                // truncated JSON
    else if (k === 1) bad.push({ body: Buffer.concat([Buffer.from('{"prompt":"'), Buffer.from([0xff, 0xfe, 0xc0 + (i % 32)]), Buffer.from('"}')]) });
    else if (k === 2) bad.push({ body: JSON.stringify({ prompt: i % 2 ? null : { a: 1 }, max_tokens: -i }) });
    else if (k === 3) bad.push({ body: JSON.stringify({ prompt: "x", n: i, stop: i % 3 ? 5 : ["a", "b", "c", "d", "e"] }) });
    else if (k === 4) bad.push({ body: JSON.stringify({ prompt: [-i, 3] }) });
    else if (k === 5) bad.push({ raw: `POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n\r\n${valid.slice(0, i % 60)}`, close: true });
    else if (k === 6) bad.push({ raw: `GARBAGE ${i} \0\r\n\r\n` });
    else if (k === 7) bad.push({ raw: `POST /v1/completions HTTP/1.1\r\nContent-Le`, close: true });
    else if (k === 8) bad.push({ body: JSON.stringify({ prompt: "x", stream: "yes", stream_options: 3, seed: "s", temperature: "hot" }) });
    else bad.push({ body: "\"" + "a".repeat(i) });
  }
  let next = 0;
  const worker = async () => {
    while (next < bad.length) {
      const b = bad[next++];
      if (b.raw !== undefined) {
        await rawHttp(S.port, b.raw, b.close);
      } else {
        const r = await fetch(`${S.url}/v1/completions`, { method: "POST", body: b.body });
        assert.ok(r.status >= 400 && r.status < 500, `status ${r.status} for ${b.body}`);
        const j = await r.json();
        assert.equal(typeof j.error.message, "string");
      }
    }
  };
  await Promise.all(Array.from({ length: 8 }, worker));
  const ok = await fetch(`${S.url}/v1/completions`, { method: "POST", body: valid });
  assert.equal(ok.status, 200);
  assert.equal((await ok.json()).choices[0].finish_reason, "length");
  assert.equal((await fetch(`${S.url}/health`)).status, 200);
});

test("API keys (401 in the OpenAI shape) and the body size limit (413)", async () => {
  const K = await startServer(stories, ["--api-key", "sekrit", "--api-key", "other", "--max-body", "4096"]);
  const noKey = new OpenAI({ baseURL: `${K.url}/v1`, apiKey: "wrong", maxRetries: 0 });
  await assert.rejects(noKey.completions.create({ prompt: "x", max_tokens: 2 }), (e) => e.status === 401 && typeof e.error?.message === "string");
  const r0 = await fetch(`${K.url}/v1/completions`, { method: "POST", body: "{}" });
  assert.equal(r0.status, 401);
  assert.ok((await r0.json()).error.message);
  for (const key of ["sekrit", "other"]) {
    const c = new OpenAI({ baseURL: `${K.url}/v1`, apiKey: key, maxRetries: 0 });
    const r = await c.completions.create({ prompt: "Once", max_tokens: 2, temperature: 0 });
    assert.equal(r.usage.completion_tokens, 2);
  }
  const x = await fetch(`${K.url}/v1/completions`, { method: "POST", body: "x", headers: { "x-api-key": "sekrit" } });
  assert.equal(x.status, 400);  // x-api-key accepted too; then the body is bad
  assert.equal((await fetch(`${K.url}/health`)).status, 200);
  const big = await fetch(`${K.url}/v1/completions`, { method: "POST", body: JSON.stringify({ prompt: "a".repeat(10000) }), headers: { authorization: "Bearer sekrit" } });
  assert.equal(big.status, 413);
  const after413 = await fetch(`${K.url}/health`);
  assert.equal(after413.status, 200);
  K.proc.kill("SIGTERM");
  const code = await new Promise((r) => K.proc.on("exit", (c) => r(c)));
  assert.equal(code, 0);
});

test("a generated qwen3 model serves completions; cached prompt tokens are reported", async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "tm-serve-"));
  const model = path.join(dir, "q3.gguf");
  execFileSync(bin, ["mkmodel", "--arch", "qwen3", "--preset", "tiny", "--type", "f16", "--seed", "5", "-o", model], { stdio: "pipe" });
  const Q = await startServer(model, ["--model-name", "q3", "--ctx", "2048"]);
  const c = new OpenAI({ baseURL: `${Q.url}/v1`, apiKey: "x", maxRetries: 0 });
  const prompt = Array.from({ length: 300 }, (_, i) => (i * 7 + 3) % 1000);
  const a = await c.completions.create({ model: "q3", prompt, max_tokens: 8, temperature: 0, ignore_eos: true });
  assert.equal(a.usage.prompt_tokens, 300);
  assert.equal(a.usage.prompt_tokens_details.cached_tokens, 0);
  const b = await c.completions.create({ model: "q3", prompt, max_tokens: 8, temperature: 0, ignore_eos: true });
  // 2 full blocks, and the 43 rows after them that the first request kept
  assert.equal(b.usage.prompt_tokens_details.cached_tokens, 299);
  assert.equal(b.choices[0].text, a.choices[0].text);
  const m = await metrics(Q.url);
  assert.equal(m.tokenmill_cached_prompt_tokens_total, 299);
  assert.equal(m.tokenmill_tail_prompt_tokens_total, 43);
  // a non-streaming request whose client goes away is cancelled too
  const ac = new AbortController();
  const pending = fetch(`${Q.url}/v1/completions`, { method: "POST", signal: ac.signal,
    body: JSON.stringify({ prompt: [5, 6, 7], max_tokens: 2000, temperature: 0, ignore_eos: true }) }).catch(() => null);
  await waitFor(async () => (await metrics(Q.url)).tokenmill_running_sequences === 1, 3000);
  ac.abort();
  await pending;
  const m2 = await waitFor(async () => {
    const x = await metrics(Q.url);
    return x['tokenmill_requests_finished_total{reason="cancelled"}'] === 1 && x.tokenmill_kv_blocks_used === 0 ? x : null;
  }, 3000);
  assert.ok(m2, "the abandoned non-streaming request was not cancelled");
  assert.ok(m2.tokenmill_generated_tokens_total - m.tokenmill_generated_tokens_total < 1900);
  Q.proc.kill("SIGTERM");
  fs.rmSync(dir, { recursive: true });
});
