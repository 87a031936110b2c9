#!/usr/bin/env node
// bench/chaos: a cluster under steady streaming load while its workers are killed, stopped and
// restarted at random, and what the clients got. One `tokenmill gateway` (--register) and
// --prefill + --decode `tokenmill worker` processes (registering with it, sharing a fresh dir:
// block store and a fresh cluster key) serve --streams client loops that each send one greedy
// streaming /v1/completions after another, cycling over --prompts prompts. Every --every
// seconds on average (exponential gaps) one worker is picked at random and, at random:
//   kill   SIGKILL, restarted 1-3 s later;
//   stop   SIGSTOP for 0.5-5 s (past the gateway's heartbeat timeout or not), then SIGCONT;
//   drain  SIGTERM (it drains: finishes or hands back its requests), restarted once it exited.
// At least one worker of each role is left alone (the others may all be down), so that every
// request can be served: what is measured is whether a disturbance loses or changes a stream.
// After --minutes the chaos stops, the streams in flight finish, and the figures are printed:
//   sent       requests sent
//   completed  streams that ended with a finish reason and [DONE]
//   identical  of those, the same text as `tokenmill serve` gives (greedy, same prompt)
//   different  completed with another text
//   failed     an HTTP error or an error event (a clear refusal: the client knows)
//   lost       a stream that ended without a finish reason / [DONE], or hung past --hang
// Target: 0 lost, 0 different. The exit status is 1 otherwise.
//
//   bench/chaos [-m MODEL] [--minutes 3] [--prefill 2] [--decode 2] [--streams 8] [--prompts 24]
//               [--max-tokens 64] [--every 3] [--seed 1] [--hang 120] [--json OUT.json] [-v]
//
// Without -m: models/stories260K.gguf (f32: greedy results are reproducible). The reference
// texts come from one `tokenmill serve` on the same model, asked the same prompts first.
import { spawn } from "node:child_process";
import fs from "node:fs";
import http from "node:http";
import os from "node:os";
import path from "node:path";
import { parseArgs } from "./args.mjs";
import { onSseJson } from "./sse.mjs";

const root = path.resolve(import.meta.dirname, "..");
const bin = process.env.TM_BIN || path.join(root, "build/tokenmill");
const o = parseArgs("bench/chaos", [
  { name: "-m", key: "model", arg: "MODEL", default: path.join(root, "models/stories260K.gguf"), help: "the GGUF file" },
  { name: "--minutes", kind: "number", default: 3, help: "minutes of chaos" },
  { name: "--prefill", kind: "number", default: 2, help: "prefill workers" },
  { name: "--decode", kind: "number", default: 2, help: "decode workers" },
  { name: "--streams", kind: "number", default: 8, help: "client loops" },
  { name: "--prompts", kind: "number", default: 24, help: "prompts the loops cycle over" },
  { name: "--max-tokens", kind: "number", default: 64, help: "tokens per completion" },
  { name: "--every", kind: "number", default: 3, help: "mean seconds between disturbances" },
  { name: "--seed", kind: "number", default: 1, help: "seed of the disturbances" },
  { name: "--hang", kind: "number", default: 120, help: "seconds after which a silent stream counts as lost" },
  { name: "--json", arg: "OUT.json", help: "write the figures there too" },
  { name: "-v", key: "verbose", kind: "flag", default: false, help: "log the disturbances and the processes' warnings" },
]);
for (const k of ["minutes", "prefill", "decode", "streams", "prompts", "maxTokens", "every", "hang"])
  if (!(o[k] > 0)) { console.error(`bench/chaos: --${k} must be a positive number`); process.exit(2); }

// a small deterministic generator, so that a run can be repeated with --seed
let rs = o.seed >>> 0 || 1;
const rnd = () => { rs ^= rs << 13; rs >>>= 0; rs ^= rs >>> 17; rs ^= rs << 5; rs >>>= 0; return rs / 4294967296; };
const pick = (a) => a[Math.floor(rnd() * a.length)];
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const log = (...a) => { if (o.verbose) console.error(`[${new Date().toISOString().slice(11, 19)}]`, ...a); };

const ANIMALS = ["cat", "dog", "bird", "fish", "fox", "owl"];
const NAMES = ["Tim", "Sue", "Max", "Lily"];
const PROMPTS = Array.from({ length: o.prompts }, (_, i) =>
  `Once upon a time there was a little ${ANIMALS[i % 6]} named ${NAMES[(i >> 1) % 4]} who ${i & 4 ? "liked" : "did not like"} ${i}`);

// ---- processes ----
const dir = fs.mkdtempSync(path.join(os.tmpdir(), "tm-chaos-"));
const env = { ...process.env, XDG_CACHE_HOME: path.join(dir, "home") };   // its own cluster key
const procs = new Set();
const killAll = () => { for (const p of procs) if (p.exitCode === null && p.signalCode === null) try { p.kill("SIGCONT"); p.kill("SIGKILL"); } catch {} };
process.on("exit", () => { killAll(); fs.rmSync(dir, { recursive: true, force: true }); });
process.on("SIGINT", () => process.exit(130));

