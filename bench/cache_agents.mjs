#!/usr/bin/env node
// bench/cache_agents: the multi-turn agent workload (agents resending a growing conversation) against `tokenmill serve` and
// llama.cpp's per-slot prompt caching (a benchmark, not a test). A shared system prompt
// (--system 1500 tokens), --agents 8 agents, --turns 4 turns each; every turn appends --tool
// 250 tokens of "tool output" and asks for --answer 24 tokens (greedy, no EOS stop); the
// agents run concurrently, each waiting for its answer before its next turn. Prompts are
// token-id arrays (/v1/completions for tokenmill), fixed before the first run: the answer of a
// turn is replaced in the next turn's prefix by fixed ids of the same length (the bench needs
// only the shape of the traffic), so every run, of either engine, sends the same token ids.
//
// Runs, alternating the two engines (--reps R repeats the whole sequence; medians are shown):
//   tokenmill no cache      --cache off, and every prompt made unique by its first token
//   llama.cpp no reuse      every slot emptied before each request (llama.cpp's baseline)
//   tokenmill RAM tier      --cache off: the in-RAM prefix tier alone, KV pool capped by
//                           --kv-mib so it cannot hold every agent's history (a busy server)
//   llama.cpp S slots       one slot per agent (S = --agents): each agent's whole history
//                           stays in its slot, the best case of per-slot caching
//   tokenmill store on      RAM tier + `--cache-dir` (a fresh directory): write-behind, loads
//   llama.cpp pool slots    as many slots as tokenmill's --kv-mib holds (same KV memory):
//                           agents share slots as on a loaded server (see cache_llama.mjs)
//   tokenmill after restart a new server process on the store's directory, RAM tier empty:
//                           every hit is a block loaded from the store (store → RAM → KV)
// llama.cpp is driven by bench/cache_llama.mjs (node-llama-cpp 3.21.1, same GGUF file, same
// thread count, F16 KV cache like tokenmill's pool, the server's slot selection).
// Reported per run: time to first token mean and P99 (client side; tokenmill streaming over
// HTTP, llama.cpp in-process, so tokenmill's figures include its HTTP), hit rate (cached /
// prompt tokens: tokenmill's usage fields, llama.cpp's reused slot tokens), total wall time,
// the effective speed-up (TTFT mean of the engine's own no-cache run / this run's) next to the
// ideal 1/(1-hit), the KV memory, and tokenmill's store counters from /metrics. Then the
// ratios llama.cpp / tokenmill of TTFT mean, P99 and wall time. For each run that loaded blocks
// from the store: the I/O-thread time per 128-token block loaded, against the time to recompute
// 128 tokens (the no-cache run's server time per prompt token).
// With --serial requests go one at a time, so TTFT is each request's prefill alone and the
// speed-up is the pure effective prefill speed-up; by default the agents are concurrent and
// TTFT also holds the queueing behind the other agents' prefill and decode steps.
// "srv TTFT": the server's own mean time from submission to first token over the run's requests
// (from the /metrics histogram's sum and count, warm-up excluded): lookup, store loads and
// prefill without the HTTP; "srv of ideal": (no-cache srv TTFT / this run's) / ideal. With
// --serial this is the issue's "effective prefill speed-up against 1/(1-hit)".
// --runs nocache,ram,store,restart picks tokenmill's runs (restart implies store).
// Before each run the CPUs must be idle (waits up to --wait-quiet 60 s; the busy fraction is
// shown, '!' when over 15 %; --wait-quiet 0 neither waits nor measures): other processes slow
// llama.cpp's spinning barriers 10-20x.
//
//   bench/cache_agents [-m MODEL | --preset P] [--agents 8] [--turns 4] [--system 1500] [--tool 250]
//                      [--answer 24] [--kv-mib 24] [--threads N] [--step-tokens N] [--reps 1]
//                      [--llama-slots agents,pool] [--llama-batch 512] [--llama-flash-attn on]
//                      [--no-llama] [--serial] [--runs LIST] [--wait-quiet 60] [--json OUT.json]
// --llama-slots: a list of llama.cpp runs (besides the no-reuse one): a number of slots,
// "agents" (one per agent) or "pool" (tokenmill's --kv-mib of F16 KV); empty for none.
// Without -m a small random qwen3 model is generated under tests/data/gen/; --preset
// qwen3-0.6b|llama3.2-1b uses that real model shape (random Q8_0 weights, bench/models.mjs).
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import http from "node:http";
import os from "node:os";
import path from "node:path";
import { parseArgs } from "./args.mjs";
import { benchModel } from "./models.mjs";
import { serverMetrics, startServe, stopServe } from "./server.mjs";

