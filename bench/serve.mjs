#!/usr/bin/env node
// bench/serve: load generator for `tokenmill serve`, side by side with llama.cpp served the way
// its own server serves concurrent users, in the same run, alternating, with ratios.
//
//   bench/serve [-m MODEL] [--clients 1,4,16 | --full] [--prompt 128] [--tokens 32] [--threads N]
//               [--step-tokens 512] [--reps 3] [--budget 270] [--flash-attn on|off] [--no-llama]
//               [--idle 1000] [--json OUT.json] [--markdown]
//
// One "run" is one concurrency level c: c clients arrive at once, each with its own prompt of
// --prompt random ordinary token ids (10..989; unique per run, so no prefix-cache hits), each
// generating exactly --tokens tokens (greedy, EOS ignored). Per run: time to first token
// (mean, P99), tokens/s per user (all clients' tokens-1 over all their first-to-last-token
// spans, i.e. 1 / mean inter-token time; tokenmill's from the server's inter-token latencies),
// aggregate tokens/s (all tokens / wall time of the run). Each rep runs every level on both engines, one engine
// then the other (the order flips every rep); the table shows medians over the reps [ranges]
// and the median of the reps' ratios tokenmill / llama.cpp (> 1: tokenmill faster).
//
// tokenmill: `tokenmill serve` (--cache off, --step-tokens S, --max-seqs = most clients),
// streaming POST /v1/completions over keep-alive HTTP from this process; the server's /metrics
// also give its own TTFT and inter-token latency (no HTTP, no client), engine step time, and
// the CPU gap between steps.
//
// llama.cpp (node-llama-cpp 3.21.1's prebuilt CPU library, in this process, no HTTP): driven
// as llama.cpp's server (tools/server, update_slots) drives its slots: one context with c
// sequences (slots; contextSize per sequence = prompt + tokens + 8, KV F16, flash attention
// on like the server's "auto" on CPU), and each step puts one token of every generating
// sequence into the batch first, then prompt tokens of the waiting sequences (FIFO) up to the
// step budget S -- the same policy and budget as tokenmill's scheduler. node-llama-cpp turns
// the evaluations issued together into one llama_decode (the run checks: decode calls =
// steps). Greedy sampling per sequence in the addon, as the server samples per slot.
// Same model file, thread count (--threads, default all cores), prompt tokens, generated
// tokens and step budget on both. Differences that remain: no HTTP/JSON/SSE in the llama.cpp
// column (tokenmill's TTFT and aggregate are timed by its HTTP client, conservative for it;
// its TTFT on the server, and what HTTP and the client add, are printed beside them); node-llama-cpp attaches no thread pool, so ggml starts
// its worker threads per llama_decode (llama-server keeps a polling pool), and ggml's barriers
// spin -- on cores busy with other processes llama.cpp's multi-thread steps slow down many
// times more than tokenmill's (whose threads spin, then sleep). Before every run pair the
// bench measures how busy other processes keep the CPUs (0.5 s, /proc/stat) and prints it;
// on a shared machine, --threads 1 compares the engines without barriers.
//
// Then the HTTP layer's own overhead: 2,000 sequential keep-alive GET /health (P50, P99), and
// whether --idle idle keep-alive connections are held while a request still succeeds.
// --budget S: after a rep, no further rep is started when it would end after S seconds (the
// first rep always runs); --full is --clients 1,4,16,64. Without -m a small random qwen3
// model is generated under tests/data/gen/.
import { spawn, execFileSync } from "node:child_process";
import fs from "node:fs";
import http from "node:http";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { parseArgs } from "./args.mjs";
import { onSseJson } from "./sse.mjs";

if (process.env.UV_THREADPOOL_SIZE !== "1") {  // llama.cpp's best speed on 2 cores: see bench/llama_bench.mjs
  const { spawnSync } = await import("node:child_process");
  const r = spawnSync(process.execPath, [...process.execArgv, ...process.argv.slice(1)], { stdio: "inherit", env: { ...process.env, UV_THREADPOOL_SIZE: "1" } });
  process.exit(r.status ?? 1);
}