function start(args, re, what) {
  const p = spawn(bin, args, { stdio: ["ignore", "ignore", "pipe"], env });
  procs.add(p);
  p.on("exit", () => procs.delete(p));
  let text = "";
  return new Promise((resolve, reject) => {
    const t = setTimeout(() => reject(new Error(`${what} did not start: ${text}`)), 60000);
    p.stderr.on("data", (d) => {
      text += d;
      if (o.verbose && /warn|error/.test(String(d))) process.stderr.write(`  [${what}] ${d}`);
      const m = re(text);
      if (m && t) { clearTimeout(t); resolve({ proc: p, m }); }
    });
    p.on("exit", (c, s) => { clearTimeout(t); reject(new Error(`${what} exited ${c ?? s}: ${text}`)); });
  });
}

// ---- HTTP ----
const agent = new http.Agent({ keepAlive: true, maxSockets: 256 });
function getJson(url, p) {
  return new Promise((res, rej) => {
    http.get(url + p, { agent }, (r) => { let b = ""; r.on("data", (d) => (b += d)); r.on("end", () => { try { res(JSON.parse(b)); } catch (e) { rej(e); } }); }).on("error", rej);
  });
}

// One greedy streaming completion: { text, finish, done, status, error }; never rejects.
function complete(url, prompt) {
  return new Promise((resolve) => {
    const r = { text: "", finish: null, done: false, status: 0, error: null };
    const body = JSON.stringify({ prompt, max_tokens: o.maxTokens, temperature: 0, stream: true });
    const req = http.request(url + "/v1/completions", { method: "POST", agent, headers: { "content-type": "application/json" } }, (res) => {
      r.status = res.statusCode;
      if (res.statusCode !== 200) {
        let b = "";
        res.on("data", (d) => (b += d));
        res.on("end", () => { r.error = `HTTP ${res.statusCode}: ${b.slice(0, 200)}`; resolve(r); });
        return;
      }
      onSseJson(res, (j) => {
        if (j.error) r.error = JSON.stringify(j.error);
        for (const c of j.choices || []) {
          r.text += c.text || "";
          if (c.finish_reason) r.finish = c.finish_reason;
        }
      }, () => { r.done = true; });
      res.on("end", () => resolve(r));
      res.on("error", (e) => { r.cut = String(e); resolve(r); });
    });
    req.setTimeout(o.hang * 1000, () => { r.hung = true; req.destroy(); });
    req.on("error", (e) => { r.cut = String(e); resolve(r); });
    req.end(body);
  });
}

// ---- the run ----
async function reference() {
  const s = await start(["serve", "-m", o.model, "--port", "0", "--threads", "1", "--cache", "off"],
    (t) => /listening on http:\/\/[^:]+:(\d+)/.exec(t), "serve");
  const url = `http://127.0.0.1:${s.m[1]}`;
  const ref = [];
  for (let i = 0; i < PROMPTS.length; i += 4)
    ref.push(...await Promise.all(PROMPTS.slice(i, i + 4).map((p) => complete(url, p))));
  s.proc.kill("SIGTERM");
  await new Promise((r) => (s.proc.exitCode !== null ? r() : s.proc.on("exit", r)));
  for (const [i, r] of ref.entries())
    if (!r.done || !r.finish) throw new Error(`serve: prompt ${i} did not complete: ${JSON.stringify(r)}`);
  return ref.map((r) => r.text);
}

const workers = [];   // { name, role, proc, state: up|down|stopped|draining }
let regPort;
const cache = () => ["--cache", `dir:${path.join(dir, "store")}`];

async function startWorker(w) {
  const s = await start(["worker", "--role", w.role, "-m", o.model, "--listen", "127.0.0.1:0", "--gateway", `127.0.0.1:${regPort}`,
    ...cache(), "--threads", "1", "--name", w.name, "--drain-timeout", "2"],
  (t) => /registered with the gateway/.test(t) && /listening on port (\d+)/.exec(t), `worker ${w.name}`);
  w.proc = s.proc;
  w.state = "up";
  const p = s.proc;
  p.on("exit", () => { if (w.proc === p) w.state = "down"; });
}

const count = { kill: 0, stop: 0, drain: 0, restarts: 0 };

async function restartLater(w, ms) {
  await sleep(ms);
  try {
    await startWorker(w);
    count.restarts++;
    log(`${w.name} restarted`);
  } catch (e) {
    log(`${w.name}: restart failed: ${e.message}`);
  }
}