const root = path.resolve(import.meta.dirname, "..");
const bin = process.env.TM_BIN || path.join(root, "build/tokenmill");
const o = parseArgs("bench/cache_agents", [
  { name: "-m", key: "model", arg: "MODEL", help: "a GGUF file (default: a small random qwen3 generated under tests/data/gen/)" },
  { name: "--preset", arg: "P", help: "a real model's shape with random Q8_0 weights (bench/models.mjs), instead of -m" },
  { name: "--agents", kind: "number", default: 8, help: "agents running concurrently" },
  { name: "--turns", kind: "number", default: 4, help: "turns of each agent" },
  { name: "--system", kind: "number", default: 1500, help: "tokens of the shared system prompt" },
  { name: "--tool", kind: "number", default: 250, help: "tokens of tool output each turn appends" },
  { name: "--answer", kind: "number", default: 24, help: "tokens generated each turn" },
  { name: "--kv-mib", kind: "number", default: 24, help: "tokenmill's KV pool, MiB" },
  { name: "--threads", kind: "number", default: os.availableParallelism?.() ?? os.cpus().length, help: "threads of both engines" },
  { name: "--step-tokens", key: "step", kind: "number", help: "tokenmill's --step-tokens" },
  { name: "--reps", kind: "number", default: 1, help: "repeats of the whole sequence of runs (medians shown)" },
  { name: "--llama-slots", default: "agents,pool", help: 'llama.cpp runs: slot counts, "agents" or "pool"; empty for none' },
  { name: "--llama-batch", kind: "number", default: 512, help: "llama.cpp's batch size" },
  { name: "--llama-flash-attn", default: "on", choices: ["on", "off"], help: "llama.cpp's flash attention" },
  { name: "--no-llama", key: "llama", kind: "flag", value: false, default: true, help: "tokenmill's runs only" },
  { name: "--serial", kind: "flag", default: false, help: "one request at a time" },
  { name: "--runs", default: "nocache,ram,store,restart", help: "tokenmill's runs (restart implies store)" },
  { name: "--wait-quiet", kind: "number", default: 60, help: "seconds to wait for idle CPUs before each run (0: no wait)" },
  { name: "--json", arg: "OUT.json", help: "write the figures there too" },
]);
if (o.preset && o.model) { console.error("bench/cache_agents: -m and --preset exclude each other"); process.exit(2); }
if (o.preset) {
  try { o.model = benchModel(o.preset, "q8_0", { tokenmill: bin, log: (l) => process.stderr.write(`bench/cache_agents: ${l}\n`) }); }
  catch (e) { console.error(`bench/cache_agents: ${e.message}`); process.exit(2); }
}
if (!o.model) {
  o.model = path.join(root, "tests/data/gen/bench-serve-qwen3-small-q8_0.gguf");
  if (!fs.existsSync(o.model)) {
    fs.mkdirSync(path.dirname(o.model), { recursive: true });
    execFileSync(bin, ["mkmodel", "--arch", "qwen3", "--preset", "small", "--type", "q8_0", "--seed", "1", "-o", o.model], { stdio: "inherit" });
  }
}
const log = (s) => process.stderr.write(`bench/cache_agents: ${s}\n`);

// The workload, fixed up front: prompts[a][t] (token ids 10..3009 and 3000.. for the unique
// first tokens: the model's vocabulary needs 3,500 ids or more; avoid 0..9, often control tokens).
let seed = 777;
const rnd = () => { seed = (seed * 1103515245 + 12345) % 2147483648; return seed; };
const ids = (n) => Array.from({ length: n }, () => 10 + (rnd() % 3000));
const system = ids(o.system);
const prompts = Array.from({ length: o.agents }, () => {
  const turns = [];
  let conv = system.slice();
  for (let t = 0; t < o.turns; t++) {
    conv = conv.concat(ids(o.tool));
    turns.push(conv);
    conv = conv.concat(ids(o.answer));
  }
  return turns;
});
// "no cache": a distinct first token per request, so nothing is ever shared
const unique = prompts.map((turns, a) => turns.map((p, t) => [3000 + a * 64 + t, ...p.slice(1)]));
const ctxTokens = o.system + o.turns * (o.tool + o.answer) + 64;