const root = path.resolve(import.meta.dirname, "..");
const bin = path.join(root, "build/tokenmill");
const ncpu = os.availableParallelism?.() ?? os.cpus().length;
const o = parseArgs("bench/serve", [
  { name: "-m", key: "model", arg: "MODEL", help: "the GGUF file (default: a small random qwen3 under tests/data/gen/)" },
  { name: "--clients", kind: "list", of: "number", default: [1, 4, 16], help: "concurrency levels" },
  { name: "--full", kind: "flag", sets: { clients: [1, 4, 16, 64] }, help: "= --clients 1,4,16,64" },
  { name: "--prompt", kind: "number", default: 128, help: "prompt tokens of each client" },
  { name: "--tokens", kind: "number", default: 32, help: "tokens each client generates" },
  { name: "--threads", kind: "number", default: ncpu, help: "threads of both engines" },
  { name: "--step-tokens", kind: "number", default: 512, help: "the step budget of both engines" },
  { name: "--reps", kind: "number", default: 3, help: "reps (medians shown)" },
  { name: "--budget", arg: "S", kind: "number", default: 270, help: "no rep is started that would end after S seconds" },
  { name: "--flash-attn", default: "on", choices: ["on", "off"], help: "llama.cpp's flash attention" },
  { name: "--no-llama", key: "llama", kind: "flag", value: false, default: true, help: "tokenmill only" },
  { name: "--idle", kind: "number", default: 1000, help: "idle keep-alive connections held in the HTTP check" },
  { name: "--json", arg: "OUT.json", help: "write the figures there too" },
  { name: "--markdown", kind: "flag", help: "print the table as Markdown" },
]);
o.flashAttn = o.flashAttn === "on";
const usage = (msg) => { console.error(`bench/serve: ${msg} (--help lists the options)`); process.exit(2); };
if (o.clients.some((c) => !(c >= 1)) || !(o.prompt >= 1) || !(o.tokens >= 2) || !(o.reps >= 1)) usage("bad numbers");
if (!o.model) {
  o.model = path.join(root, "tests/data/gen/bench-serve-qwen3-small-q8_0.gguf");
  if (!fs.existsSync(o.model)) {
    fs.mkdirSync(path.dirname(o.model), { recursive: true });
    execFileSync(bin, ["mkmodel", "--arch", "qwen3", "--preset", "small", "--type", "q8_0", "--seed", "1", "-o", o.model], { stdio: "inherit" });
  }
}
const maxC = Math.max(...o.clients);
const ctxLen = o.prompt + o.tokens + 8;
const tStart = performance.now();
const log = (s) => process.stderr.write(`bench/serve: ${s}\n`);

