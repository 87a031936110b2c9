#!/usr/bin/env node
// bench/cluster: disaggregated serving under a mixed workload. Long prompts arrive
// while many sequences decode; three set-ups of the same model on the same machine, run one
// after the other in one run:
//   disagg  `tokenmill gateway` + one `worker --role prefill` + one `worker --role decode`
//   mixed   `tokenmill gateway` + two `worker --role mixed`
//   serve   one `tokenmill serve`
// Threads, so that nothing oversubscribes the cores (2 on the reference machine): each worker
// gets --threads cores/2 (1 + 1: the prefill worker one core, the decode worker the other;
// each mixed worker one), serve gets --threads cores; the gateway runs no kernels (HTTP and
// relaying only). Every set-up has its own fresh dir: block store (the workers share theirs).
//
//   bench/cluster [-m MODEL] [--decoders 16] [--decode-prompt 64] [--long 6]
//                 [--long-prompt 1536] [--long-every 1.5] [--long-tokens 8] [--quiet 1.5]
//                 [--setups disagg,mixed,serve] [--rounds 3] [--threads N] [--json OUT.json]
//
// The set-ups alternate, --rounds times (disagg, mixed, serve, disagg, ...), and the table
// shows the median of the rounds for each figure (the machine is shared: one round of one
// set-up says little; the per-round ITL P99 is printed under the table).
// The workload: --decoders streaming /v1/completions (random prompt ids, ignore_eos, greedy,
// logprobs 0 so that every token is counted) start together; once they all stream, --long
// prompts of --long-prompt random ids arrive every --long-every seconds (open loop), each
// generating --long-tokens; --quiet seconds after the last long prompt's end the decoders are
// cut. Reported per set-up: TTFT of the long prompts (mean, P99) and of the decoders' start;
// inter-token latency of the decoders (P50 / P99 / max) split into gaps that overlap a long
// prompt's prefill (its send to its first token) and the others ("quiet"); tokens/s per
// decoding user; aggregate tokens/s (every generated token / wall time); and the KV handoff
// cost from the gateway's /metrics (worker heartbeats): milliseconds per handed-off token,
// send side (prefill worker: first token to HANDOFF sent) + receive side (decode worker:
// DECODE received to KV in place), against the prefill worker's engine milliseconds per
// prefill token (what recomputing those tokens costs). Without -m a small random qwen3 model
// (bench/serve's) is generated under tests/data/gen/.
//
//   bench/cluster --latency 200 [-m models/stories260K.gguf] [--stream-tokens 64] [--bin PATH]
//
// The gateway's added latency instead of the workload: `serve` and `gateway` + one mixed worker
// of the same model (default the bundled stories260K), one thread each, idle; --latency N
// sequential one-token completions (non-streaming, greedy) through each, then N/10 streams of
// --stream-tokens tokens. Printed: the one-token completion's P50 / P90 / P99 through both and
// their difference at P50 (the gateway's added latency), the streams' inter-token gaps (P50 /
// P99 / max) through both and the difference of the max gaps, and the gateway's own
// tokenmill_gateway_added_seconds histogram (mean). --bin runs another build (before / after).
import { spawn, execFileSync } from "node:child_process";
import fs from "node:fs";
import http from "node:http";
import os from "node:os";
import path from "node:path";
import { parseArgs } from "./args.mjs";
import { onSseJson } from "./sse.mjs";

