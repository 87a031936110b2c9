#!/usr/bin/env node
// bench/ep: expert parallelism on one machine. Two parts, run one after the other:
//
// 1. Step time against link latency. One `tokenmill serve` (one process) against a group: a
//    `serve --ep-member` leader and --members `tokenmill expert` members on loopback, each
//    process --threads 1, with --ep-overlap on and off, for each latency of --delays. The
//    latency is emulated in the link code (TOKENMILL_EP_DELAY_MS on the members: each layer's
//    request and each micro-batch's answer is held that long, so a layer's round trip costs
//    two delays; this kernel has no netem, and the members answer from loopback). Per set-up:
//    --streams concurrent greedy streams of --tokens tokens; from the server's /metrics, the
//    mean engine step time (tokenmill_engine_step_seconds_total over steps, prefill steps
//    included) and, per step, the time from the first dispatch to the last reply summed over
//    the layers (communication), the time the step waited for it, the share hidden
//    (1 - waited / communication) and the time of one member exchange; also the median gap
//    between a stream's tokens.
// 2. The balancer on a router skewed on purpose (mkmodel --router-skew: the selection bias
//    favours the high expert ids; a random router spreads tokens evenly, so there a balancer
//    has nothing to do): the imbalance (busiest process over the mean, over the load window,
//    mean over MoE layers) of the contiguous ranges, of EPLB with --redundant experts placed
//    from the uniform load at start, and after rebalancing from the live load; and of the
//    same model without the skew.
//
//   bench/ep [-m MODEL] [--members 2] [--delays 0,0.2,1] [--streams 4] [--tokens 48]
//            [--redundant 4] [--skew 1.5] [--json OUT.json] [--bin PATH]
//
// Without -m a deepseek2-shaped model (6 layers of width 1024, a sigmoid router, 8 expert
// groups, one shared expert, 32 experts of 1024 of which 4 per token, q8_0, a synthetic
// 8192-token vocabulary: prompts are token ids) is generated under tests/data/gen/, with and
// without the skew. docs/benchmarks.md has the figures and a model of 2, 4 and 8 real machines.
import { spawn, execFileSync } from "node:child_process";
import fs from "node:fs";
import http from "node:http";
import os from "node:os";
import path from "node:path";
import { parseArgs } from "./args.mjs";
import { onSseJson } from "./sse.mjs";

const root = path.resolve(import.meta.dirname, "..");
const o = parseArgs("bench/ep", [
  { name: "-m", key: "model", arg: "MODEL", help: "a MoE GGUF for part 1 (default: a generated deepseek2 shape)" },
  { name: "--members", kind: "number", default: 2, help: "tokenmill expert members of the group" },
  { name: "--delays", kind: "list", of: "number", default: [0, 0.2, 1], help: "emulated one-way link latencies, ms" },
  { name: "--streams", kind: "number", default: 4, help: "concurrent streams (sequences per decode step)" },
  { name: "--tokens", kind: "number", default: 48, help: "tokens per stream" },
  { name: "--reps", kind: "number", default: 3, help: "runs of each set-up, alternating (medians shown)" },
  { name: "--parts", kind: "list", of: "number", default: [1, 2], help: "which parts to run" },
  { name: "--redundant", kind: "number", default: 4, help: "part 2: --redundant-experts" },
  { name: "--skew", kind: "number", default: 1.5, help: "part 2: mkmodel --router-skew of the skewed model" },
  { name: "--json", arg: "OUT.json", help: "write the figures there too" },
  { name: "--projection", kind: "flag", help: "instead: the model of 2, 4 and 8 real machines (below) and exit" },
  { name: "--gbps", kind: "list", of: "number", default: [10, 100], help: "(--projection) link bandwidths, Gb/s" },
  { name: "--latency-us", kind: "number", default: 50, help: "(--projection) one-way link latency, microseconds" },
  { name: "--membw", kind: "number", default: 150, help: "(--projection) memory bandwidth of a machine, GB/s" },
  { name: "--overhead-us", kind: "number", default: 30, help: "(--projection) software cost of one member exchange, microseconds" },
  { name: "--imbalance", kind: "number", default: 1.05, help: "(--projection) busiest machine's expert load over the mean" },
  { name: "--bin", arg: "PATH", default: path.join(root, "build/tokenmill"), help: "the tokenmill build to run" },
]);
const bin = path.resolve(o.bin);