const pct = (xs, p) => { const s = [...xs].sort((a, b) => a - b); return s[Math.min(s.length - 1, Math.floor(p * s.length))]; };
const mean = (xs) => xs.reduce((a, b) => a + b, 0) / xs.length;
const median = (xs) => { const s = xs.filter((x) => Number.isFinite(x)).sort((a, b) => a - b); const n = s.length; return n ? (n % 2 ? s[n >> 1] : (s[n / 2 - 1] + s[n / 2]) / 2) : NaN; };
// prompt ids 10..989: ordinary tokens in any vocabulary we serve (no control tokens); run and
// client pick the stream, so no two prompts of the bench share a prefix block
function promptOf(run, client) {
  let x = (run * 1000003 + client * 7919 + 12345) >>> 0;
  return Array.from({ length: o.prompt }, () => {  // mulberry32
    x = (x + 0x6d2b79f5) >>> 0;
    let t = Math.imul(x ^ (x >>> 15), x | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return 10 + (((t ^ (t >>> 14)) >>> 0) % 980);
  });
}

// How busy the machine is with other work: CPU time of all processes but this one and the
// server (/proc/stat minus their own), in cores, over 0.5 s while the bench itself is idle,
// sampled before every run pair
const HZ = 100;  // USER_HZ: the /proc clock tick on Linux
function statBusy() {
  const v = fs.readFileSync("/proc/stat", "utf8").split("\n")[0].trim().split(/\s+/).slice(1).map(Number);
  const total = v.reduce((a, b) => a + b, 0);
  return { busy: total - v[3] - (v[4] ?? 0), total };
}
function pidJiffies(pid) {
  try { const f = fs.readFileSync(`/proc/${pid}/stat`, "utf8"); const r = f.slice(f.lastIndexOf(")") + 2).split(" "); return Number(r[11]) + Number(r[12]); } catch { return 0; }
}
function cpuMark(pids) {
  const u = process.cpuUsage();
  return { ...statBusy(), own: (u.user + u.system) / 1e6 * HZ + pids.reduce((a, p) => a + pidJiffies(p), 0) };
}
async function otherLoad(pids) {
  const m0 = cpuMark(pids);
  await new Promise((r) => setTimeout(r, 500));
  const m1 = cpuMark(pids), dt = m1.total - m0.total;
  return dt > 0 ? Math.max(0, (m1.busy - m0.busy - (m1.own - m0.own)) / dt) * ncpu : NaN;
}

function summarize(runs, wall) {
  // per user: all clients' (tokens - 1) over all their first-to-last spans, i.e. 1 / the mean
  // inter-token time (a per-client mean would blow up when a client reads a burst of tokens at once)
  const ttft = runs.map((r) => r.ttft), gaps = runs.reduce((a, r) => a + Math.max(0, r.n - 1), 0), span = runs.reduce((a, r) => a + r.span, 0);
  const total = runs.reduce((a, r) => a + r.n, 0);
  return { ttft_mean_ms: mean(ttft) * 1e3, ttft_p99_ms: pct(ttft, 0.99) * 1e3, tok_s_per_user: span > 0 ? gaps / span : NaN,
    tok_s_aggregate: total / wall, wall_s: wall, tokens: total };
}

// ---- tokenmill ----
const srv = spawn(bin, ["serve", "-m", o.model, "--port", "0", "--threads", String(o.threads), "--max-seqs", String(maxC),
  "--ctx", String(Math.max(ctxLen, 256)), "--max-queue", "1024", "--step-tokens", String(o.stepTokens), "--cache", "off"],
  { stdio: ["ignore", "ignore", "pipe"] });
let srvLog = "";
const port = await new Promise((res, rej) => {
  srv.stderr.on("data", (d) => { srvLog += d; const m = /listening on http:\/\/[^:]+:(\d+)/.exec(srvLog); if (m) res(Number(m[1])); });
  srv.on("exit", (c) => rej(new Error(`server exited ${c}: ${srvLog}`)));
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

function streamOne(prompt, seed) {
  return new Promise((res, rej) => {
    const body = JSON.stringify({ prompt, max_tokens: o.tokens, temperature: 0, seed, stream: true, ignore_eos: true,
      stream_options: { include_usage: true } });
    const t0 = performance.now();
    let first = 0, last = 0, n = 0, np = 0;
    const req = http.request(url + "/v1/completions", { method: "POST", agent, headers: { "content-type": "application/json" } }, (r) => {
      onSseJson(r, (j, now) => {
        if (j.choices?.length) {  // tokens that arrive together share a chunk; the last one carries finish_reason
          if (!first) first = now;
          last = now;
        }
        if (j.usage) { n = j.usage.completion_tokens; np = j.usage.prompt_tokens; }
      });
      r.on("end", () => res({ ttft: (first - t0) / 1e3, span: (last - first) / 1e3, n, np }));
    });
    req.on("error", rej);
    req.end(body);
  });
}

const hmean = (m0, m1, name) => (m1[`${name}_sum`] - m0[`${name}_sum`]) / (m1[`${name}_count`] - m0[`${name}_count`]);
async function tokenmillRun(c, run) {
  const prompts = Array.from({ length: c }, (_, i) => promptOf(run, i));
  const m0 = await metrics();
  const t0 = performance.now();
  const runs = await Promise.all(prompts.map((p, i) => streamOne(p, i)));
  const wall = (performance.now() - t0) / 1e3;
  const m1 = await metrics();
  const d = (name) => m1[name] - m0[name];
  const steps = d("tokenmill_engine_steps_total");
  const s = summarize(runs, wall);
  if (runs.some((r) => r.n !== o.tokens || r.np !== o.prompt)) log(`tokenmill run ${run}: a request got ${runs.map((r) => `${r.np}+${r.n}`).join(",")} tokens`);
  return { ...s, steps, step_ms: (d("tokenmill_engine_step_seconds_total") / steps) * 1e3,
    cpu_gap_ms: (d("tokenmill_cpu_gap_seconds_total") / steps) * 1e3,
    server_ttft_ms: hmean(m0, m1, "tokenmill_time_to_first_token_seconds") * 1e3,
    http_ttft_ms: s.ttft_mean_ms - hmean(m0, m1, "tokenmill_time_to_first_token_seconds") * 1e3,
    // per user from the server's inter-token latencies (like llama.cpp's in-process timing): the
    // client's own figure, printed too, swings when a starved client reads a burst of tokens at once
    tok_s_per_user: 1 / hmean(m0, m1, "tokenmill_inter_token_latency_seconds"), client_tok_s_per_user: s.tok_s_per_user,
    cached_tokens: d("tokenmill_cached_prompt_tokens_total") };
}

// ---- llama.cpp ----
let llama, lmodel;
const lctx = new Map();  // clients -> { ctx, seqs, calls, tokens, decode_ms }
const wantToken = { generateNext: { token: true } };
async function llamaLevel(c) {
  if (lctx.has(c)) return lctx.get(c);
  const ctx = await lmodel.createContext({ sequences: c, contextSize: ctxLen, threads: o.threads, batchSize: Math.max(o.stepTokens, c),
    flashAttention: o.flashAttn, failedCreationRemedy: false, ignoreMemorySafetyChecks: true });
  const L = { ctx, seqs: Array.from({ length: c }, () => ctx.getSequence()), calls: 0, tokens: 0, decode_ms: 0, counted: false };
  // count llama_decode calls and their time: node-llama-cpp's native context (internal field)
  const nat = ctx._ctx;
  if (nat && typeof nat.initBatch === "function" && typeof nat.decodeBatch === "function") {
    const ib = nat.initBatch.bind(nat), db = nat.decodeBatch.bind(nat);
    Object.defineProperty(nat, "initBatch", { value: (n) => { L.calls++; L.tokens += n; return ib(n); } });
    Object.defineProperty(nat, "decodeBatch", { value: async () => { const t = performance.now(); try { return await db(); } finally { L.decode_ms += performance.now() - t; } } });
    L.counted = true;
  }
  // untimed warm-up: 16 prompt tokens and 2 steps on every sequence
  const warm = L.seqs.map((_, i) => promptOf(999999, i).slice(0, 16));
  let cur = await Promise.all(L.seqs.map(async (sq, i) => (await sq.controlledEvaluate([...warm[i].slice(0, 15), [warm[i][15], wantToken]]))[15]?.next?.token ?? 11));
  cur = await Promise.all(L.seqs.map(async (sq, i) => (await sq.controlledEvaluate([[cur[i], wantToken]]))[0]?.next?.token ?? 11));
  await Promise.all(L.seqs.map((sq) => sq.clearHistory()));
  lctx.set(c, L);
  return L;
}

// Batching check, in time: 8 decode steps of c sequences with each step's evaluations issued
// together (one llama_decode per step) and issued one after another (c llama_decode calls),
// alternating, 3 times each; medians
async function llamaBatchCheck(c) {
  const L = await llamaLevel(c), steps = 8, t = { together: [], one_by_one: [] }, calls = {};
  for (let r = 0; r < 3; r++) for (const mode of ["together", "one_by_one"]) {
    const p = L.seqs.map((_, i) => promptOf(999996 - r, i).slice(0, 16));
    let cur = await Promise.all(L.seqs.map(async (sq, i) => (await sq.controlledEvaluate([...p[i].slice(0, 15), [p[i][15], wantToken]]))[15]?.next?.token ?? 11));
    const calls0 = L.calls, t0 = performance.now();
    for (let n = 0; n < steps; n++) {
      if (mode === "together") cur = await Promise.all(L.seqs.map(async (sq, i) => (await sq.controlledEvaluate([[cur[i], wantToken]]))[0]?.next?.token ?? 11));
      else for (let i = 0; i < c; i++) cur[i] = (await L.seqs[i].controlledEvaluate([[cur[i], wantToken]]))[0]?.next?.token ?? 11;
    }
    t[mode].push((performance.now() - t0) / steps);
    calls[mode] = L.calls - calls0;
    await Promise.all(L.seqs.map((sq) => sq.clearHistory()));
  }
  return { clients: c, together: { step_ms: median(t.together), decode_calls: calls.together },
    one_by_one: { step_ms: median(t.one_by_one), decode_calls: calls.one_by_one } };
}

// one run, stepped as llama.cpp's server steps its slots (see the top comment)
async function llamaRun(c, run) {
  const L = await llamaLevel(c);
  const st = L.seqs.map((sq, i) => ({ sq, p: promptOf(run, i), pos: 0, cur: 0, n: 0, first: 0, last: 0 }));
  const calls0 = L.calls, tokens0 = L.tokens, dms0 = L.decode_ms;
  let steps = 0, active = c, missing = 0, dsteps = 0, dsteps_ms = 0;
  const t0 = performance.now();
  while (active > 0) {
    const jobs = [];
    let budget = o.stepTokens;
    for (const s of st) if (s.n > 0 && s.n < o.tokens) { jobs.push({ s, items: [[s.cur, wantToken]], gen: true }); budget--; }
    for (const s of st) {
      if (s.pos >= s.p.length) continue;
      if (budget <= 0) break;
      const k = Math.min(budget, s.p.length - s.pos), chunk = s.p.slice(s.pos, s.pos + k);
      s.pos += k; budget -= k;
      const done = s.pos === s.p.length;
      jobs.push({ s, items: done ? [...chunk.slice(0, -1), [chunk[k - 1], wantToken]] : chunk, gen: done });
    }
    const dms = L.decode_ms, decodeOnly = jobs.every((j) => j.items.length === 1);
    const res = await Promise.all(jobs.map((j) => j.s.sq.controlledEvaluate(j.items)));  // issued together: one llama_decode
    const now = performance.now();
    steps++;
    if (decodeOnly) { dsteps++; dsteps_ms += L.decode_ms - dms; }
    jobs.forEach((j, x) => {
      if (!j.gen) return;
      const s = j.s, tok = res[x][res[x].length - 1]?.next?.token;
      if (tok === undefined) missing++;
      s.cur = tok ?? 11;
      if (++s.n === 1) s.first = now;
      s.last = now;
      if (s.n === o.tokens) active--;
    });
  }
  const wall = (performance.now() - t0) / 1e3;
  if (missing) log(`llama.cpp run ${run}: ${missing} evaluations returned no token`);
  const s = summarize(st.map((x) => ({ ttft: (x.first - t0) / 1e3, span: (x.last - x.first) / 1e3, n: x.n })), wall);
  const calls = L.calls - calls0;
  await Promise.all(L.seqs.map((sq) => sq.clearHistory()));
  return { ...s, steps, decode_calls: L.counted ? calls : NaN, batch_tokens_mean: L.counted ? (L.tokens - tokens0) / calls : NaN,
    step_ms: L.counted ? (L.decode_ms - dms0) / calls : NaN, decode_step_ms: L.counted && dsteps ? dsteps_ms / dsteps : NaN };
}

// ---- the runs ----
const results = { model: o.model, threads: o.threads, prompt: o.prompt, tokens: o.tokens, step_tokens: o.stepTokens,
  flash_attn: o.flashAttn, clients: o.clients, reps_planned: o.reps, reps: 0, tokenmill: {}, llama: {}, other_load: {} };
for (const c of o.clients) { results.tokenmill[c] = []; results.llama[c] = []; results.other_load[c] = []; }
await Promise.all([0, 1].map((i) => streamOne(promptOf(999998, i), i)));  // tokenmill warm-up
if (o.llama) {
  const { getLlama, LlamaLogLevel } = await import("node-llama-cpp");
  llama = await getLlama({ gpu: false, build: "never", logLevel: LlamaLogLevel.error, maxThreads: 0, progressLogs: false });
  lmodel = await llama.loadModel({ modelPath: o.model, gpuLayers: 0 });
  for (const c of o.clients) await llamaLevel(c);
  if (maxC > 1) results.batch_check = await llamaBatchCheck(maxC);
}
const tRuns = performance.now();
for (let rep = 0; rep < o.reps; rep++) {
  const tRep = performance.now();
  for (const c of o.clients) {
    const run = rep * 100 + c;  // same prompts for both engines at this (rep, clients)
    const order = rep % 2 === 0 || !o.llama ? ["tokenmill", "llama"] : ["llama", "tokenmill"];
    const got = {}, load = await otherLoad([srv.pid]);
    results.other_load[c].push(load);
    for (const e of order) {
      if (e === "tokenmill") got.tokenmill = await tokenmillRun(c, run);
      else if (o.llama) got.llama = await llamaRun(c, run);
    }
    results.tokenmill[c].push(got.tokenmill);
    if (got.llama) results.llama[c].push(got.llama);
    const f1 = (x) => (Number.isFinite(x) ? x.toFixed(1) : "-");
    log(`rep ${rep + 1}, ${c} clients: aggregate tok/s tokenmill ${f1(got.tokenmill.tok_s_aggregate)}` +
      (got.llama ? `, llama.cpp ${f1(got.llama.tok_s_aggregate)}` : "") + `; other processes busy on ${load.toFixed(2)} of ${ncpu} cores before`);
  }
  results.reps = rep + 1;
  const now = performance.now(), per = (now - tRuns) / (rep + 1);
  if (rep + 1 < o.reps && (now - tStart + per) / 1e3 > o.budget) {
    log(`stopping after ${rep + 1} of ${o.reps} reps: another would end past --budget ${o.budget} s (a rep takes ${((now - tRep) / 1e3).toFixed(0)} s)`);
    break;
  }
}
// llama.cpp's model and contexts stay loaded until process.exit at the end frees them

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
    s.on("close", () => res(null));  // refused or closed by the server without an answer
    setTimeout(() => res(s), 20000).unref();
  })));
  const held = socks.filter((s) => s && !s.destroyed && s.readyState === "open").length;
  const m = await metrics();
  const r = await streamOne(promptOf(999997, 0), 0);
  results.http.idle_requested = o.idle;
  results.http.idle_held = held;
  results.http.connections_reported = m.tokenmill_http_connections;
  results.http.request_ok_while_idle = r.n === o.tokens;
  for (const s of socks) s?.destroy();
}
srv.kill("SIGTERM");