const root = path.resolve(import.meta.dirname, "..");
const o = parseArgs("bench/cluster", [
  { name: "-m", key: "model", arg: "MODEL", help: "the GGUF file (default: a small random qwen3 under tests/data/gen/; with --latency stories260K)" },
  { name: "--decoders", kind: "number", default: 16, help: "streams decoding throughout" },
  { name: "--decode-prompt", kind: "number", default: 64, help: "tokens of a decoder's prompt" },
  { name: "--long", kind: "number", default: 6, help: "long prompts" },
  { name: "--long-prompt", kind: "number", default: 1536, help: "tokens of a long prompt" },
  { name: "--long-every", kind: "number", default: 1.5, help: "seconds between long prompts" },
  { name: "--long-tokens", kind: "number", default: 8, help: "tokens a long prompt generates" },
  { name: "--quiet", kind: "number", default: 1.5, help: "seconds after the last long prompt before the decoders are cut" },
  { name: "--setups", kind: "list", default: ["disagg", "mixed", "serve"], help: "set-ups to run" },
  { name: "--threads", kind: "number", default: os.availableParallelism?.() ?? os.cpus().length, help: "cores (each worker gets half)" },
  { name: "--rounds", kind: "number", default: 3, help: "rounds of the set-ups (medians shown)" },
  { name: "--json", arg: "OUT.json", help: "write the figures there too" },
  { name: "--latency", kind: "number", help: "instead of the workload: the gateway's added latency over N completions" },
  { name: "--stream-tokens", kind: "number", default: 64, help: "(--latency) tokens of each stream" },
  { name: "--bin", arg: "PATH", default: path.join(root, "build/tokenmill"), help: "the tokenmill build to run" },
]);
const bin = path.resolve(o.bin);
if (!o.model && o.latency) o.model = path.join(root, "models/stories260K.gguf");
if (!o.model) {
  o.model = path.join(root, "tests/data/gen/bench-serve-qwen3-small-q8_0.gguf");
  if (!fs.existsSync(o.model)) {
    fs.mkdirSync(path.dirname(o.model), { recursive: true });
    execFileSync(bin, ["mkmodel", "--arch", "qwen3", "--preset", "small", "--type", "q8_0", "--seed", "1", "-o", o.model], { stdio: "inherit" });
  }
}
const half = Math.max(1, Math.floor(o.threads / 2));
const ctx = Math.max(o.longPrompt + o.longTokens + 64, 4096);
// decoders run until cut: their budget only has to outlast the long prompts
const decodeMax = ctx - o.decodePrompt - 8;
const maxSeqs = o.decoders + o.long + 8;

const pct = (xs, p) => { if (!xs.length) return NaN; const s = [...xs].sort((a, b) => a - b); return s[Math.min(s.length - 1, Math.floor(p * s.length))]; };
const mean = (xs) => xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : NaN;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
// prompt ids 10..989: ordinary tokens of any vocabulary we serve; every prompt differs (no hits)
const promptOf = (seed, n) => Array.from({ length: n }, (_, k) => 10 + ((seed * 7919 + k * 104729 + k * k * 31) % 980));

// ---- processes ----
const procs = [];
process.on("exit", () => { for (const p of procs) if (p.exitCode === null) try { p.kill("SIGKILL"); } catch {} });

function start(args, re, what) {
  const p = spawn(bin, args, { stdio: ["ignore", "ignore", "pipe"] });
  procs.push(p);
  let log = "";
  return new Promise((resolve, reject) => {
    const t = setTimeout(() => reject(new Error(`${what} did not start: ${log}`)), 60000);
    p.stderr.on("data", (d) => { log += d; const m = re.exec(log); if (m) { clearTimeout(t); p.stderr.removeAllListeners("data"); p.stderr.resume(); resolve({ proc: p, m }); } });
    p.on("exit", (c) => { clearTimeout(t); reject(new Error(`${what} exited ${c}: ${log}`)); });
  });
}
const stopAll = async () => {
  for (const p of procs.splice(0)) {
    if (p.exitCode !== null || p.signalCode !== null) continue;
    const gone = new Promise((r) => p.on("exit", r));
    p.kill("SIGKILL");
    await gone;
  }
};