// ---- the projection: DeepSeek V3 on P real machines, decode, memory-bound ----
// Per step of B sequences: one machine reads the dense part Wd (attention, shared experts, the
// 3 dense layers, the output head) and, in each of the L MoE layers, the weights of the
// A(B) = E (1 - (1 - k/E)^B) experts some token chose (uniform routing), We bytes each, at
// membw. A group of P: the leader reads Wd and its share; per layer each machine reads
// imbalance x A/P experts (c), while rows go out and back over the leader's link: B k (P-1)/P
// rows of 4 d bytes (f32) each way (tx each way at the link's bandwidth, full duplex), plus
// two one-way latencies and the software cost of an exchange. A layer costs
// 2 lat + cost + tx + c + tx (the leader's own c runs inside it: the share hidden); two
// micro-batches take min(tx, c) / 2 off (the first half's answer travels while the second
// half computes). Compute is not the bound (CPUs read weights slower than they multiply at
// these batches), and the links are not shared with anything else.
if (o.projection) {
  const L = 58, d = 7168, k = 8, E = 256, We = 3 * d * 2048 * 4.5 / 8, Wd = 8.8e9;
  const M = o.membw * 1e9, lat = o.latencyUs * 1e-6, ov = o.overheadUs * 1e-6;
  console.log(`DeepSeek V3 (${L} MoE layers, d ${d}, ${k} of ${E} experts, ${(We / 1e6).toFixed(1)} MB per expert at 4.5 bits, ` +
    `dense part ${(Wd / 1e9).toFixed(1)} GB read per step), memory ${o.membw} GB/s per machine, link latency ${o.latencyUs} us ` +
    `one way, ${o.overheadUs} us per exchange, imbalance ${o.imbalance}`);
  console.log("Gb/s  batch  machines  one machine ms  group ms (overlap off / on)  speed-up  hidden  wire MB/step");
  for (const gbps of o.gbps) {
    const N = gbps * 1e9 / 8;
    for (const B of [1, 16, 128]) {
      const A = E * (1 - Math.pow(1 - k / E, B));
      const t1 = (Wd + L * A * We) / M;
      for (const P of [2, 4, 8]) {
        const c = o.imbalance * A * We / (P * M);
        const bytes = B * k * (P - 1) / P * 4 * d, tx = bytes / N;
        const exOff = 2 * lat + ov + 2 * tx + c, exOn = exOff - Math.min(tx, c) / 2;
        const tOff = Wd / M + L * exOff, tOn = Wd / M + L * exOn;
        console.log(`${String(gbps).padStart(4)}${String(B).padStart(7)}${String(P).padStart(10)}${(1e3 * t1).toFixed(1).padStart(16)}` +
          `${`${(1e3 * tOff).toFixed(1)} / ${(1e3 * tOn).toFixed(1)}`.padStart(29)}${(t1 / tOn).toFixed(2).padStart(10)}` +
          `${`${(100 * c / exOn).toFixed(0)}%`.padStart(8)}${(2 * L * bytes / 1e6).toFixed(1).padStart(14)}`);
      }
    }
  }
  process.exit(0);
}
// prompt ids 10..989: ordinary tokens of any vocabulary; every prompt differs
const promptOf = (seed, n) => Array.from({ length: n }, (_, k) => 10 + ((seed * 7919 + k * 104729 + k * k * 31) % 980));

function genModel(skew) {
  const out = path.join(root, `tests/data/gen/bench-ep-ds1024-skew${skew}.gguf`);
  if (fs.existsSync(out)) return out;
  fs.mkdirSync(path.dirname(out), { recursive: true });
  execFileSync(bin, ["mkmodel", "--arch", "deepseek2", "--preset", "tiny", "--layers", "6", "--dim", "1024", "--heads", "8",
    "--q-lora", "128", "--kv-lora", "128", "--nope-dim", "32", "--rope-dim", "32", "--v-dim", "32", "--experts", "32",
    "--experts-used", "4", "--expert-ffn", "1024", "--shared-experts", "1", "--dense-layers", "1", "--router", "sigmoid",
    "--expert-groups", "8", "--groups-used", "4", "--router-skew", String(skew), "--vocab-size", "8192", "--type", "q8_0",
    "--seed", "5", "-o", out], { stdio: "inherit" });
  return out;
}