// ---- report: medians over the reps ----
const f = (x, d = 1) => (x === undefined || !Number.isFinite(x) ? "-" : x.toFixed(d));
const med = (e, c, k) => median((results[e][c] ?? []).map((r) => r[k]));
const ratio = (a, b) => (Number.isFinite(a) && Number.isFinite(b) && b > 0 ? a / b : NaN);
// the ratio column: median over the reps of each rep's ratio (a pair run back to back, so drift
// in the machine's load cancels more than in a ratio of medians)
const pratio = (c, k, lower) => median((results.tokenmill[c] ?? []).map((t, r) => {
  const l = results.llama[c]?.[r];
  return l ? (lower ? ratio(l[k], t[k]) : ratio(t[k], l[k])) : NaN;
}));
const range = (e, c, k, d) => { const xs = (results[e][c] ?? []).map((r) => r[k]).filter(Number.isFinite); return xs.length > 1 ? `${f(Math.min(...xs), d)}-${f(Math.max(...xs), d)}` : ""; };
const pad = (x) => String(x).padStart(7);
console.log(`model ${path.basename(o.model)}, ${o.threads} threads, prompt ${o.prompt} tokens, ${o.tokens} generated per client ` +
  `(greedy, EOS ignored), step budget ${o.stepTokens} tokens, median of ${results.reps} alternating rep(s) [range]`);
