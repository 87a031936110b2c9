#!/usr/bin/env node
// bench/spec: speculative decoding in `tokenmill serve`, side by side with llama.cpp's token
// predictors (node-llama-cpp 3.21.1) where node-llama-cpp drives them.
//
//   bench/spec [--preset qwen3-0.6b] [--type q8_0] [--streams 1,4,16] [--tokens 64]
//              [--threads N] [--draft-layers 7] [--reps 1] [--configs none,k1,adaptive,...]
//              [--no-llama] [--json OUT.json] [--workload quote|mixed] [--mixed-temperature T]
//              [--server-log DIR]
//
// The workload quotes, as an agent does when it repeats tool output, a file or an earlier
// answer: each prompt is a tool result (a listing of 20 pseudo-random lines, different per
// stream) followed by "Repeat the tool output exactly:" and its first line. Each of c streams
// sends its prompt at once (streaming /v1/completions, greedy, exactly --tokens tokens). With
// --workload mixed every other stream samples at --mixed-temperature (2, seeded) instead: users
// that differ, whose drafts a fixed K verifies alike. On the random-weight model the greedy
// streams fall into loops that prompt lookup drafts almost perfectly, while at temperature 2 few
// drafts pass (at temperature 1 they passed about as often as the greedy ones': see
// docs/benchmarks.md). The table then also gives each group's tokens/s per user.
// Per-user tokens/s: (tokens - 1) / first-to-last-token span, the mean over the streams;
// aggregate: all tokens / wall time of the run. Configurations, one server each, run one
// after the other on the same model and thread count: no speculation; --spec ngram with
// --spec-fixed K for K = 1..5 and adaptive; self-speculation (--draft-layers N) and a draft
// model (the preset cut to 2 layers, same vocabulary, other random weights: drafts a target
// rarely accepts, which shows what poor drafts cost), each adaptive and with --spec-fixed 1
// (the best fixed count when drafts are poor). The random-weight model does not know
// how to quote: what prompt lookup finds is whatever its own output repeats, so the
// acceptance, and the speed-up, depend on the model; the table prints the acceptance beside
// each figure (/metrics: accepted / verified drafts, mean accepted length). With --server-log the
// table adds a modelled per-user rate: every request's span re-priced on one step-time curve
// fitted to all the servers' steps, a drafting model's rounds at their time under the same
// drift (see modelPerUser), which takes the machine's drift between rounds out of the
// comparison and leaves what each configuration's steps are made of and what its drafting costs.
//
// llama.cpp (1 stream): LlamaCompletion on a context sequence, greedy, without a predictor,
// with node-llama-cpp's InputLookupTokenPredictor (prompt lookup) and with its
// DraftSequenceTokenPredictor on the same draft model file (LlamaCompletion is where
// node-llama-cpp verifies predictions; a bare sequence.evaluate verifies none).
import { spawn, spawnSync } from "node:child_process";
import fs from "node:fs";
import http from "node:http";
import path from "node:path";
import { parseArgs } from "./args.mjs";
import { benchModel, benchPresets } from "./models.mjs";
import { onSseJson } from "./sse.mjs";

if (process.env.UV_THREADPOOL_SIZE !== "1") {  // llama.cpp's best speed on 2 cores: see bench/llama_bench.mjs
  const r = spawnSync(process.execPath, [...process.execArgv, ...process.argv.slice(1)], { stdio: "inherit", env: { ...process.env, UV_THREADPOOL_SIZE: "1" } });
  process.exit(r.status ?? 1);
}

