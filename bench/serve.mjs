#!/usr/bin/env node
// bench/serve: load generator for `tokenmill serve`, side by side with llama.cpp's engine
// (node-llama-cpp 3.21.1, the same model, one context with one sequence per client, which
// node-llama-cpp batches into shared llama_decode calls) at the same concurrency.
//
//   bench/serve [-m MODEL] [--clients 1,4,16,64] [--prompt 128] [--tokens 64] [--threads N]
//               [--temp T] [--no-llama] [--idle 1000] [--json OUT.json]
//
// Each client sends one streaming /v1/completions request (random prompt token ids,
// ignore_eos, greedy) at the same moment. Reported per concurrency: time to first token
// (mean, P99, client side), tokens/s per user ((tokens-1) / (last - first token time)),
// aggregate tokens/s (all tokens / wall time). Then the HTTP layer's own overhead: latency of
// 2,000 sequential keep-alive GET /health (P50, P99), and whether N idle keep-alive
// connections are held while a request still succeeds. The server's /metrics step time and
// CPU gap between steps are printed too. Without -m a small random qwen3 model is generated
// under tests/data/gen/.
//
// Caveat on the llama.cpp column: node-llama-cpp's multi-sequence contexts are far slower per
// step than its single-sequence decode on this harness (bench/engine's "batched" row shows
// the same), so that column measures node-llama-cpp's batching, not llama.cpp's kernels.
import { spawn, execFileSync } from "node:child_process";
import fs from "node:fs";
import http from "node:http";
import net from "node:net";
import os from "node:os";
import path from "node:path";

if (process.env.UV_THREADPOOL_SIZE !== "1") {  // see bench/llama_bench.mjs
  const { spawnSync } = await import("node:child_process");
  const r = spawnSync(process.execPath, [...process.execArgv, ...process.argv.slice(1)], { stdio: "inherit", env: { ...process.env, UV_THREADPOOL_SIZE: "1" } });
  process.exit(r.status ?? 1);
}

const root = path.resolve(import.meta.dirname, "..");
const bin = path.join(root, "build/tokenmill");
const o = { temp: 0, clients: [1, 4, 16, 64], prompt: 128, tokens: 64, threads: os.availableParallelism?.() ?? os.cpus().length, llama: true, idle: 1000 };
const argv = process.argv.slice(2);
for (let i = 0; i < argv.length; i++) {
  const a = argv[i], v = () => argv[++i];
  if (a === "-m") o.model = v();
  else if (a === "--clients") o.clients = v().split(",").map(Number);
  else if (a === "--prompt") o.prompt = Number(v());
  else if (a === "--tokens") o.tokens = Number(v());
  else if (a === "--threads") o.threads = Number(v());
  else if (a === "--temp") o.temp = Number(v());
  else if (a === "--no-llama") o.llama = false;
  else if (a === "--idle") o.idle = Number(v());
  else if (a === "--json") o.json = v();
  else { console.error(`bench/serve: unknown argument ${a}`); process.exit(2); }
}
if (!o.model) {
  o.model = path.join(root, "tests/data/gen/bench-serve-qwen3-small-q8_0.gguf");
  if (!fs.existsSync(o.model)) {
    fs.mkdirSync(path.dirname(o.model), { recursive: true });
    execFileSync(bin, ["mkmodel", "--arch", "qwen3", "--preset", "small", "--type", "q8_0", "--seed", "1", "-o", o.model], { stdio: "inherit" });
  }
}
const maxC = Math.max(...o.clients);
const ctxLen = o.prompt + o.tokens + 8;

const pct = (xs, p) => { const s = [...xs].sort((a, b) => a - b); return s[Math.min(s.length - 1, Math.floor(p * s.length))]; };
const mean = (xs) => xs.reduce((a, b) => a + b, 0) / xs.length;
// prompt ids 10..989: ordinary tokens in any vocabulary we serve (no control tokens)
const promptOf = (i) => Array.from({ length: o.prompt }, (_, k) => 10 + ((i * 7919 + k * 104729) % 980));

function summarize(runs, wall) {
  const ttft = runs.map((r) => r.ttft), per = runs.filter((r) => r.n > 1).map((r) => (r.n - 1) / r.span);
  const total = runs.reduce((a, r) => a + r.n, 0);
  return { ttft_mean_ms: mean(ttft) * 1e3, ttft_p99_ms: pct(ttft, 0.99) * 1e3, tok_s_per_user: per.length ? mean(per) : 0, tok_s_aggregate: total / wall };
}