// Other processes wreck both engines' figures (llama.cpp's most): wait for idle CPUs.
const sleepMs = (ms) => Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, ms);
function cpuBusy() {
  const read = () => fs.readFileSync("/proc/stat", "utf8").split("\n")[0].trim().split(/\s+/).slice(1).map(Number);
  const a = read();
  sleepMs(1000);
  const d = read().map((x, i) => x - a[i]);
  const total = d.reduce((x, y) => x + y, 0), idle = d[3] + (d[4] ?? 0);
  return total > 0 ? 1 - idle / total : 0;
}
function waitQuiet() {
  if (!(o.waitQuiet > 0)) return null;  // --wait-quiet 0: neither wait nor measure
  const until = Date.now() + o.waitQuiet * 1000;
  let busy = cpuBusy();
  while (busy > 0.15 && Date.now() < until) {
    log(`CPUs ${(100 * busy).toFixed(0)} % busy with other work, waiting`);
    sleepMs(3000);
    busy = cpuBusy();
  }
  return busy;
}

const startServer = (extra) => startServe(bin, ["-m", o.model, "--port", "0", "--threads", String(o.threads), "--kv-mib", String(o.kvMib),
  "--ctx", String(ctxTokens), "--max-seqs", String(o.agents), ...(o.step ? ["--step-tokens", String(o.step)] : []), ...extra]);
const stopServer = stopServe;

function complete(port, prompt) {
  return new Promise((resolve, reject) => {
    const body = JSON.stringify({ prompt, max_tokens: o.answer, temperature: 0, ignore_eos: true, stream: true, stream_options: { include_usage: true } });
    const t0 = performance.now();
    let ttft = -1, usage = null, buf = "", text = "";
    const req = http.request({ port, method: "POST", path: "/v1/completions", headers: { "content-type": "application/json", "content-length": Buffer.byteLength(body) } }, (res) => {
      res.setEncoding("utf8");
      res.on("data", (d) => {
        buf += d;
        let i;
        while ((i = buf.indexOf("\n\n")) >= 0) {
          const ev = buf.slice(0, i); buf = buf.slice(i + 2);
          const line = ev.split("\n").find((l) => l.startsWith("data: "));
          if (!line || line === "data: [DONE]") continue;
          const j = JSON.parse(line.slice(6));
          if (j.choices?.length && ttft < 0) ttft = performance.now() - t0;
          if (j.choices?.length) text += j.choices[0].text;
          if (j.usage) usage = j.usage;
        }
      });
      res.on("end", () => (usage ? resolve({ ttft, usage, text }) : reject(new Error(`no usage in the reply (HTTP ${res.statusCode}): ${buf.slice(0, 300)}`))));
    });
    req.on("error", reject);
    req.end(body);
  });
}

// the store counters (short names) and the server's own time to first token (submit to
// first token: lookup, loads, prefill)
async function metrics(port) {
  const all = await serverMetrics(port), m = {};
  for (const [k, v] of Object.entries(all)) if (k.startsWith("tokenmill_store_")) m[k.slice("tokenmill_store_".length)] = v;
  m.ttft_sum = all.tokenmill_time_to_first_token_seconds_sum;
  m.ttft_count = all.tokenmill_time_to_first_token_seconds_count;
  return m;
}

function summary(ttfts, prompt, cached, wall) {
  ttfts.sort((x, y) => x - y);
  return { ttft_mean_ms: ttfts.reduce((s, x) => s + x, 0) / ttfts.length, ttft_p99_ms: ttfts[Math.min(ttfts.length - 1, Math.ceil(0.99 * ttfts.length) - 1)],
    hit: cached / prompt, prompt_tokens: prompt, cached_tokens: cached, wall_s: wall };
}