async function setup(kind, store) {
  const cache = ["--cache", `dir:${store}`];
  if (kind === "serve") {
    const s = await start(["serve", "-m", o.model, "--port", "0", "--threads", String(o.threads), "--ctx", String(ctx),
      "--max-seqs", String(maxSeqs), "--max-queue", "1024", ...cache], /listening on http:\/\/[^:]+:(\d+)/, "serve");
    return { url: `http://127.0.0.1:${s.m[1]}`, threads: `serve ${o.threads}` };
  }
  const roles = kind === "disagg" ? ["prefill", "decode"] : ["mixed", "mixed"];
  const ws = await Promise.all(roles.map((r, i) => start(["worker", "--role", r, "-m", o.model, "--listen", "127.0.0.1:0",
    "--threads", String(half), "--ctx", String(ctx), "--max-seqs", String(maxSeqs), "--max-queue", "1024", "--name", `${r}${i}`, ...cache],
  /listening on port (\d+)/, `worker ${r}`)));
  const addr = ws.map((w) => `127.0.0.1:${w.m[1]}`);
  const g = await start(["gateway", "-m", o.model, "--listen", "127.0.0.1:0", "--ctx", String(ctx), "--prefill", addr[0],
    "--decode", addr[1], ...cache], /listening on http:\/\/[^:]+:(\d+)/, "gateway");
  const url = `http://127.0.0.1:${g.m[1]}`;
  for (let t = Date.now(); ; await sleep(50)) {
    const a = JSON.parse(await get(url, "/admin/workers"));
    if (a.workers.filter((w) => w.up).length === 2) break;
    if (Date.now() - t > 30000) throw new Error(`${kind}: workers not up: ${JSON.stringify(a)}`);
  }
  return { url, threads: kind === "disagg" ? `prefill ${half} + decode ${half}` : `mixed ${half} + mixed ${half}` };
}

// ---- HTTP ----
const agent = new http.Agent({ keepAlive: true, maxSockets: 1024 });
function get(url, p) {
  return new Promise((res, rej) => {
    http.get(url + p, { agent }, (r) => { let b = ""; r.on("data", (d) => (b += d)); r.on("end", () => res(b)); }).on("error", rej);
  });
}
async function metrics(url) {
  const m = {};
  for (const line of (await get(url, "/metrics")).split("\n")) if (line && !line.startsWith("#")) { const i = line.lastIndexOf(" "); m[line.slice(0, i)] = Number(line.slice(i + 1)); }
  return m;
}
// sum of every series of a metric (all labels), optionally only those whose labels match re
const msum = (m, name, re) => Object.entries(m).filter(([k]) => (k === name || k.startsWith(name + "{")) && (!re || re.test(k))).reduce((a, [, v]) => a + v, 0);

// One streaming completion; token arrival times (ms, performance.now) in r.times (tokens that
// arrive in one chunk share its time), chunk arrival times in r.chunks. stop() cuts it.
function stream(url, prompt, maxTokens, seed) {
  const r = { t0: performance.now(), times: [], chunks: [], n: 0, done: false };
  const body = JSON.stringify({ prompt, max_tokens: maxTokens, temperature: 0, seed, stream: true, ignore_eos: true, logprobs: 0 });
  let req;
  r.finished = new Promise((resolve, reject) => {
    req = http.request(url + "/v1/completions", { method: "POST", agent, headers: { "content-type": "application/json" } }, (res) => {
      onSseJson(res, (j, now) => {
        const c = j.choices?.[0];
        const nt = c?.logprobs?.tokens?.length ?? (c?.text ? 1 : 0);
        for (let i = 0; i < nt; i++) r.times.push(now);
        if (nt) r.chunks.push(now);
        r.n += nt;
      });
      res.on("end", () => { r.done = true; resolve(r); });
      res.on("error", () => { r.done = true; resolve(r); });
    });
    req.on("error", (e) => { if (r.cut) { r.done = true; resolve(r); } else reject(e); });
    req.end(body);
  });
  r.stop = () => { r.cut = true; req.destroy(); };
  return r;
}

// ---- the gateway's added latency (--latency) ----
function complete(url, prompt) {
  const body = JSON.stringify({ prompt, max_tokens: 1, temperature: 0, ignore_eos: true });
  const t0 = performance.now();
  return new Promise((resolve, reject) => {
    const req = http.request(url + "/v1/completions", { method: "POST", agent, headers: { "content-type": "application/json" } }, (res) => {
      res.resume();
      res.on("end", () => (res.statusCode === 200 ? resolve(performance.now() - t0) : reject(new Error(`HTTP ${res.statusCode}`))));
    });
    req.on("error", reject);
    req.end(body);
  });
}