// ---- processes ----
const procs = [];
process.on("exit", () => { for (const p of procs) if (p.exitCode === null) try { p.kill("SIGKILL"); } catch {} });
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
function start(args, re, what, env = process.env) {
  const p = spawn(bin, args, { stdio: ["ignore", "ignore", "pipe"], env });
  procs.push(p);
  let log = "";
  return new Promise((resolve, reject) => {
    const t = setTimeout(() => reject(new Error(`${what} did not start: ${log}`)), 60000);
    p.stderr.on("data", (d) => { log += d; const m = re.exec(log); if (m) { clearTimeout(t); p.stderr.removeAllListeners("data"); p.stderr.resume(); resolve(m); } });
    p.on("exit", (c) => { clearTimeout(t); reject(new Error(`${what} exited ${c}: ${log}`)); });
  });
}
async function stopAll() {
  for (const p of procs.splice(0)) {
    if (p.exitCode !== null || p.signalCode !== null) continue;
    const gone = new Promise((r) => p.on("exit", r));
    p.kill("SIGKILL");
    await gone;
  }
}
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "tm-bench-ep-"));
const key = path.join(tmp, "cluster.key");
fs.writeFileSync(key, "bench-ep-key-0123456789abcdef\n", { mode: 0o600 });
process.on("exit", () => fs.rmSync(tmp, { recursive: true, force: true }));

// serve, alone (members: none) or leading members started with the delay; resolves to its URL
async function setup(model, { members = 0, delay = 0, overlap = "on", extra = [] } = {}) {
  const env = { ...process.env, TOKENMILL_EP_DELAY_MS: String(delay) };
  const ports = await Promise.all(Array.from({ length: members }, (_, i) => start(["expert", "-m", model, "--listen",
    "127.0.0.1:0", "--threads", "1", "--cluster-key-file", key], /listening on port (\d+)/, `member ${i}`, env)));
  const ep = members ? ["--cluster-key-file", key, "--ep-overlap", overlap, "--ep-member",
    ports.map((m) => `127.0.0.1:${m[1]}`).join(","), ...extra] : [];
  const m = await start(["serve", "-m", model, "--port", "0", "--threads", "1", "--ctx", "1024", "--max-seqs",
    String(o.streams + 2), ...ep], /listening on http:\/\/[^:]+:(\d+)/, "serve");
  return `http://127.0.0.1:${m[1]}`;
}

// ---- HTTP ----
const agent = new http.Agent({ keepAlive: true, maxSockets: 64 });
const get = (url, p) => new Promise((res, rej) => {
  http.get(url + p, { agent }, (r) => { let b = ""; r.on("data", (d) => (b += d)); r.on("end", () => res(b)); }).on("error", rej);
});
async function metrics(url) {
  const m = {};
  for (const line of (await get(url, "/metrics")).split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const i = line.lastIndexOf(" ");
    m[line.slice(0, i)] = Number(line.slice(i + 1));
  }
  return m;
}
// one greedy stream of n tokens; resolves to the arrival times of its tokens (ms)
function streamTimes(url, prompt, n) {
  return new Promise((resolve, reject) => {
    const body = JSON.stringify({ prompt, max_tokens: n, temperature: 0, stream: true, ignore_eos: true });
    const req = http.request(url + "/v1/completions", { method: "POST", agent, headers: { "content-type": "application/json" } }, (res) => {
      const t = [];
      onSseJson(res, (j, now) => { if (j.choices?.[0]) t.push(now); }, () => resolve(t));
      res.on("error", reject);
    });
    req.on("error", reject);
    req.end(body);
  });
}
const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b), h = Math.floor(s.length / 2);
  return !s.length ? NaN : s.length % 2 ? s[h] : (s[h - 1] + s[h]) / 2;
};

// ---- part 1 ----
async function runSteps(url) {
  await streamTimes(url, promptOf(99, 16), 4);
  const m0 = await metrics(url);
  const times = await Promise.all(Array.from({ length: o.streams }, (_, i) => streamTimes(url, promptOf(i, 24), o.tokens)));
  const m1 = await metrics(url);
  const gaps = times.flatMap((t) => t.slice(2).map((x, k) => x - t[k + 1]));   // past the first token (prefill)
  const d = (k) => (m1[k] ?? 0) - (m0[k] ?? 0);
  const steps = d("tokenmill_engine_steps_total"), n_ex = d("tokenmill_ep_exchanges_total");
  const exch = d("tokenmill_ep_exchange_seconds_total"), wait = d("tokenmill_ep_wait_seconds_total");
  return { gap_ms: median(gaps), step_ms: steps ? 1e3 * d("tokenmill_engine_step_seconds_total") / steps : 0,
    comm_ms: steps ? 1e3 * exch / steps : 0, wait_ms: steps ? 1e3 * wait / steps : 0,
    exch_ms: n_ex ? 1e3 * exch / n_ex : 0, hidden: exch > 0 ? 1 - wait / exch : 0, steps };
}