// ---- tokenmill ----
const srv = spawn(bin, ["serve", "-m", o.model, "--port", "0", "--threads", String(o.threads), "--max-seqs", String(maxC),
  "--ctx", String(Math.max(ctxLen, 256)), "--max-queue", "1024"], { stdio: ["ignore", "ignore", "pipe"] });
let log = "";
const port = await new Promise((res, rej) => {
  srv.stderr.on("data", (d) => { log += d; const m = /listening on http:\/\/[^:]+:(\d+)/.exec(log); if (m) res(Number(m[1])); });
  srv.on("exit", (c) => rej(new Error(`server exited ${c}: ${log}`)));
});
srv.stderr.resume();
const url = `http://127.0.0.1:${port}`;
const agent = new http.Agent({ keepAlive: true, maxSockets: 4096 });
process.on("exit", () => srv.kill("SIGKILL"));

function get(p) {
  return new Promise((res, rej) => {
    http.get(url + p, { agent }, (r) => { let b = ""; r.on("data", (d) => (b += d)); r.on("end", () => res(b)); }).on("error", rej);
  });
}
async function metrics() {
  const m = {};
  for (const line of (await get("/metrics")).split("\n")) if (line && !line.startsWith("#")) { const i = line.lastIndexOf(" "); m[line.slice(0, i)] = Number(line.slice(i + 1)); }
  return m;
}

function streamOne(i) {
  return new Promise((res, rej) => {
    const body = JSON.stringify({ prompt: promptOf(i), max_tokens: o.tokens, temperature: o.temp, seed: i, stream: true, ignore_eos: true,
      stream_options: { include_usage: true } });
    const t0 = performance.now();
    let first = 0, last = 0, n = 0, buf = "";
    const req = http.request(url + "/v1/completions", { method: "POST", agent, headers: { "content-type": "application/json" } }, (r) => {
      r.setEncoding("utf8");
      r.on("data", (d) => {
        buf += d;
        let k;
        while ((k = buf.indexOf("\n\n")) >= 0) {
          const ev = buf.slice(0, k); buf = buf.slice(k + 2);
          if (!ev.startsWith("data: {")) continue;
          const now = performance.now();
          const j = JSON.parse(ev.slice(6));
          if (j.choices?.length) {  // tokens that arrive together share a chunk; the last one carries finish_reason
            if (!first) first = now;
            last = now;
          }
          if (j.usage) n = j.usage.completion_tokens;
        }
      });
      r.on("end", () => res({ ttft: (first - t0) / 1e3, span: (last - first) / 1e3, n }));
    });
    req.on("error", rej);
    req.end(body);
  });
}

const results = { model: o.model, threads: o.threads, prompt: o.prompt, tokens: o.tokens, tokenmill: [], llama: [] };
await Promise.all(Array.from({ length: 2 }, (_, i) => streamOne(1000 + i)));  // warm-up
for (const c of o.clients) {
  const m0 = await metrics();
  const t0 = performance.now();
  const runs = await Promise.all(Array.from({ length: c }, (_, i) => streamOne(i)));
  const wall = (performance.now() - t0) / 1e3;
  const m1 = await metrics();
  const steps = m1.tokenmill_engine_steps_total - m0.tokenmill_engine_steps_total;
  const s = summarize(runs, wall);
  s.clients = c;
  s.step_ms_mean = ((m1.tokenmill_engine_step_seconds_total - m0.tokenmill_engine_step_seconds_total) / steps) * 1e3;
  s.cpu_gap_ms_mean = ((m1.tokenmill_cpu_gap_seconds_total - m0.tokenmill_cpu_gap_seconds_total) / steps) * 1e3;
  results.tokenmill.push(s);
}

// HTTP overhead: sequential keep-alive GET /health
const lat = [];
for (let i = 0; i < 2000; i++) { const t = performance.now(); await get("/health"); lat.push(performance.now() - t); }
results.http = { health_p50_ms: pct(lat, 0.5), health_p99_ms: pct(lat, 0.99) };