async function latencyOne(kind) {
  const store = fs.mkdtempSync(path.join(os.tmpdir(), `tm-bench-cluster-lat-${kind}-`));
  try {
    const common = ["-m", o.model, "--threads", "1", "--ctx", "512"];
    let url;
    if (kind === "serve") {
      const s = await start(["serve", ...common, "--port", "0"], /listening on http:\/\/[^:]+:(\d+)/, "serve");
      url = `http://127.0.0.1:${s.m[1]}`;
    } else {
      const w = await start(["worker", "--role", "mixed", ...common, "--listen", "127.0.0.1:0", "--cache", `dir:${store}`],
        /listening on port (\d+)/, "worker");
      const addr = `127.0.0.1:${w.m[1]}`;
      const g = await start(["gateway", "-m", o.model, "--ctx", "512", "--listen", "127.0.0.1:0", "--prefill", addr, "--decode", addr,
        "--cache", `dir:${store}`], /listening on http:\/\/[^:]+:(\d+)/, "gateway");
      url = `http://127.0.0.1:${g.m[1]}`;
      for (let t = Date.now(); ; await sleep(50)) {
        const a = JSON.parse(await get(url, "/admin/workers"));
        if (a.workers.filter((x) => x.up).length >= 1) break;
        if (Date.now() - t > 30000) throw new Error("worker not up");
      }
    }
    const prompt = promptOf(7, 16).map((x) => x % 500);
    for (let i = 0; i < 10; i++) await complete(url, prompt);   // warm-up
    const one = [];
    for (let i = 0; i < o.latency; i++) one.push(await complete(url, prompt));
    const gaps = [];
    for (let i = 0; i < Math.max(1, Math.round(o.latency / 10)); i++) {
      const r = await stream(url, prompt, o.streamTokens, 1).finished;
      for (let k = 1; k < r.chunks.length; k++) gaps.push(r.chunks[k] - r.chunks[k - 1]);
    }
    const m = kind === "serve" ? {} : await metrics(url);
    const n = m["tokenmill_gateway_added_seconds_count"], sum = m["tokenmill_gateway_added_seconds_sum"];
    return { setup: kind, one_p50_ms: pct(one, 0.5), one_p90_ms: pct(one, 0.9), one_p99_ms: pct(one, 0.99),
      gap_p50_ms: pct(gaps, 0.5), gap_p99_ms: pct(gaps, 0.99), gap_max_ms: Math.max(...gaps), n_gaps: gaps.length,
      added_metric_mean_ms: n ? (sum / n) * 1e3 : NaN, added_metric_count: n ?? NaN };
  } finally {
    await stopAll();
    fs.rmSync(store, { recursive: true, force: true });
  }
}

if (o.latency) {
  const s = await latencyOne("serve"), g = await latencyOne("gateway");
  const f = (x, d = 2) => (x === undefined || Number.isNaN(x) ? "-" : x.toFixed(d));
  console.log(`model ${path.basename(o.model)}; ${o.latency} one-token completions, then ${s.n_gaps / (o.streamTokens - 1) | 0} streams ` +
    `of ${o.streamTokens} tokens, sequential, loopback, one thread per process`);
  console.log("setup   | one-token completion P50 / P90 / P99 ms | stream inter-token gap P50 / P99 / max ms");
  for (const r of [s, g])
    console.log(`${r.setup.padEnd(7)} | ${f(r.one_p50_ms, 3)} / ${f(r.one_p90_ms, 3)} / ${f(r.one_p99_ms, 3)} | ` +
      `${f(r.gap_p50_ms, 3)} / ${f(r.gap_p99_ms, 3)} / ${f(r.gap_max_ms, 3)}`);
  console.log(`gateway added latency: P50 ${f(g.one_p50_ms - s.one_p50_ms, 3)} ms (one-token completion, gateway - serve); ` +
    `inter-token gap P99 ${f(g.gap_p99_ms - s.gap_p99_ms, 3)} ms and max ${f(g.gap_max_ms - s.gap_max_ms, 3)} ms above serve's; ` +
    `tokenmill_gateway_added_seconds mean ${f(g.added_metric_mean_ms, 3)} ms over ${g.added_metric_count} requests`);
  if (o.json) fs.writeFileSync(o.json, JSON.stringify({ model: o.model, requests: o.latency, serve: s, gateway: g }, null, 2));
  process.exit(0);
}