const f = (x, n = 2) => (typeof x === "number" ? x.toFixed(n) : String(x));
let rows = [];
if (o.parts.includes(1)) {
const model = o.model ? path.resolve(o.model) : genModel(0);
// every set-up --reps times, alternating, so that the shared machine's load falls on all alike
const runs = new Map();
const keyOf = (delay, overlap) => (delay === "-" ? "one" : `${delay}/${overlap}`);
for (let rep = 0; rep < o.reps; rep++) {
  const setups = [["-", null], ...o.delays.flatMap((d) => [[d, "on"], [d, "off"]])];
  for (const [delay, overlap] of setups) {
    const url = await setup(model, delay === "-" ? {} : { members: o.members, delay, overlap });
    const r = await runSteps(url);
    await stopAll();
    const k = keyOf(delay, overlap);
    if (!runs.has(k)) runs.set(k, { setup: delay === "-" ? "one process" : `leader + ${o.members}, overlap ${overlap}`, delay_ms: delay, all: [] });
    runs.get(k).all.push(r);
  }
}
rows = [...runs.values()].map((v) => {
  const med = (f) => median(v.all.map((r) => r[f]));
  return { setup: v.setup, delay_ms: v.delay_ms, gap_ms: med("gap_ms"), step_ms: med("step_ms"), comm_ms: med("comm_ms"),
    wait_ms: med("wait_ms"), exch_ms: med("exch_ms"), hidden: med("hidden"), step_ms_runs: v.all.map((r) => r.step_ms) };
});
const one = rows[0];
console.log(`\npart 1: ${path.basename(model)}, ${o.streams} streams x ${o.tokens} tokens, every process --threads 1, median of ${o.reps}`);
console.log("set-up                          delay ms  step ms  x one  token gap ms  comm ms/step  waited ms/step  hidden  ms/exchange  (step ms of each run)");
for (const r of rows)
  console.log(`${r.setup.padEnd(32)}${String(r.delay_ms).padStart(8)}${f(r.step_ms).padStart(9)}${f(r.step_ms / one.step_ms).padStart(7)}` +
    `${f(r.gap_ms).padStart(14)}${f(r.comm_ms).padStart(14)}${f(r.wait_ms).padStart(16)}` +
    `${(r.setup === "one process" ? "-" : `${(100 * r.hidden).toFixed(0)}%`).padStart(8)}${f(r.exch_ms).padStart(13)}` +
    `   (${r.step_ms_runs.map((x) => f(x, 1)).join(", ")})`);
}

// ---- part 2 ----
const P = o.members + 1;
const imb = [];
for (const skew of o.parts.includes(2) ? [o.skew, 0] : []) {
  const mm = genModel(skew);
  for (const [name, extra] of [["placed at start (uniform load)", ["--redundant-experts", String(o.redundant), "--ep-rebalance", "0"]],
    ["rebalanced from the live load", ["--redundant-experts", String(o.redundant), "--ep-rebalance", "0.2"]]]) {
    const url = await setup(mm, { members: o.members, extra });
    await Promise.all(Array.from({ length: o.streams }, (_, i) => streamTimes(url, promptOf(100 + i, 24), o.tokens)));
    await sleep(300);
    await streamTimes(url, promptOf(200, 16), 8);
    const m = await metrics(url);
    await stopAll();
    imb.push({ skew, policy: name, contiguous: m['tokenmill_ep_imbalance{placement="contiguous"}'],
      current: m['tokenmill_ep_imbalance{placement="current"}'], rebalances: m.tokenmill_ep_rebalances_total });
  }
}
if (imb.length) console.log(`\npart 2: imbalance over ${P} processes, ${o.redundant} redundant experts (1.0 is even)`);
if (imb.length) console.log("router skew  redundant experts                 contiguous ranges  EPLB placement  placements");
for (const r of imb)
  console.log(`${String(r.skew).padEnd(13)}${r.policy.padEnd(34)}${f(r.contiguous, 3).padStart(17)}${f(r.current, 3).padStart(16)}${String(r.rebalances).padStart(12)}`);
if (o.json) fs.writeFileSync(o.json, JSON.stringify({ steps: rows, imbalance: imb }, null, 2));
process.exit(0);