const root = path.resolve(import.meta.dirname, "..");
const bin = path.join(root, "build/tokenmill");
const o = parseArgs("bench/spec", [
  { name: "--preset", arg: "P", default: "qwen3-0.6b", help: "the model shape (bench/models.mjs)" },
  { name: "--type", default: "q8_0", help: "its weight type" },
  { name: "--streams", kind: "list", of: "number", default: [1, 4, 16], help: "concurrency levels" },
  { name: "--tokens", kind: "number", default: 64, help: "tokens each stream generates" },
  { name: "--threads", kind: "number", default: 2, help: "threads of both engines" },
  { name: "--draft-layers", kind: "number", default: 7, help: "the self-speculation configuration's --draft-layers" },
  { name: "--no-llama", key: "llama", kind: "flag", value: false, default: true, help: "tokenmill only" },
  { name: "--reps", kind: "number", default: 1, help: "rounds over the configurations (each round runs them all in order; the table shows medians)" },
  { name: "--configs", kind: "list", default: null, help: "only these configurations: none, k1..k5, adaptive, self, self-k1, draft, draft-k1, dspark, dspark-k5, dflash, dspark-echo, dspark-echo-k5, mtp (default all but mtp)" },
  { name: "--json", arg: "OUT.json", default: null, help: "write the figures there too" },
  { name: "--workload", choices: ["quote", "mixed"], default: "quote", help: "quote: every stream greedy; mixed: every other stream samples at --mixed-temperature (seeded)" },
  { name: "--mixed-temperature", arg: "T", kind: "number", default: 2, help: "the sampled streams' temperature in --workload mixed" },
  { name: "--server-log", arg: "DIR", default: null, help: "run each server with -v and write its log to DIR/CONFIG-ROUND.log (the step lines: make-up and times); the table then adds a modelled per-user rate (one step-time curve over every log)" },
]);
const log = (s) => console.error(`bench/spec: ${s}`);

const model = benchModel(o.preset, o.type, { log });
// The draft model: the preset cut to 2 layers (its other shape options kept), other random
// weights; made when a configuration or llama.cpp's run needs it.
const draft = path.join(root, "bench/out", `${o.preset}-${o.type}-2layers-s2.gguf`);
function draftModel() {
  if (fs.existsSync(draft)) return draft;
  const vocab = fs.readFileSync(model + ".args", "utf8").match(/"--vocab","([^"]+)"/)?.[1];
  const extra = benchPresets[o.preset].extra ?? [], shape = [];
  for (let i = 0; i < extra.length; i++)
    if (extra[i] === "--layers" || extra[i] === "--nextn") i++;   /* and its value */
    else shape.push(extra[i]);
  const args = ["mkmodel", "--preset", benchPresets[o.preset].preset ?? o.preset, ...shape, "--layers", "2", "--type", o.type, "--seed", "2", ...(vocab ? ["--vocab", vocab] : []), "-o", draft];
  log(`${bin} ${args.join(" ")}`);
  const r = spawnSync(bin, args, { cwd: root, encoding: "utf8" });
  if (r.status !== 0) throw new Error(r.stderr);
  return draft;
}

// A tool result of 20 lines, different per stream, then the request to quote it.
function prompt(stream) {
  let x = 12345 + stream * 7919;
  const rnd = () => (x = (x * 1103515245 + 12345) % 2147483648) / 2147483648;
  const words = ["src", "lib", "main", "index", "util", "test", "config", "build", "docs", "cache", "engine", "http", "model"];
  const lines = [];
  for (let i = 0; i < 20; i++)
    lines.push(`${["-rw-r--r--", "drwxr-xr-x"][i % 2]} ${Math.floor(rnd() * 90000 + 1000)} ${words[Math.floor(rnd() * words.length)]}/${words[Math.floor(rnd() * words.length)]}_${i}.c`);
  return `Tool output:\n${lines.join("\n")}\n\nRepeat the tool output exactly:\n${lines[0]}\n`;
}