async function runOne(kind) {
  const store = fs.mkdtempSync(path.join(os.tmpdir(), `tm-bench-cluster-${kind}-`));
  try {
    const s = await setup(kind, store);
    // warm-up: one short and one long request (page in the weights, first allocations)
    await Promise.all([stream(s.url, promptOf(9001, 32), 4, 1).finished, stream(s.url, promptOf(9002, 512), 2, 1).finished]);
    const m0 = await metrics(s.url);
    const t0 = performance.now();
    const dec = Array.from({ length: o.decoders }, (_, i) => stream(s.url, promptOf(i, o.decodePrompt), decodeMax, i));
    for (const end = Date.now() + 60000; dec.some((d) => d.n === 0); await sleep(10))
      if (Date.now() > end) throw new Error(`${kind}: decoders did not start`);
    await sleep(300);
    const longs = [];
    for (let i = 0; i < o.long; i++) {
      longs.push(stream(s.url, promptOf(1000 + i, o.longPrompt), o.longTokens, 1000 + i));
      if (i + 1 < o.long) await sleep(o.longEvery * 1000);
    }
    await Promise.all(longs.map((l) => l.finished));
    const lastLong = performance.now();
    await sleep(o.quiet * 1000);
    for (const d of dec) d.stop();
    await Promise.all(dec.map((d) => d.finished));
    const wall = (performance.now() - t0) / 1e3;
    const m1 = await metrics(s.url);
    // ---- figures ----
    const windows = longs.map((l) => [l.t0, l.times[0] ?? lastLong]);   // each long prompt's prefill
    const during = [], quiet = [];
    // inter-token latency: the gaps between a stream's chunks (what its client waits; a chunk
    // carries the tokens that were ready together, see tokens_per_chunk)
    for (const d of dec) {
      const tt = d.chunks.filter((t) => t <= lastLong + o.quiet * 1000);
      for (let i = 1; i < tt.length; i++) {
        const a = tt[i - 1], b = tt[i];
        (windows.some(([w0, w1]) => a < w1 && b > w0) ? during : quiet).push(b - a);
      }
    }
    const perUser = dec.filter((d) => d.times.length > 1).map((d) => (d.times.length - 1) / ((d.times.at(-1) - d.times[0]) / 1e3));
    const ttftLong = longs.map((l) => l.times[0] - l.t0), ttftDec = dec.map((d) => d.times[0] - d.t0);
    const nTok = dec.reduce((a, d) => a + d.n, 0) + longs.reduce((a, l) => a + l.n, 0);
    const dm = (name, re) => msum(m1, name, re) - msum(m0, name, re);
    const sendTok = dm("tokenmill_worker_handoff_tokens_total", /side="send"/), recvTok = dm("tokenmill_worker_handoff_tokens_total", /side="receive"/);
    const sendS = dm("tokenmill_worker_handoff_seconds_total", /side="send"/), recvS = dm("tokenmill_worker_handoff_seconds_total", /side="receive"/);
    const preTok = dm("tokenmill_worker_prefill_tokens_total", /role="prefill"/), preBusy = dm("tokenmill_worker_busy_seconds_total", /role="prefill"/);
    const r = {
      setup: kind, threads: s.threads, wall_s: wall,
      ttft_long_mean_ms: mean(ttftLong), ttft_long_p99_ms: pct(ttftLong, 0.99), ttft_decode_mean_ms: mean(ttftDec),
      itl_quiet_p50_ms: pct(quiet, 0.5), itl_quiet_p99_ms: pct(quiet, 0.99), itl_quiet_max_ms: Math.max(...quiet),
      itl_prefill_p50_ms: pct(during, 0.5), itl_prefill_p99_ms: pct(during, 0.99), itl_prefill_max_ms: Math.max(...during),
      n_gaps_quiet: quiet.length, n_gaps_prefill: during.length,
      tok_s_per_user: mean(perUser), tok_s_aggregate: nTok / wall, tokens: nTok,
      tokens_per_chunk: dec.reduce((a, d) => a + d.n, 0) / dec.reduce((a, d) => a + d.chunks.length, 0),
      decoders_finished_early: dec.filter((d) => !d.cut || d.n >= decodeMax).length,
      handoffs: dm("tokenmill_worker_handoffs_total", /side="send"/),
      handoff_send_ms_per_tok: sendTok > 0 ? (sendS / sendTok) * 1e3 : NaN,
      handoff_recv_ms_per_tok: recvTok > 0 ? (recvS / recvTok) * 1e3 : NaN,
      prefill_ms_per_tok: preTok > 0 ? (preBusy / preTok) * 1e3 : NaN,
      learned_prefill_tok_s: msum(m1, "tokenmill_worker_prefill_tokens_per_second", /role="prefill"/) || NaN,
    };
    r.handoff_ms_per_tok = (r.handoff_send_ms_per_tok || 0) + (r.handoff_recv_ms_per_tok || 0) || NaN;
    return r;
  } finally {
    await stopAll();
    fs.rmSync(store, { recursive: true, force: true });
  }
}

