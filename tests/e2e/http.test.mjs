// http: the HTTP layer against hostile and broken clients, on a real `tokenmill serve`
// (models/stories260K.gguf), over raw sockets (node:net) where a client library would not
// send such bytes, and with the real `openai` / `@anthropic-ai/sdk` clients elsewhere:
//   - 1,100 connections trickling their headers while /health, /metrics and a completion
//     are answered; a trickled head or body cut at its deadline with a JSON 408;
//   - past --max-connections a JSON 503 with Retry-After (ops routes still answer), past
//     --max-client-connections a 429;
//   - the errors the HTTP library used to answer in HTML (bad or huge Content-Length, broken
//     chunked encoding, headers or URI too large, bad version, no Host, a chunked body past
//     --max-body) as JSON in the path's vendor shape; Anthropic's shape for 404/405 on
//     /v1/messages*;
//   - a half-closed client gets its answer, a closed one still has its request cancelled;
//   - a wrong key is reported as wrong, a missing one as missing; /metrics behind the key
//     unless --metrics-public (serve and gateway).
// Loops are bounded by counts; time limits only bound a hang (the machine is shared).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn, execSync } from "node:child_process";
import net from "node:net";
import path from "node:path";
import OpenAI from "openai";
import Anthropic from "@anthropic-ai/sdk";

import { root, bin, startServer, stopServers, fetchMetrics } from "./server.mjs";
const stories = path.join(root, "models/stories260K.gguf");
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

let S;  // a server with the default limits, except the per-client one (every test client is 127.0.0.1)
before(async () => { S = await startServer(stories, ["--max-client-connections", "5000", "--max-body", "4096"]); });
after(stopServers);

// One raw exchange: writes data (end: then half-closes), reads until the server closes or
// timeoutMs passes. Returns the final response (1xx interim ones skipped) and the raw text.
function raw(port, data, { end = false, timeoutMs = 20000 } = {}) {
  return new Promise((resolve) => {
    const s = net.connect(port, "127.0.0.1");
    const chunks = [];
    let done = false;
    const finish = (why) => {
      if (done) return;
      done = true;
      clearTimeout(t);
      s.destroy();
      resolve({ ...parse(Buffer.concat(chunks).toString("latin1")), why });
    };
    const t = setTimeout(() => finish("timeout"), timeoutMs);
    s.on("connect", () => { s.write(data); if (end) s.end(); });
    s.on("data", (d) => chunks.push(d));
    s.on("end", () => finish("closed"));
    s.on("error", () => finish("error"));
  });
}

function parse(text) {
  let rest = text;
  for (;;) {  // skip interim responses
    const m = /^HTTP\/1\.[01] 1\d\d [^\r\n]*\r\n(?:[^\r\n]+\r\n)*\r\n/.exec(rest);
    if (!m) break;
    rest = rest.slice(m[0].length);
  }
  const i = rest.indexOf("\r\n\r\n");
  if (i < 0) return { status: 0, headers: {}, body: "", text };
  const lines = rest.slice(0, i).split("\r\n");
  const status = Number(lines[0].split(" ")[1]);
  const headers = {};
  for (const l of lines.slice(1)) {
    const k = l.indexOf(":");
    headers[l.slice(0, k).toLowerCase()] = l.slice(k + 1).trim();
  }
  let body = rest.slice(i + 4);
  if (headers["content-length"]) body = body.slice(0, Number(headers["content-length"]));
  return { status, headers, body, text };
}

function assertOpenAIError(r, status, what) {
  assert.equal(r.status, status, `${what}: ${r.text.slice(0, 300)}`);
  assert.match(r.headers["content-type"] || "", /application\/json/, what);
  const j = JSON.parse(r.body);
  assert.equal(typeof j.error.message, "string", what);
  assert.equal(typeof j.error.type, "string", what);
  assert.ok("param" in j.error && "code" in j.error, what);
  return j;
}

function assertAnthropicError(r, status, type, what) {
  assert.equal(r.status, status, `${what}: ${r.text.slice(0, 300)}`);
  assert.match(r.headers["content-type"] || "", /application\/json/, what);
  const j = JSON.parse(r.body);
  assert.equal(j.type, "error", what);
  assert.equal(j.error.type, type, what);
  assert.equal(typeof j.error.message, "string", what);
  return j;
}