console.log("tokenmill: `tokenmill serve`, streaming HTTP, timed by the client; llama.cpp: node-llama-cpp 3.21.1 in this process (no HTTP), " +
  `one context with a sequence per client, server-style steps, flash attention ${o.flashAttn ? "on" : "off"}; KV F16 on both`);
console.log("ratio: tokenmill / llama.cpp in speed (> 1: tokenmill faster; for times, llama.cpp / tokenmill), median of the reps' ratios");
const rows = [["TTFT mean ms", "ttft_mean_ms", true, 1], ["TTFT P99 ms", "ttft_p99_ms", true, 1], ["tok/s per user (tm: server side)", "tok_s_per_user", false, 1],
  ["aggregate tok/s", "tok_s_aggregate", false, 1], ["engine step ms", "step_ms", true, 2]];
console.log("clients | metric | tokenmill | llama.cpp | ratio | tokenmill range | llama.cpp range");
for (const c of o.clients) {
  for (const [label, k, lower, d] of rows) {
    const t = med("tokenmill", c, k), l = med("llama", c, k);
    console.log(`${pad(c)} | ${label} | ${f(t, d)} | ${f(l, d)} | ${f(pratio(c, k, lower), 2)} | ${range("tokenmill", c, k, d)} | ${range("llama", c, k, d)}`);
  }
  console.log(`${pad(c)} | tokenmill: TTFT mean on the server (no HTTP) ${f(med("tokenmill", c, "server_ttft_ms"))} ms, HTTP and client add ` +
    `${f(med("tokenmill", c, "http_ttft_ms"), 2)} ms; tok/s per user seen by the client ${f(med("tokenmill", c, "client_tok_s_per_user"))}; ` +
    `${f(med("tokenmill", c, "steps"), 0)} steps, CPU gap ${f(med("tokenmill", c, "cpu_gap_ms"), 3)} ms/step, cached prompt tokens ${f(med("tokenmill", c, "cached_tokens"), 0)}`);
  if (o.llama)
    console.log(`${pad(c)} | llama.cpp: ${f(med("llama", c, "steps"), 0)} steps, ${f(med("llama", c, "decode_calls"), 0)} llama_decode calls, ` +
      `${f(med("llama", c, "batch_tokens_mean"))} tokens per call; a decode-only step (${c} sequences) ${f(med("llama", c, "decode_step_ms"), 2)} ms`);
  console.log(`${pad(c)} | other processes busy on ${f(median(results.other_load[c]), 2)} of ${ncpu} cores before the runs [${results.other_load[c].map((x) => f(x, 2)).join(", ")}]`);
}
if (results.batch_check) {
  const b = results.batch_check;
  console.log(`llama.cpp batching check (${b.clients} sequences, 8 decode steps, median of 3): evaluations issued together ${f(b.together.step_ms, 2)} ms/step ` +
    `(${b.together.decode_calls} llama_decode calls), issued one by one ${f(b.one_by_one.step_ms, 2)} ms/step (${b.one_by_one.decode_calls} calls)`);
}
console.log(`HTTP: GET /health keep-alive P50 ${f(results.http.health_p50_ms, 3)} ms, P99 ${f(results.http.health_p99_ms, 3)} ms` +
  (results.http.idle_requested ? `; ${results.http.idle_held}/${results.http.idle_requested} idle keep-alive connections held ` +
    `(server reports ${results.http.connections_reported}), a request during them ${results.http.request_ok_while_idle ? "succeeded" : "FAILED"}` : ""));