async function disturb() {
  // leave one worker of each role alone: the last one up of its role is never picked
  const cand = workers.filter((w) => w.state === "up" && workers.some((x) => x !== w && x.role === w.role && x.state === "up"));
  if (!cand.length) return;
  const w = pick(cand), what = pick(["kill", "stop", "drain"]);
  count[what]++;
  log(`${what} ${w.name}`);
  const p = w.proc;
  if (what === "kill") {
    w.state = "down";
    p.kill("SIGKILL");
    restartLater(w, 1000 + rnd() * 2000);
  } else if (what === "stop") {
    w.state = "stopped";
    p.kill("SIGSTOP");
    const ms = 500 + rnd() * 4500;
    setTimeout(() => { if (w.proc === p) { p.kill("SIGCONT"); w.state = "up"; log(`cont ${w.name}`); } }, ms);
  } else {
    w.state = "draining";
    p.kill("SIGTERM");
    p.on("exit", () => { if (w.proc === p) restartLater(w, 200); });
  }
}

async function main() {
  if (!fs.existsSync(bin)) throw new Error(`${bin} is missing: run make`);
  console.error(`bench/chaos: reference texts from tokenmill serve (${PROMPTS.length} prompts, ${o.maxTokens} tokens)`);
  const ref = await reference();
  const g = await start(["gateway", "-m", o.model, "--listen", "127.0.0.1:0", "--register", "127.0.0.1:0", ...cache(),
    "--wait-timeout", "60"], (t) => /register at [^:\s]+:(\d+)[\s\S]*listening on http:\/\/[^:]+:(\d+)/.exec(t), "gateway");
  regPort = Number(g.m[1]);
  const url = `http://127.0.0.1:${g.m[2]}`;
  for (let i = 0; i < o.prefill; i++) workers.push({ name: `p${i}`, role: "prefill" });
  for (let i = 0; i < o.decode; i++) workers.push({ name: `d${i}`, role: "decode" });
  await Promise.all(workers.map(startWorker));
  for (const t = Date.now(); (await getJson(url, "/admin/workers")).workers.filter((w) => w.up).length < workers.length; await sleep(50))
    if (Date.now() - t > 30000) throw new Error("workers did not come up");

  const st = { sent: 0, completed: 0, identical: 0, different: 0, failed: 0, lost: 0 };
  const examples = [];
  const t0 = Date.now(), end = t0 + o.minutes * 60000;
  let stop = false;
  const loops = Array.from({ length: o.streams }, async (_, k) => {
    for (let n = 0; !stop; n++) {
      const i = (k * 7 + n) % PROMPTS.length;
      st.sent++;
      const r = await complete(url, PROMPTS[i]);
      if (r.error) { st.failed++; if (examples.length < 5) examples.push(`failed: prompt ${i}: ${r.error}`); }
      else if (!r.done || !r.finish) { st.lost++; if (examples.length < 5) examples.push(`lost: prompt ${i}: ${JSON.stringify(r)}`); }
      else {
        st.completed++;
        if (r.text === ref[i]) st.identical++;
        else { st.different++; if (examples.length < 5) examples.push(`different: prompt ${i}: ${JSON.stringify(r.text)} vs ${JSON.stringify(ref[i])}`); }
      }
    }
  });
  const progress = setInterval(() => console.error(`  ${((Date.now() - t0) / 60000).toFixed(1)} min: sent ${st.sent}, completed ${st.completed}, ` +
    `different ${st.different}, failed ${st.failed}, lost ${st.lost}; ${count.kill} kills, ${count.stop} stops, ${count.drain} drains`), 30000);
  while (Date.now() < end) {
    await sleep(Math.min(end - Date.now(), -Math.log(1 - rnd()) * o.every * 1000));
    if (Date.now() < end) await disturb();
  }
  stop = true;
  for (const w of workers) if (w.state === "stopped") { w.proc.kill("SIGCONT"); w.state = "up"; }
  await Promise.all(loops);
  clearInterval(progress);
  const a = await getJson(url, "/admin/workers");
  const minutes = (Date.now() - t0) / 60000;
  console.log(`chaos: ${minutes.toFixed(1)} min, gateway + ${o.prefill} prefill + ${o.decode} decode workers, ${o.streams} streams, ` +
    `${o.maxTokens} tokens each; ${count.kill} kills, ${count.stop} stops, ${count.drain} drains, ${count.restarts} restarts`);
  console.log(`gateway: ${a.resumes} resumes, ${a.reprefills} re-prefills, ${a.stalls ?? 0} stalls`);
  console.log(`requests sent ${st.sent}, completed ${st.completed} (identical to serve ${st.identical}, different ${st.different}), ` +
    `failed ${st.failed}, lost ${st.lost}`);
  for (const e of examples) console.log(`  ${e}`);
  if (o.json) fs.writeFileSync(o.json, JSON.stringify({ options: o, minutes, disturbances: count, gateway: { resumes: a.resumes, reprefills: a.reprefills, stalls: a.stalls }, ...st }, null, 2));
  return st.lost === 0 && st.different === 0 ? 0 : 1;
}

main().then((rc) => process.exit(rc), (e) => { console.error(`bench/chaos: ${e.stack || e}`); process.exit(1); });