async function tokenmillRun(extra, ps) {
  const s = await startServer(extra);
  try {
    await complete(s.port, [11, 12, 13, 14, 15, 16, 17, 18]);  // warm-up (untimed, no full block)
    const m0 = await metrics(s.port);
    const ttfts = [], answers = [], t0 = performance.now();
    let prompt = 0, cached = 0;
    const one = async (a, t) => {
      const r = await complete(s.port, ps[a][t]);
      ttfts.push(r.ttft);
      prompt += r.usage.prompt_tokens;
      cached += r.usage.prompt_tokens_details?.cached_tokens ?? 0;
      answers.push(`${a}/${t}:${r.text}`);
    };
    if (o.serial) { for (let a = 0; a < o.agents; a++) for (let t = 0; t < o.turns; t++) await one(a, t); }
    else await Promise.all(ps.map(async (_, a) => { for (let t = 0; t < o.turns; t++) await one(a, t); }));
    const wall = (performance.now() - t0) / 1000;
    const m1 = await metrics(s.port);
    const server_ttft_ms = m1.ttft_count > m0.ttft_count ? 1000 * (m1.ttft_sum - m0.ttft_sum) / (m1.ttft_count - m0.ttft_count) : null;
    return { ...summary(ttfts, prompt, cached, wall), server_ttft_ms, kv_mib: o.kvMib, answers: answers.sort(), store: m1 };
  } finally {
    await stopServer(s);
  }
}

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "tm-bench-cache-"));
const workload = path.join(tmp, "workload.json");
fs.writeFileSync(workload, JSON.stringify({ prompts }));
function llamaRun(slots, noReuse) {
  const args = [path.join(root, "bench/cache_llama.mjs"), "-m", o.model, "--workload", workload, "--slots", slots, "--threads", String(o.threads),
    "--batch", String(o.llamaBatch), "--answer", String(o.answer), "--flash-attn", o.llamaFlashAttn, ...(noReuse ? ["--no-reuse"] : []), ...(o.serial ? ["--serial"] : [])];
  const out = execFileSync(process.execPath, args, { encoding: "utf8", stdio: ["ignore", "pipe", "inherit"], maxBuffer: 1 << 26 });
  return JSON.parse(out.trim().split("\n").pop());
}

// the plan: [key, label, engine, fn]; tokenmill and llama.cpp alternate
const llamaSlots = o.llama ? o.llamaSlots.split(",").filter(Boolean).map((x) => (x === "agents" ? String(o.agents) : x === "pool" ? `pool:${o.kvMib}` : x)) : [];
const cacheDir = path.join(tmp, "store");
const tmAll = [
  ["tm-nocache", "tokenmill no cache", () => tokenmillRun(["--cache", "off"], unique)],
  ["tm-ram", "tokenmill RAM tier", () => tokenmillRun(["--cache", "off"], prompts)],
  ["tm-store", "tokenmill store on", () => (fs.rmSync(cacheDir, { recursive: true, force: true }), tokenmillRun(["--cache-dir", cacheDir], prompts))],
  ["tm-restart", "tokenmill restarted", () => tokenmillRun(["--cache-dir", cacheDir], prompts)],
];
const runs = new Set(o.runs.split(",").map((x) => `tm-${x}`));
if (runs.has("tm-restart")) runs.add("tm-store");  // restart reads the store that 'store on' fills
const tm = tmAll.filter(([k]) => runs.has(k));
const ll = o.llama ? [["ll-noreuse", "llama.cpp no reuse", () => llamaRun(String(o.agents), true)],
  ...llamaSlots.map((sl) => [`ll-${sl}`, `llama.cpp ${sl.startsWith("pool:") ? "pool" : sl} slots`, () => llamaRun(sl, false)])] : [];
const plan = [];
for (let i = 0; i < Math.max(tm.length, ll.length); i++) { if (tm[i]) plan.push(tm[i]); if (ll[i]) plan.push(ll[i]); }

const results = new Map(plan.map(([k, label]) => [k, { key: k, label, reps: [] }]));
try {
  for (let r = 0; r < o.reps; r++) {
    for (const [k, label, fn] of plan) {
      const busy = waitQuiet();
      log(`rep ${r + 1}/${o.reps}: ${label}`);
      const x = await fn();
      x.busy_before = busy;
      results.get(k).reps.push(x);
    }
  }
} finally {
  fs.rmSync(tmp, { recursive: true, force: true });
}