async function startServer(args, logFile) {
  const proc = spawn(bin, ["serve", "-m", model, "--port", "0", "--threads", String(o.threads), "--cache", "off",
    "--timeout", "3600", "--max-seqs", String(Math.max(...o.streams)), ...(logFile ? ["-v"] : []), ...args],
    { stdio: ["ignore", "ignore", logFile ? fs.openSync(logFile, "w") : "pipe"] });
  if (logFile) {   // the port comes from the log file
    for (let i = 0; i < 6000; i++) {
      const m = /listening on http:\/\/[^:]+:(\d+)/.exec(fs.readFileSync(logFile, "utf8"));
      if (m) {
        const port = Number(m[1]);
        const name = (await (await fetch(`http://127.0.0.1:${port}/v1/models`)).json()).data[0].id;
        return { proc, port, name };
      }
      if (proc.exitCode !== null) throw new Error(`server exited ${proc.exitCode}: see ${logFile}`);
      await new Promise((r) => setTimeout(r, 10));
    }
    throw new Error(`server never listened: see ${logFile}`);
  }
  let logText = "";
  const port = await new Promise((resolve, reject) => {
    proc.stderr.on("data", (d) => {
      logText += d;
      const m = /listening on http:\/\/[^:]+:(\d+)/.exec(logText);
      if (m) resolve(Number(m[1]));
    });
    proc.on("exit", (c) => reject(new Error(`server exited ${c}: ${logText}`)));
  });
  proc.removeAllListeners("exit");
  proc.stderr.resume();
  const name = (await (await fetch(`http://127.0.0.1:${port}/v1/models`)).json()).data[0].id;
  return { proc, port, name };
}

// The sampling of stream i: greedy, or with --workload mixed every other stream at
// --mixed-temperature (seeded).
const sampled = (i) => o.workload === "mixed" && i % 2 === 1;
const sampling = (i) => (sampled(i) ? { temperature: o.mixedTemperature, seed: 1000 + i } : { temperature: 0 });

function stream(S, p, i = 0) {
  const port = S.port;
  return new Promise((resolve, reject) => {
    const body = JSON.stringify({ model: S.name, prompt: p, max_tokens: o.tokens, ...sampling(i), ignore_eos: true, stream: true });
    const times = [];
    const req = http.request({ host: "127.0.0.1", port, path: "/v1/completions", method: "POST",
      headers: { "content-type": "application/json", "content-length": Buffer.byteLength(body) } }, (res) => {
      if (res.statusCode !== 200) {
        res.resume();
        reject(new Error(`HTTP ${res.statusCode}`));
        return;
      }
      onSseJson(res, (j, now) => { if (j.choices?.[0]?.text !== undefined) times.push(now); }, () => resolve(times));
      res.on("error", reject);
    });
    req.on("error", reject);
    req.end(body);
  });
}