const results = { model: o.model, cores: o.threads, decoders: o.decoders, decode_prompt: o.decodePrompt, long: o.long,
  long_prompt: o.longPrompt, long_every_s: o.longEvery, long_tokens: o.longTokens, rounds: o.rounds, runs: [], median: [] };
for (let round = 0; round < o.rounds; round++)
  for (const k of o.setups) results.runs.push({ round, ...(await runOne(k)) });
const median = (xs) => { const s = xs.filter((x) => !Number.isNaN(x)).sort((a, b) => a - b); return s.length ? s[(s.length - 1) >> 1] : NaN; };
for (const k of o.setups) {
  const rs = results.runs.filter((r) => r.setup === k), m = { setup: k, threads: rs[0].threads };
  for (const key of Object.keys(rs[0])) if (typeof rs[0][key] === "number" && key !== "round") m[key] = median(rs.map((r) => r[key]));
  m.decoders_finished_early = Math.max(...rs.map((r) => r.decoders_finished_early));
  results.median.push(m);
}

// ---- report ----
const f = (x, d = 1) => (x === undefined || Number.isNaN(x) ? "-" : x.toFixed(d));
console.log(`model ${path.basename(o.model)}; ${o.decoders} decoding streams (prompt ${o.decodePrompt}), ${o.long} long prompts of ` +
  `${o.longPrompt} tokens every ${o.longEvery} s (${o.longTokens} tokens each); ${o.threads} cores; median of ${o.rounds} alternating rounds`);
console.log("setup   | threads              | TTFT long mean / P99 ms | decode ITL quiet P50 / P99 ms | decode ITL during prefill P50 / P99 / max ms | tok/s per user | aggregate tok/s | tokens/chunk");
for (const r of results.median)
  console.log(`${r.setup.padEnd(7)} | ${r.threads.padEnd(20)} | ${f(r.ttft_long_mean_ms, 0)} / ${f(r.ttft_long_p99_ms, 0)} | ` +
    `${f(r.itl_quiet_p50_ms)} / ${f(r.itl_quiet_p99_ms)} | ${f(r.itl_prefill_p50_ms)} / ${f(r.itl_prefill_p99_ms)} / ${f(r.itl_prefill_max_ms)} | ` +
    `${f(r.tok_s_per_user)} | ${f(r.tok_s_aggregate)} | ${f(r.tokens_per_chunk, 2)}` +
    (r.decoders_finished_early ? `  (${r.decoders_finished_early} decoders ended before the cut: raise the context)` : ""));
console.log("decode ITL during prefill P99 per round, ms: " + o.setups.map((k) => `${k} ` +
  results.runs.filter((r) => r.setup === k).map((r) => f(r.itl_prefill_p99_ms, 0)).join(" ")).join("; "));
console.log("KV handoff (gateway /metrics, from the workers' heartbeats; medians):");
for (const r of results.median) {
  if (r.setup === "serve") continue;
  console.log(`  ${r.setup}: ${r.handoffs} handoffs, ${f(r.handoff_ms_per_tok, 4)} ms/token (send ${f(r.handoff_send_ms_per_tok, 4)} + ` +
    `receive ${f(r.handoff_recv_ms_per_tok, 4)})` + (Number.isNaN(r.prefill_ms_per_tok) ? "" :
    ` vs prefill ${f(r.prefill_ms_per_tok, 4)} ms/token on the prefill worker (recompute): ${f(r.prefill_ms_per_tok / r.handoff_ms_per_tok, 1)}x` +
    `; learned prefill speed ${f(r.learned_prefill_tok_s, 0)} tok/s`));
}
if (o.json) fs.writeFileSync(o.json, JSON.stringify(results, null, 2));
process.exit(0);