const median = (xs) => { const s = xs.slice().sort((x, y) => x - y), n = s.length; return n % 2 ? s[(n - 1) / 2] : (s[n / 2 - 1] + s[n / 2]) / 2; };
const rows = [...results.values()];
for (const r of rows) {
  for (const f of ["ttft_mean_ms", "ttft_p99_ms", "hit", "wall_s"]) r[f] = median(r.reps.map((x) => x[f]));
  r.server_ttft_ms = r.reps[0].server_ttft_ms == null ? null : median(r.reps.map((x) => x.server_ttft_ms));
  r.busy_before = r.reps[0].busy_before == null ? null : Math.max(...r.reps.map((x) => x.busy_before));
  r.kv_mib = r.reps[0].kv_mib;
  if (r.reps[0].slots) r.slots = r.reps[0].slots;
  if (r.reps[0].engine) r.engine = r.reps[0].engine;
}
const get = (k) => results.get(k);
for (const r of rows) {
  const base = r.key.startsWith("tm-") ? get("tm-nocache") : get("ll-noreuse");
  if (!base || base === r) continue;
  r.speedup = base.ttft_mean_ms / r.ttft_mean_ms;
  if (r.server_ttft_ms && base.server_ttft_ms) r.server_speedup = base.server_ttft_ms / r.server_ttft_ms;
  r.ideal = 1 / (1 - r.hit);
}
for (const r of rows) if (r.key.startsWith("ll-") && r.slots && r.key !== "ll-noreuse") r.label = r.key.startsWith("ll-pool") ? `llama.cpp ${r.slots} slots=` : `llama.cpp ${r.slots} slots`;

const pad = (s, n) => String(s).padStart(n);
console.log(`agent workload: ${o.agents} agents x ${o.turns} turns, system ${o.system} tokens, +${o.tool} tool tokens and ${o.answer} answer tokens per turn` +
  `${o.serial ? ", one request at a time (--serial)" : ", agents concurrent"}; model ${path.basename(o.model)}, ${o.threads} threads, ` +
  `${o.reps > 1 ? `median of ${o.reps} alternating reps` : "1 rep"}`);
console.log(`${"run".padEnd(22)}${pad("KV MiB", 7)}${pad("TTFT mean ms", 13)}${pad("TTFT P99 ms", 12)}${pad("hit rate", 9)}${pad("wall s", 8)}${pad("speed-up", 9)}${pad("ideal", 8)}${pad("of ideal", 9)}${pad("srv TTFT", 9)}${pad("srv of ideal", 13)}${pad("busy", 6)}`);
for (const r of rows) {
  const st = r.reps[0].store && (r.reps[0].store.writes_total || r.reps[0].store.blocks_loaded_total)
    ? `  store: ${r.reps[0].store.blocks_loaded_total} blocks loaded (${r.reps[0].store.blocks_hit_total} used), ${r.reps[0].store.writes_total} written, ${r.reps[0].store.writes_dropped_total} dropped` : "";
  console.log(`${r.label.padEnd(22)}${pad(r.kv_mib == null ? "?" : r.kv_mib.toFixed(0), 7)}${pad(r.ttft_mean_ms.toFixed(1), 13)}${pad(r.ttft_p99_ms.toFixed(1), 12)}` +
    `${pad((100 * r.hit).toFixed(1), 8)}%${pad(r.wall_s.toFixed(2), 8)}` +
    (r.speedup ? `${pad(r.speedup.toFixed(2), 8)}x${pad(r.ideal.toFixed(2), 7)}x${pad((100 * r.speedup / r.ideal).toFixed(0), 8)}%` : `${pad("-", 9)}${pad("-", 8)}${pad("-", 9)}`) +
    pad(r.server_ttft_ms == null ? "-" : r.server_ttft_ms.toFixed(1), 9) +
    (r.server_speedup ? `${pad(r.server_speedup.toFixed(2), 6)}x${pad((100 * r.server_speedup / r.ideal).toFixed(0), 5)}%` : pad("-", 13)) +
    (r.busy_before == null ? `${pad("?", 6)} ` : `${pad((100 * r.busy_before).toFixed(0), 5)}%${r.busy_before > 0.15 ? "!" : " "}`) + st);
}
console.log("speed-up: TTFT mean of the engine's own no-cache run / this run's; ideal: 1/(1-hit); of ideal: speed-up / ideal (target >= 80 %).\n" +
  "srv TTFT: the server's mean submit-to-first-token ms (/metrics, no HTTP); srv of ideal: its speed-up over no cache, and that / ideal.\n" +
  "restarted: a new tokenmill process on the store of 'store on' (RAM tier empty): its hits are blocks loaded from the store.\n" +
  (llamaSlots.length ? `llama.cpp: ${get(ll[1]?.[0])?.engine ?? ""}; '=': as many slots as tokenmill's ${o.kvMib} MiB KV pool holds.\n` : "") +
  "busy: CPU use by other processes just before the run (the most over the reps; '!' over 15 %: figures unreliable).");