// idle keep-alive connections
if (o.idle > 0) {
  const socks = await Promise.all(Array.from({ length: o.idle }, () => new Promise((res) => {
    const s = net.connect(port, "127.0.0.1", () => s.write("GET /health HTTP/1.1\r\nHost: x\r\n\r\n"));
    s.once("data", () => res(s));
    s.on("error", () => res(null));
  })));
  const held = socks.filter(Boolean).length;
  const m = await metrics();
  const r = await streamOne(5000);
  results.http.idle_requested = o.idle;
  results.http.idle_held = held;
  results.http.connections_reported = m.tokenmill_http_connections;
  results.http.request_ok_while_idle = r.n === o.tokens;
  for (const s of socks) s?.destroy();
}
srv.kill("SIGTERM");

// ---- llama.cpp ----
if (o.llama) {
  const { getLlama, LlamaLogLevel } = await import("node-llama-cpp");
  const llama = await getLlama({ gpu: false, build: "never", logLevel: LlamaLogLevel.error, maxThreads: 0, progressLogs: false });
  const model = await llama.loadModel({ modelPath: o.model, gpuLayers: 0 });
  // all clients together, in lockstep as continuous batching would run them: the prompts are
  // submitted at once (node-llama-cpp batches concurrent evaluations into shared decodes,
  // as in bench/engine), then every step decodes one token of every sequence
  const wantToken = { generateNext: { token: true } };
  const runAll = async (ctx, c, base) => {
    const seqs = Array.from({ length: c }, () => ctx.getSequence());
    const t0 = performance.now();
    const first = new Array(c).fill(0);
    let cur = await Promise.all(seqs.map(async (sq, i) => {
      const p = promptOf(base + i);
      const r = await sq.controlledEvaluate(p.map((t, k) => (k === p.length - 1 ? [t, wantToken] : t)));
      first[i] = performance.now();
      return r[r.length - 1]?.next?.token ?? 11;
    }));
    for (let n = 1; n < o.tokens; n++)
      cur = await Promise.all(seqs.map(async (sq, i) => (await sq.controlledEvaluate([[cur[i], wantToken]]))[0]?.next?.token ?? 11));
    const end = performance.now();
    return { runs: first.map((f) => ({ ttft: (f - t0) / 1e3, span: (end - f) / 1e3, n: o.tokens })), wall: (end - t0) / 1e3 };
  };
  for (const c of o.clients) {
    const opts = { sequences: c, contextSize: c * ctxLen, threads: o.threads, batchSize: 512, failedCreationRemedy: false, ignoreMemorySafetyChecks: true };
    const ctx = await model.createContext(opts);
    await runAll(ctx, c, 1000);  // warm-up
    await ctx.dispose();
    const ctx2 = await model.createContext(opts);
    const { runs, wall } = await runAll(ctx2, c, 0);
    const s = summarize(runs, wall);
    s.clients = c;
    results.llama.push(s);
    await ctx2.dispose();
  }
  await model.dispose();
  await llama.dispose();
}

// ---- report ----
const f = (x, d = 1) => (x === undefined || Number.isNaN(x) ? "-" : x.toFixed(d));
console.log(`model ${path.basename(o.model)}, ${o.threads} threads, prompt ${o.prompt} tokens, ${o.tokens} generated per client`);
console.log("clients | TTFT mean ms (tm / llama) | TTFT P99 ms (tm / llama) | tok/s per user (tm / llama) | aggregate tok/s (tm / llama) | tm step ms, CPU gap ms");
for (const t of results.tokenmill) {
  const l = results.llama.find((x) => x.clients === t.clients) ?? {};
  console.log(`${String(t.clients).padStart(7)} | ${f(t.ttft_mean_ms)} / ${f(l.ttft_mean_ms)} | ${f(t.ttft_p99_ms)} / ${f(l.ttft_p99_ms)} | ` +
    `${f(t.tok_s_per_user)} / ${f(l.tok_s_per_user)} | ${f(t.tok_s_aggregate)} / ${f(l.tok_s_aggregate)} | ${f(t.step_ms_mean, 2)}, ${f(t.cpu_gap_ms_mean, 3)}`);
}
console.log(`HTTP: GET /health keep-alive P50 ${f(results.http.health_p50_ms, 3)} ms, P99 ${f(results.http.health_p99_ms, 3)} ms` +
  (results.http.idle_requested ? `; ${results.http.idle_held}/${results.http.idle_requested} idle keep-alive connections held ` +
    `(server reports ${results.http.connections_reported}), a request during them ${results.http.request_ok_while_idle ? "succeeded" : "FAILED"}` : ""));
if (o.json) fs.writeFileSync(o.json, JSON.stringify(results, null, 2));
process.exit(0);