const busy = median(o.clients.flatMap((c) => results.other_load[c]));
if (o.llama && o.threads > 1 && busy > 0.5)
  console.log(`note: other processes kept ${f(busy, 2)} of ${ncpu} cores busy. llama.cpp's threads meet at spinning barriers (and node-llama-cpp ` +
    "starts them per llama_decode), so on busy cores its multi-thread steps slow down many times more than tokenmill's (spin, then sleep); " +
    "the llama.cpp column then measures the contention. --threads 1 compares the engines without barriers.");
if (o.markdown) {
  console.log("\n| clients | TTFT mean ms (tm / llama, ratio) | TTFT P99 ms | tok/s per user | aggregate tok/s | engine step ms | tm TTFT on the server, HTTP share ms |");
  console.log("|---:|---|---|---|---|---|---|");  // per user: tm server side
  for (const c of o.clients) {
    const cell = (k, lower, d) => { const t = med("tokenmill", c, k), l = med("llama", c, k); return `${f(t, d)} / ${f(l, d)} (${f(pratio(c, k, lower), 2)})`; };
    console.log(`| ${c} | ${rows.map(([, k, lower, d]) => cell(k, lower, d)).join(" | ")} | ${f(med("tokenmill", c, "server_ttft_ms"))}, ${f(med("tokenmill", c, "http_ttft_ms"), 1)} |`);
  }
}
console.log(`total ${((performance.now() - tStart) / 1e3).toFixed(0)} s`);
if (o.json) fs.writeFileSync(o.json, JSON.stringify(results, null, 2));
process.exit(0);