// The issue's "block load time per 128 tokens against the time to recompute them": I/O-thread
// seconds per loaded block (reading, verifying; /metrics) against the no-cache run's server
// time per prompt token x 128 (prefill on all kernel threads).
const med = (xs) => { const v = xs.filter((x) => Number.isFinite(x)); return v.length ? median(v) : null; };   // of the finite ones
const noCache = get("tm-nocache");
const recompute128 = noCache && med(noCache.reps.map((x) => x.server_ttft_ms * o.agents * o.turns / x.prompt_tokens * 128));
for (const r of rows) {
  const per = med(r.reps.map((x) => x.store?.blocks_loaded_total ? 1000 * x.store.load_seconds_total / x.store.blocks_loaded_total : NaN));
  if (per == null) continue;
  console.log(`${r.label}: a 128-token block loads in ${per.toFixed(2)} ms of I/O-thread time (read + verify)` +
    (recompute128 ? `; recomputing 128 tokens takes ${recompute128.toFixed(1)} ms (no-cache srv TTFT per prompt token x 128): ${(recompute128 / per).toFixed(0)}x` : ""));
}

const llRows = rows.filter((r) => r.key.startsWith("ll-") && r.key !== "ll-noreuse");
if (llRows.length) {
  console.log("\nllama.cpp / tokenmill (above 1: tokenmill faster)");
  console.log(`${"tokenmill run".padEnd(22)}${"vs".padEnd(22)}${pad("TTFT mean", 10)}${pad("TTFT P99", 10)}${pad("wall", 8)}${pad("hit tm/ll", 11)}`);
  const pairs = [["tm-nocache", "ll-noreuse"], ...["tm-ram", "tm-store", "tm-restart"].flatMap((t) => llRows.map((l) => [t, l.key]))];
  for (const [t, l] of pairs) {
    const a = get(t), b = get(l);
    if (!a || !b) continue;
    console.log(`${a.label.padEnd(22)}${b.label.padEnd(22)}${pad((b.ttft_mean_ms / a.ttft_mean_ms).toFixed(2) + "x", 10)}${pad((b.ttft_p99_ms / a.ttft_p99_ms).toFixed(2) + "x", 10)}` +
      `${pad((b.wall_s / a.wall_s).toFixed(2) + "x", 8)}${pad(`${(100 * a.hit).toFixed(0)}/${(100 * b.hit).toFixed(0)}%`, 11)}`);
  }
}
const cmp = ["tm-ram", "tm-store", "tm-restart"].map(get).filter(Boolean);
const same = cmp.every((r) => JSON.stringify(r.reps[0].answers) === JSON.stringify(cmp[0].reps[0].answers));
console.log(`\ntokenmill's greedy answers identical across its cached runs: ${same ? "yes" : "no"}` +
  (same || o.serial || o.agents === 1 ? "" : " (expected with concurrent agents: batch-dependent numerics; --serial makes the check meaningful, test_blockio checks cache on = off exactly)"));
if (process.env.BENCH_DUMP) fs.writeFileSync(process.env.BENCH_DUMP, JSON.stringify(rows.map((r) => r.reps[0].answers)));
if (o.json) fs.writeFileSync(o.json, JSON.stringify({ opts: o, runs: rows.map(({ reps, ...r }) => ({ ...r, reps: reps.map(({ answers, ...x }) => x) })), identical: same }, null, 1));