// n connections that send the start of a request head and then one more header byte per
// round (rounds of tickMs), until stop() — the classic slow-headers client.
async function trickle(port, n, startText, tickMs = 500) {
  const socks = [];
  let closed = 0;
  for (let i = 0; i < n; i++) {
    const s = net.connect(port, "127.0.0.1");
    s.on("error", () => {});
    s.on("close", () => closed++);
    s.on("data", () => {});
    socks.push(s);
    s.write(startText + "X-Slow: ");
    if (i % 100 === 99) await sleep(10);  // let the accept queue drain
  }
  const timer = setInterval(() => { for (const s of socks) if (!s.destroyed) s.write("a"); }, tickMs);
  return {
    closed: () => closed,
    stop: () => { clearInterval(timer); for (const s of socks) s.destroy(); },
  };
}

// node raises its soft fd limit to the hard one; a machine whose hard limit is low gets fewer
// slow connections (each is an fd here and in the server)
const hardFds = Number(execSync("ulimit -Hn", { shell: "/bin/sh" }).toString().trim()) || 1 << 20;
const nSlow = Math.min(1100, hardFds - 300);

test("1,100 slow-header connections: /health, /metrics and a real completion are answered", { timeout: 60000 }, async () => {
  if (nSlow < 1100) console.log(`# hard fd limit ${hardFds}: ${nSlow} slow connections`);
  const T = await trickle(S.port, nSlow, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n");
  try {
    await sleep(1500);  // every connection is open and trickling
    const h = await fetch(`${S.url}/health`);
    assert.equal(h.status, 200);
    const m = await fetch(`${S.url}/metrics`);
    assert.equal(m.status, 200);
    assert.match(await m.text(), /tokenmill_http_connections \d+/);
    const client = new OpenAI({ baseURL: `${S.url}/v1`, apiKey: "none", maxRetries: 0 });
    const c = await client.completions.create({ model: "stories260K", prompt: "Once upon a time", max_tokens: 4, temperature: 0 });
    assert.equal(c.choices[0].finish_reason, "length");
    assert.ok(T.closed() < 100, `the slow connections were kept, not dropped (${T.closed()} closed)`);
  } finally {
    T.stop();
  }
});

// Sends start, then one byte per 200 ms (150 at most: 30 s, which an idle timeout never
// ends); resolves with how many were sent and what came back when the server closed.
function trickleOne(port, start, byte) {
  return new Promise((resolve) => {
    const s = net.connect(port, "127.0.0.1");
    const chunks = [];
    let sent = 0;
    s.on("error", () => {});
    s.on("data", (d) => chunks.push(d));
    s.on("close", () => { clearInterval(t); resolve({ sent, ...parse(Buffer.concat(chunks).toString("latin1")) }); });
    s.write(start);
    const t = setInterval(() => {
      if (sent++ === 150) { clearInterval(t); s.destroy(); return; }
      s.write(byte);
    }, 200);
  });
}

test("a head trickled past --request-timeout gets a JSON 408 and the connection closes", { timeout: 60000 }, async () => {
  const R = await startServer(stories, ["--request-timeout", "2"]);
  const r = await trickleOne(R.port, "POST /v1/messages HTTP/1.1\r\nHost: x\r\nX-Slow: ", "a");
  assert.ok(r.sent < 150, "the server closed the connection before the client gave up");
  assertAnthropicError(r, 408, "invalid_request_error", "trickled head");
});

test("a body trickled below the minimum rate gets a JSON 408 and the connection closes", { timeout: 60000 }, async () => {
  const R = await startServer(stories, ["--request-timeout", "2"]);
  const r = await trickleOne(R.port, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{", " ");
  assert.ok(r.sent < 150, "the server closed the connection before the client gave up");
  assertOpenAIError(r, 408, "trickled body");
});

test("past --max-connections: a JSON 503 with Retry-After in each vendor's shape; /health still answers", { timeout: 60000 }, async () => {
  const C = await startServer(stories, ["--max-connections", "2"]);
  // two requests whose bodies never come hold the two connections
  const held = [];
  for (let i = 0; i < 2; i++) {
    const s = net.connect(C.port, "127.0.0.1");
    s.on("error", () => {});
    s.write("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{");
    held.push(s);
  }
  try {
    let o;
    for (let i = 0; i < 100; i++) {  // until both are with the HTTP library
      o = await raw(C.port, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}");
      if (o.status === 503) break;
      await sleep(50);
    }
    const j = assertOpenAIError(o, 503, "503 OpenAI");
    assert.match(j.error.message, /connection limit/);
    assert.ok(Number(o.headers["retry-after"]) >= 1, "Retry-After");
    const a = await raw(C.port, "POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}");
    assertAnthropicError(a, 503, "overloaded_error", "503 Anthropic");
    assert.ok(Number(a.headers["retry-after"]) >= 1, "Retry-After");
    const h = await fetch(`${C.url}/health`);
    assert.equal(h.status, 200);
    // the gate for heads (4 x --max-connections) full of slow ones: the longest waiting
    // makes room, and /health still gets in
    const T = await trickle(C.port, 30, "POST /v1/completions HTTP/1.1\r\nHost: x\r\n");
    try {
      // every slow head is in (the gate has let the oldest go), however loaded the machine
      for (let i = 0; i < 200 && T.closed() < 20; i++) await sleep(50);
      await sleep(200);
      assert.equal((await raw(C.port, "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")).status, 200);
      assert.ok(T.closed() >= 20, `the oldest slow heads were let go (${T.closed()})`);
    } finally {
      T.stop();
    }
    const m = await fetch(`${C.url}/metrics`);
    assert.equal(m.status, 200);
    assert.match(await m.text(), /tokenmill_http_refused_total [1-9]/);
  } finally {
    for (const s of held) s.destroy();
  }
});

test("past --max-client-connections: a JSON 429 with Retry-After", { timeout: 60000 }, async () => {
  const P = await startServer(stories, ["--max-client-connections", "3"]);
  const held = [];
  for (let i = 0; i < 3; i++) {
    const s = net.connect(P.port, "127.0.0.1");
    s.on("error", () => {});
    held.push(s);
    await new Promise((r) => s.on("connect", r));
  }
  try {
    const r = await raw(P.port, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}");
    assert.equal(r.status, 429, r.text);
    assert.ok(Number(r.headers["retry-after"]) >= 1, "Retry-After");
    const j = JSON.parse(r.body);
    assert.equal(typeof j.error.message, "string");
  } finally {
    for (const s of held) s.destroy();
  }
  let ok;
  for (let i = 0; i < 100 && ok !== 200; i++) {  // the held connections' slots come back
    ok = (await raw(P.port, "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")).status;
    if (ok !== 200) await sleep(50);
  }
  assert.equal(ok, 200);
});

test("the HTTP library's errors are JSON in the path's vendor shape", { timeout: 60000 }, async () => {
  const cases = [
    ["bad Content-Length", "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 12ab\r\n\r\n", 400],
    ["huge Content-Length", "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999999\r\n\r\n", 413],
    ["Content-Length past --max-body", "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n", 413],
    ["broken chunked encoding", "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n", 400],
    ["no CRLF after a chunk", "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}XX0\r\n\r\n", 400],
    ["chunked body past --max-body", "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" +
      "800\r\n" + "a".repeat(2048) + "\r\n800\r\n" + "a".repeat(2048) + "\r\n800\r\n" + "a".repeat(2048) + "\r\n", 413],
    ["chunk size past --max-body", "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n100000\r\nabc", 413],
    ["headers too large", "GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: " + "a".repeat(20000) + "\r\n\r\n", 431],
    ["URI too long", "GET /v1/models?q=" + "a".repeat(9000) + " HTTP/1.1\r\nHost: x\r\n\r\n", 414],
    ["bad HTTP version", "GET /v1/models HTTP/2.0\r\nHost: x\r\n\r\n", 505],
    ["garbled HTTP version", "GET /v1/models HTTQ/1.1\r\nHost: x\r\n\r\n", 400],
    ["no Host", "GET /v1/models HTTP/1.1\r\n\r\n", 400],
    ["header without a colon", "GET /v1/models HTTP/1.1\r\nHost: x\r\nnocolon\r\n\r\n", 400],
    ["unknown Transfer-Encoding", "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", 501],
  ];
  for (const [what, req, status] of cases) {
    const r = await raw(S.port, req);
    assertOpenAIError(r, status, what);
    // the same on an Anthropic route, in Anthropic's shape
    const ar = await raw(S.port, req.replace(/^(\w+) \/v1\/[a-z/]+/, "$1 /v1/messages"));
    const type = { 400: "invalid_request_error", 413: "request_too_large" }[status] || (status >= 500 ? "api_error" : "invalid_request_error");
    assertAnthropicError(ar, status, type, `${what} (messages)`);
  }
  // a request line that is not one: no path, so a shape both SDKs read
  const g = await raw(S.port, "GARBAGE\0 \r\n\r\n");
  assert.equal(g.status, 400);
  const j = JSON.parse(g.body);
  assert.equal(j.type, "error");
  assert.equal(typeof j.error.message, "string");
  assert.equal(typeof j.error.type, "string");
  assert.equal((await fetch(`${S.url}/health`)).status, 200);
});

test("Anthropic routes answer 405 and 404 in Anthropic's shape", async () => {
  assertAnthropicError(await raw(S.port, "GET /v1/messages HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"), 405,
    "invalid_request_error", "GET /v1/messages");
  assertAnthropicError(await raw(S.port, "DELETE /v1/messages/count_tokens HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"), 405,
    "invalid_request_error", "DELETE count_tokens");
  assertAnthropicError(await raw(S.port, "POST /v1/messages/nope HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"), 404,
    "not_found_error", "unknown messages path");
  assertOpenAIError(await raw(S.port, "GET /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"), 405, "GET chat");
});

const metrics = (url) => fetchMetrics(url);

test("a half-closed client gets its answer, not 499; a closed one is still noticed (its request cancelled)", { timeout: 60000 }, async () => {
  // long enough that the server looks at the socket while it generates
  const body = JSON.stringify({ model: "stories260K", prompt: "Once upon a time", max_tokens: 400, temperature: 0 });
  const r = await raw(S.port, `POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: ${body.length}\r\n\r\n${body}`, { end: true });
  assert.equal(r.status, 200, r.text.slice(0, 300));
  const j = JSON.parse(r.body);
  assert.ok(j.usage.completion_tokens > 100, `${j.usage.completion_tokens} tokens`);
  // streaming too: the stream runs to [DONE]
  const sb = JSON.stringify({ model: "stories260K", prompt: "Once upon a time", max_tokens: 400, temperature: 0, stream: true });
  const s = await raw(S.port, `POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: ${sb.length}\r\n\r\n${sb}`, { end: true });
  assert.equal(s.status, 200);
  assert.match(s.text, /data: \[DONE\]/);
  // a client that closes (not half-closes) during a non-streaming request: the interim probe
  // the half-close got is answered with a reset, so the request is cancelled early
  const CANCELLED = 'tokenmill_requests_finished_total{reason="cancelled"}';
  const before = await metrics(S.url);
  const lb = JSON.stringify({ model: "stories260K", prompt: "Once upon a time", max_tokens: 450, temperature: 0, ignore_eos: true });
  const c = net.connect(S.port, "127.0.0.1");
  c.on("error", () => {});
  c.write(`POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: ${lb.length}\r\n\r\n${lb}`);
  await sleep(30);
  c.destroy();
  let m;
  for (let i = 0; i < 250; i++) {  // up to ~5 s: bounds a hang only
    m = await metrics(S.url);
    if (m[CANCELLED] > before[CANCELLED] && m.tokenmill_running_sequences === 0) break;
    await sleep(20);
  }
  assert.equal(m[CANCELLED], before[CANCELLED] + 1, "the request was cancelled");
  assert.ok(m.tokenmill_generated_tokens_total - before.tokenmill_generated_tokens_total < 440, "generation stopped early");
});

test("API keys: a wrong key is invalid, a missing one missing; /metrics needs the key unless --metrics-public", { timeout: 60000 }, async () => {
  const K = await startServer(stories, ["--api-key", "sekrit"]);
  const oaiWrong = new OpenAI({ baseURL: `${K.url}/v1`, apiKey: "sekrit-but-longer", maxRetries: 0 });
  await assert.rejects(oaiWrong.completions.create({ prompt: "x", max_tokens: 1 }),
    (e) => e.status === 401 && /Incorrect API key/.test(e.error?.message) && e.code === "invalid_api_key");
  const oaiPrefix = new OpenAI({ baseURL: `${K.url}/v1`, apiKey: "sekri", maxRetries: 0 });
  await assert.rejects(oaiPrefix.completions.create({ prompt: "x", max_tokens: 1 }), (e) => e.status === 401);
  const none = await fetch(`${K.url}/v1/completions`, { method: "POST", body: "{}" });
  assert.equal(none.status, 401);
  assert.match((await none.json()).error.message, /didn't provide an API key/);

  const antWrong = new Anthropic({ baseURL: K.url, apiKey: "wrong", maxRetries: 0 });
  await assert.rejects(antWrong.messages.create({ model: "stories260K", max_tokens: 1, messages: [{ role: "user", content: "x" }] }),
    (e) => e.status === 401 && e.error?.error?.type === "authentication_error" && /invalid x-api-key/.test(e.error.error.message));
  const antNone = await fetch(`${K.url}/v1/messages`, { method: "POST", body: "{}" });
  assert.equal(antNone.status, 401);
  const an = await antNone.json();
  assert.equal(an.error.type, "authentication_error");
  assert.match(an.error.message, /x-api-key header is required/);

  const ok = new OpenAI({ baseURL: `${K.url}/v1`, apiKey: "sekrit", maxRetries: 0 });
  assert.equal((await ok.completions.create({ prompt: "Once", max_tokens: 1 })).usage.completion_tokens, 1);

  // /metrics: 401 without the key, 200 with it; --metrics-public opens it; /health is always open
  assert.equal((await fetch(`${K.url}/metrics`)).status, 401);
  assert.equal((await fetch(`${K.url}/metrics`, { headers: { authorization: "Bearer sekrit" } })).status, 200);
  assert.equal((await fetch(`${K.url}/health`)).status, 200);
  const M = await startServer(stories, ["--api-key", "sekrit", "--metrics-public"]);
  const mp = await fetch(`${M.url}/metrics`);
  assert.equal(mp.status, 200);
  assert.match(await mp.text(), /tokenmill_requests_total/);
});

test("gateway: /metrics and /admin/* need the key (/metrics unless --metrics-public); the connection options are accepted", { timeout: 60000 }, async () => {
  const gws = [];
  const start = async (extra) => {
    const p = spawn(bin, ["gateway", "-m", stories, "--listen", "127.0.0.1:0", "--cache", "off", "--api-key", "k",
      "--max-connections", "64", "--max-client-connections", "64", "--request-timeout", "10", ...extra], { stdio: ["ignore", "ignore", "pipe"] });
    gws.push(p);
    let log = "";
    const port = await new Promise((resolve, reject) => {
      p.stderr.on("data", (d) => {
        log += d;
        const m = /listening on http:\/\/[^:]+:(\d+)/.exec(log);
        if (m) resolve(Number(m[1]));
      });
      p.on("exit", (c) => reject(new Error(`gateway exited ${c}: ${log}`)));
    });
    p.removeAllListeners("exit");
    p.stderr.resume();
    return `http://127.0.0.1:${port}`;
  };
  try {
    const g = await start([]);
    assert.equal((await fetch(`${g}/metrics`)).status, 401);
    assert.equal((await fetch(`${g}/metrics`, { headers: { "x-api-key": "k" } })).status, 200);
    assert.equal((await fetch(`${g}/health`)).status, 200);
    for (const [method, path] of [["GET", "/admin/workers"], ["GET", "/admin/capacity"], ["POST", "/admin/drain?worker=x"]]) {
      const no = await fetch(g + path, { method });
      assert.equal(no.status, 401, `${method} ${path} without the key`);
      assert.notEqual((await no.json()).error.code, "invalid_api_key", "a missing key is not reported as a wrong one");
      const bad = await fetch(g + path, { method, headers: { authorization: "Bearer wrong" } });
      assert.equal(bad.status, 401, `${method} ${path} with a wrong key`);
      assert.equal((await bad.json()).error.code, "invalid_api_key");
    }
    assert.equal((await fetch(`${g}/admin/workers`, { headers: { "x-api-key": "k" } })).status, 200);
    assert.equal((await fetch(`${g}/admin/capacity`, { headers: { "x-api-key": "k" } })).status, 200);
    const dl = await fetch(`${g}/admin/drain?worker=x&deadline_ms=soon`, { method: "POST", headers: { "x-api-key": "k" } });
    assert.equal(dl.status, 400);
    assert.equal((await dl.json()).error.param, "deadline_ms");
    const gp = await start(["--metrics-public"]);
    assert.equal((await fetch(`${gp}/metrics`)).status, 200);
  } finally {
    await Promise.all(gws.map((p) => new Promise((r) => {
      if (p.exitCode !== null || p.signalCode !== null) return r();
      p.on("exit", r);
      p.kill("SIGTERM");
    })));
  }
});