async function metrics(port) {
  const text = await (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
  const m = {};
  for (const l of text.split("\n")) if (l && !l.startsWith("#")) m[l.slice(0, l.lastIndexOf(" "))] = Number(l.slice(l.lastIndexOf(" ") + 1));
  return m;
}

async function runConfig(id, name, args, round) {
  if (o.serverLog) fs.mkdirSync(o.serverLog, { recursive: true });
  const logFile = o.serverLog ? path.join(o.serverLog, `${id}-${round + 1}.log`) : null;
  const S = await startServer(args, logFile);
  const rows = [];
  try {
    await stream(S, "warm up " + prompt(99));
    for (const c of o.streams) {
      const m0 = await metrics(S.port);
      const t0 = performance.now();
      const all = await Promise.all(Array.from({ length: c }, (_, i) => stream(S, prompt(i + 100 * c), i)));
      const wall = (performance.now() - t0) / 1000;
      const m1 = await metrics(S.port);
      const d = (k) => (m1[k] ?? 0) - (m0[k] ?? 0);
      const rates = all.map((t) => (t.length - 1) / ((t[t.length - 1] - t[0]) / 1000));
      const mean = (xs) => (xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : 0);
      const perUser = mean(rates);
      const tokens = all.reduce((a, t) => a + t.length, 0);
      const verified = d("tokenmill_spec_verified_tokens_total"), accepted = d("tokenmill_spec_accepted_tokens_total");
      rows.push({ config: name, streams: c, per_user_tok_s: perUser, aggregate_tok_s: tokens / wall,
        per_user_greedy: mean(rates.filter((_, i) => !sampled(i))), per_user_sampled: mean(rates.filter((_, i) => sampled(i))),
        verified, accepted, acceptance: verified ? accepted / verified : 0,
        verifies: d("tokenmill_spec_verifies_total"), steps: d("tokenmill_engine_steps_total"), log: logFile });
      log(`${name}, ${c} streams: ${perUser.toFixed(1)} tok/s per user${o.workload === "mixed" ? ` (greedy ${rows.at(-1).per_user_greedy.toFixed(1)}, sampled ${rows.at(-1).per_user_sampled.toFixed(1)})` : ""}, ${(tokens / wall).toFixed(1)} aggregate, acceptance ${verified ? (accepted / verified).toFixed(2) : "-"}`);
    }
  } finally {
    S.proc.kill("SIGTERM");
    await new Promise((r) => S.proc.on("exit", r));
  }
  return rows;
}

const lazy = (f) => ({ lazy: f });   // arguments made when the configuration runs (a file to write first)
let configs = [["none", "none", []]];
for (let k = 1; k <= 5; k++) configs.push([`k${k}`, `ngram K=${k}`, ["--spec", "ngram", "--spec-fixed", String(k)]]);
configs.push(["adaptive", "ngram adaptive", ["--spec", "ngram"]]);
configs.push(["self", `self --draft-layers ${o.draftLayers}`, ["--draft-layers", String(o.draftLayers)]]);
configs.push(["self-k1", `self --draft-layers ${o.draftLayers} K=1`, ["--draft-layers", String(o.draftLayers), "--spec-fixed", "1"]]);
configs.push(["draft", "draft model (2 layers)", lazy(() => ["--draft", draftModel()])]);
configs.push(["draft-k1", "draft model (2 layers) K=1", lazy(() => ["--draft", draftModel(), "--spec-fixed", "1"])]);
// DSpark / DFlash (--configs dspark,dspark-k5,dflash): a random drafter for the preset written by
// tests/oracle/gguf_dflash.py (python3 with numpy): 2 layers reading the target's layers 1 and
// L-1, a Markov head of rank 16 and a confidence head; adaptive and verifying all 5.
const dsparkFile = path.join(root, "bench/out", `${o.preset}-${o.type}-dspark-s1.gguf`);
function dsparkDrafter() {
  if (fs.existsSync(dsparkFile)) return dsparkFile;
  const py = ["python3", "/usr/bin/python3"].find((p) => spawnSync(p, ["-c", "import numpy"]).status === 0);
  if (!py) throw new Error("the dspark configurations need python3 with numpy (tests/oracle/gguf_dflash.py)");
  const args = [path.join(root, "tests/oracle/gguf_dflash.py"), "--target", model, "--block", "6", "--markov", "16", "--conf", "-o", dsparkFile];
  log(`${py} ${args.join(" ")}`);
  const r = spawnSync(py, args, { cwd: root, encoding: "utf8" });
  if (r.status !== 0) throw new Error(r.stderr);
  return dsparkFile;
}
// dspark-echo / dspark-echo-k5: bench/dspark_echo.py's drafter for the preset, whose Markov head
// drafts the anchor again at every slot: drafts a target caught in a loop of period 1 accepts,
// so adaptive and verify-all-5 are compared on drafts that pass some of the time.
const echoFile = path.join(root, "bench/out", `${o.preset}-${o.type}-dspark-echo-s1.gguf`);
function echoDrafter() {
  if (fs.existsSync(echoFile)) return echoFile;
  const py = ["python3", "/usr/bin/python3"].find((p) => spawnSync(p, ["-c", "import numpy"]).status === 0);
  if (!py) throw new Error("the dspark-echo configurations need python3 with numpy (bench/dspark_echo.py)");
  const args = [path.join(root, "bench/dspark_echo.py"), "--target", model, "-o", echoFile];
  log(`${py} ${args.join(" ")}`);
  const r = spawnSync(py, args, { cwd: root, encoding: "utf8" });
  if (r.status !== 0) throw new Error(r.stderr);
  return echoFile;
}
// MTP (--configs mtp): the model's own MTP layers, adaptive; a preset with them
// (deepseek-v2-lite-mtp) is needed, others refuse --spec mtp at start.
configs.push(["mtp", "MTP layers adaptive", ["--spec", "mtp"]]);
configs.push(["dspark", "DSpark adaptive", lazy(() => ["--draft", dsparkDrafter(), "--spec", "dspark"])]);
configs.push(["dspark-k5", "DSpark verify-all-5", lazy(() => ["--draft", dsparkDrafter(), "--spec", "dspark", "--spec-fixed", "5"])]);
configs.push(["dflash", "DFlash adaptive (no confidence)", lazy(() => ["--draft", dsparkDrafter(), "--spec", "dflash"])]);
configs.push(["dspark-echo", "DSpark echo adaptive", lazy(() => ["--draft", echoDrafter(), "--spec", "dspark"])]);
configs.push(["dspark-echo-k5", "DSpark echo verify-all-5", lazy(() => ["--draft", echoDrafter(), "--spec", "dspark", "--spec-fixed", "5"])]);
if (o.configs) {
  const unknown = o.configs.filter((c) => !configs.some(([id]) => id === c));
  if (unknown.length) {
    console.error(`bench/spec: --configs: no configuration ${unknown.join(", ")} (none, k1..k5, adaptive, self, self-k1, draft, draft-k1, dspark, dspark-k5, dflash, dspark-echo, dspark-echo-k5, mtp)`);
    process.exit(2);
  }
  configs = configs.filter(([id]) => id === "none" || o.configs.includes(id));   /* the ratios need none */
} else {
  configs = configs.filter(([id]) => id !== "mtp");
}
// Rounds alternate the configurations, so a change in the machine's load between two of them
// shows in every round and the median of each is measured under the same mix of conditions;
// each round starts one configuration later than the one before, so none always runs last.
const runs = [];
for (let rep = 0; rep < Math.max(1, o.reps); rep++)
  for (let i = 0; i < configs.length; i++) {
    const [id, name, args] = configs[(i + rep) % configs.length];
    runs.push(...await runConfig(id, name, args.lazy ? args.lazy() : args, rep));
  }
// The modelled per-user rate (with --server-log): the machine's speed drifts by tens of percent
// between a configuration's rounds, more than the configurations differ. So the step lines of
// every server log are pooled, one step-time curve is fitted to all of them (seconds = a +
// b decodes + c verify rows + d prefill tokens, least squares on relative errors), and each
// request's span from its first token to its last is re-priced as the sum of that curve over
// the steps it spanned (the -v "first token at step" and "finished at step" lines). A drafting
// model's rounds (the -v "draft round" lines) count beside the step they draft for, at their
// measured time scaled by their server's ratio of priced to measured step time (its drift).
// What is left is what each configuration's choices cost under one machine: its steps'
// make-up and its drafting.
function modelPerUser(runs) {
  const stepRe = /sched: step (\d+) tokens .*?: (\d+) decodes, \d+ prefill chunks .*?verified (\d+) accepted \d+; ms: plan [\d.]+ step ([\d.]+)/;
  const firstRe = /sched: req (\d+) first token at step (\d+)/;
  const finRe = /sched: req (\d+) finished at step (\d+) \(\w+\): prompt \d+, (\d+) tokens generated/;
  const draftRe = /sched: draft round \(\w+\): \d+ sequences, \d+ steps, \d+ tokens caught up; ms ([\d.]+)/;
  const logs = new Map();
  for (const r of runs) {
    if (!r.log || logs.has(r.log) || !fs.existsSync(r.log)) continue;
    const steps = [], first = new Map(), reqs = [], drafts = [];   // drafts: [step index, seconds]
    for (const l of fs.readFileSync(r.log, "utf8").split("\n")) {
      let m;
      if ((m = stepRe.exec(l))) {
        const [tok, dec, ver] = [Number(m[1]), Number(m[2]), Number(m[3])];
        steps.push({ x: [1, dec, ver, tok - dec - ver], s: Number(m[4]) / 1e3 });
      } else if ((m = draftRe.exec(l))) drafts.push([steps.length, Number(m[1]) / 1e3]);
      else if ((m = firstRe.exec(l))) first.set(m[1], Number(m[2]));
      else if ((m = finRe.exec(l)) && first.has(m[1])) reqs.push({ id: Number(m[1]), from: first.get(m[1]), to: Number(m[2]), n: Number(m[3]) });
    }
    reqs.sort((a, b) => a.id - b.id);
    logs.set(r.log, { steps, reqs: reqs.slice(1), drafts });   // the first request is the warm-up
  }
  if (![...logs.values()].some((l) => l.reqs.length && l.steps.length)) return null;   // no -v request lines
  const n = 4, A = Array.from({ length: n }, () => new Array(n + 1).fill(0));
  for (const { steps } of logs.values())
    for (const { x, s } of steps) {
      if (!(s > 0)) continue;
      const w = 1 / (s * s);
      for (let i = 0; i < n; i++) {
        for (let j = 0; j < n; j++) A[i][j] += w * x[i] * x[j];
        A[i][n] += w * x[i] * s;
      }
    }
  for (let i = 1; i < n; i++) A[i][i] += 1e-9 * (1 + A[i][i]);
  for (let c = 0; c < n; c++) {   // Gauss-Jordan with partial pivoting
    let p = c;
    for (let r = c + 1; r < n; r++) if (Math.abs(A[r][c]) > Math.abs(A[p][c])) p = r;
    [A[c], A[p]] = [A[p], A[c]];
    if (!(Math.abs(A[c][c]) > 0)) return null;
    for (let r = 0; r < n; r++)
      if (r !== c) {
        const f = A[r][c] / A[c][c];
        for (let k = c; k <= n; k++) A[r][k] -= f * A[c][k];
      }
  }
  const w = A.map((row, i) => row[n] / row[i]);
  const price = (x) => x.reduce((a, v, i) => a + v * w[i], 0);
  for (const [file, { steps, reqs, drafts }] of logs) {
    const priced = steps.reduce((a, st) => a + price(st.x), 0), measured = steps.reduce((a, st) => a + st.s, 0);
    const extra = new Array(steps.length + 1).fill(0);
    for (const [at, sec] of drafts) extra[at] += measured > 0 ? sec * (priced / measured) : 0;
    const cum = [0];
    steps.forEach((st, i) => cum.push(cum.at(-1) + price(st.x) + extra[i]));
    let at = 0;
    for (const c of o.streams) {
      const wave = reqs.slice(at, at + c);
      at += c;
      const row = runs.find((r) => r.log === file && r.streams === c);
      if (!row || wave.length < c) continue;
      const rates = wave.map((q) => (q.n - 1) / (cum[Math.min(q.to, steps.length)] - cum[Math.min(q.from, steps.length)]));
      row.per_user_modelled = rates.reduce((a, b) => a + b, 0) / rates.length;
    }
  }
  return { const_s: w[0], decode_row_s: w[1], verify_row_s: w[2], prefill_token_s: w[3] };
}
const curve = modelPerUser(runs);

const median = (xs) => {
  const v = [...xs].sort((a, b) => a - b);
  return v.length % 2 ? v[(v.length - 1) / 2] : (v[v.length / 2 - 1] + v[v.length / 2]) / 2;
};
const rows = [];
for (const [, name] of configs)
  for (const c of o.streams) {
    const rs = runs.filter((r) => r.config === name && r.streams === c);
    const sum = (k) => rs.reduce((a, r) => a + r[k], 0);
    const verified = sum("verified"), accepted = sum("accepted"), verifies = sum("verifies");
    rows.push({ config: name, streams: c, reps: rs.length, per_user_tok_s: median(rs.map((r) => r.per_user_tok_s)),
      per_user_all: rs.map((r) => r.per_user_tok_s), aggregate_tok_s: median(rs.map((r) => r.aggregate_tok_s)),
      verified, accepted, acceptance: verified ? accepted / verified : 0, mean_accepted: verifies ? accepted / verifies : 0,
      per_user_greedy: median(rs.map((r) => r.per_user_greedy)), per_user_sampled: median(rs.map((r) => r.per_user_sampled)),
      steps: median(rs.map((r) => r.steps)),
      ...(curve ? { per_user_modelled: median(rs.map((r) => r.per_user_modelled ?? 0)) } : {}) });
  }

const llama = [];
if (o.llama) {
  const { getLlama, LlamaCompletion, InputLookupTokenPredictor, DraftSequenceTokenPredictor } = await import("node-llama-cpp");
  const L = await getLlama({ gpu: false, logLevel: "error" });
  const target = await L.loadModel({ modelPath: model });
  const dm = await L.loadModel({ modelPath: draftModel() });
  const ctxSize = 2048;
  async function once(name, mkPredictor) {
    const ctx = await target.createContext({ contextSize: ctxSize, threads: o.threads, sequences: 1 });
    const dctx = name.includes("draft") ? await dm.createContext({ contextSize: ctxSize, threads: o.threads, sequences: 1 }) : null;
    const seq = ctx.getSequence({ tokenPredictor: mkPredictor(dctx) });
    const times = [];
    await new LlamaCompletion({ contextSequence: seq }).generateCompletion(prompt(100), {
      maxTokens: o.tokens, temperature: 0,
      onToken: (toks) => { const now = performance.now(); for (let i = 0; i < toks.length; i++) times.push(now); },
    });
    const perUser = (times.length - 1) / ((times[times.length - 1] - times[0]) / 1000);
    const st = seq.tokenPredictions;
    llama.push({ config: name, streams: 1, per_user_tok_s: perUser, validated: st?.validated ?? 0, refuted: st?.refuted ?? 0 });
    log(`llama.cpp ${name}: ${perUser.toFixed(1)} tok/s`);
    await ctx.dispose();
    if (dctx) await dctx.dispose();
  }
  await once("none", () => undefined);
  await once("prompt lookup", () => new InputLookupTokenPredictor());
  await once("draft model (2 layers)", (dctx) => new DraftSequenceTokenPredictor(dctx.getSequence()));
}

const base = Object.fromEntries(rows.filter((r) => r.config === "none").map((r) => [r.streams, r]));
const mixed = o.workload === "mixed";
console.log(`\n${o.preset} ${o.type}, ${o.threads} threads, ${o.tokens} tokens per stream, ${mixed ? `every other stream sampled at temperature ${o.mixedTemperature}` : "greedy"}; quoting workload${o.reps > 1 ? `; medians of ${o.reps} rounds` : ""}\n`);
console.log(`| configuration | streams | tok/s per user |${mixed ? " greedy / sampled users |" : ""} aggregate tok/s | vs none (per user) |${curve ? " modelled per user | vs none |" : ""} drafts accepted / verified | mean accepted |`);
console.log(`|---|---:|---:|${mixed ? "---:|" : ""}---:|---:|${curve ? "---:|---:|" : ""}---:|---:|`);
for (const r of rows)
  console.log(`| ${r.config} | ${r.streams} | ${r.per_user_tok_s.toFixed(1)} |${mixed ? ` ${r.per_user_greedy.toFixed(1)} / ${r.per_user_sampled ? r.per_user_sampled.toFixed(1) : "-"} |` : ""} ${r.aggregate_tok_s.toFixed(1)} | ${(r.per_user_tok_s / base[r.streams].per_user_tok_s).toFixed(2)} |${curve ? ` ${r.per_user_modelled.toFixed(2)} | ${(r.per_user_modelled / base[r.streams].per_user_modelled).toFixed(3)} |` : ""} ${r.verified ? `${r.accepted} / ${r.verified}` : "-"} | ${r.mean_accepted ? r.mean_accepted.toFixed(2) : "-"} |`);
if (curve)
  console.log(`\nmodelled per user: each request's first-to-last-token span priced by one curve fitted to every server's steps: ${(curve.const_s * 1e3).toFixed(2)} ms a step + ${(curve.decode_row_s * 1e3).toFixed(2)} a decode row + ${(curve.verify_row_s * 1e3).toFixed(2)} a verify row + ${(curve.prefill_token_s * 1e3).toFixed(3)} a prefill token`);
if (llama.length) {
  console.log("\n| llama.cpp (node-llama-cpp 3.21.1) | streams | tok/s per user | vs none | predictions validated / refuted |");
  console.log("|---|---:|---:|---:|---:|");
  for (const r of llama)
    console.log(`| ${r.config} | 1 | ${r.per_user_tok_s.toFixed(1)} | ${(r.per_user_tok_s / llama[0].per_user_tok_s).toFixed(2)} | ${r.validated} / ${r.refuted} |`);
}
if (o.json) fs.writeFileSync(o.json, JSON.stringify({ options: o, tokenmill: rows, llama, modelled_curve: curve }, null, 2));
