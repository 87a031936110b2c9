#!/usr/bin/env node
// bench/restart: the first requests after a start against the same requests once warm (a
// benchmark, not a test). A new process pays for whatever it did not set up before /health said
// ready (weights not yet resident, first-touch of buffers); this measures what is left.
//
// Two prompts A and B of --prompt 1790 random token ids are prefilled once into a fresh `dir:`
// store. Then, --reps times per binary (several --bin alternate run by run, so a before/after
// pair sees the same machine load), a new `tokenmill serve` on that store is polled until
// /health answers 200, and at once gets, one at a time, each with one token to generate:
//   cold short   an 8-token prompt (nothing cached)
//   cold cached  prompt A (its blocks come from the store: the RAM tier is empty)
// then, in the same process:
//   warm short   another 8-token prompt (nothing cached)
//   warm cached  prompt B (from the store, as A was: the same path, only the process is warm)
// Client wall times per request; the medians and the cold / warm ratios are printed at the end.
// Every measured request follows the same --pause-ms of quiet: the warm requests would
// otherwise come straight after a busy one, on CPUs already out of their idle states, and the
// ratio would count the machine's wake-up against the process.
//
//   node bench/restart.mjs -m MODEL [--bin build/tokenmill[,OTHER]] [--reps 5] [--prompt 1790]
//                          [--kv-mib 512] [--threads 2] [--store DIR] [--pause-ms 200]
import fs from "node:fs";
import http from "node:http";
import os from "node:os";
import path from "node:path";
import { parseArgs } from "./args.mjs";
import { startServe, stopServe, storeRunOptions } from "./server.mjs";

const o = parseArgs("bench/restart", [...storeRunOptions(1790, "tokens of each of the two cached prompts"),
  { name: "--pause-ms", kind: "number", default: 200, help: "quiet before each measured request" }]);
const tmp = o.store ? null : fs.mkdtempSync(path.join(os.tmpdir(), "tm-bench-restart-"));
const store = o.store ?? path.join(tmp, "store");

let seed = 4242;
const rnd = () => { seed = (seed * 1103515245 + 12345) % 2147483648; return seed; };
const ids = (n) => Array.from({ length: n }, () => 10 + (rnd() % 3000));
const promptA = ids(o.prompt), promptB = ids(o.prompt);

const startServer = (bin) => startServe(bin, ["-m", o.model, "--port", "0", "--threads", String(o.threads), "--kv-mib", String(o.kvMib),
  "--ctx", String(o.prompt + 256), "--max-seqs", "1", "--cache-dir", store]);

function request(port, method, p, body) {
  return new Promise((resolve, reject) => {
    const req = http.request({ port, method, path: p, headers: { "content-type": "application/json" } }, (res) => {
      let t = "";
      res.on("data", (d) => (t += d));
      res.on("end", () => resolve({ status: res.statusCode, body: t }));
    });
    req.on("error", reject);
    req.end(body);
  });
}
async function complete(port, prompt) {
  await new Promise((r) => setTimeout(r, o.pauseMs));
  const t0 = performance.now();
  const r = await request(port, "POST", "/v1/completions", JSON.stringify({ prompt, max_tokens: 1, temperature: 0, ignore_eos: true }));
  const ms = performance.now() - t0;
  if (r.status !== 200) throw new Error(`HTTP ${r.status}: ${r.body}`);
  return { ms, cached: JSON.parse(r.body).usage.prompt_tokens_details?.cached_tokens ?? 0 };
}
// /health answers 503 "loading" until the weights are resident; bounded by count, not time
async function waitReady(port) {
  for (let i = 0; i < 6000; i++) {
    if ((await request(port, "GET", "/health")).status === 200) return;
    await new Promise((r) => setTimeout(r, 10));
  }
  throw new Error("bench/restart: /health never answered 200");
}

if (!fs.existsSync(store)) {   // fill the store once with both prompts
  const s = await startServer(o.bins[0]);
  try {
    await waitReady(s.port);
    await complete(s.port, promptA);
    await complete(s.port, promptB);
  } finally { await stopServe(s); }
}
const keys = ["cold_short", "cold_cached", "warm_short", "warm_cached"];
const rows = o.bins.map(() => []);
const r1 = (x) => Math.round(x * 10) / 10;
for (let rep = 0; rep < o.reps; rep++) {
  for (let b = 0; b < o.bins.length; b++) {
    const s = await startServer(o.bins[b]);
    try {
      await waitReady(s.port);
      const short = (k) => [11 + k, 12, 13, 14, 15, 16, 17, 18 + rep];   // under one block: never cached
      const cs = await complete(s.port, short(0)), cc = await complete(s.port, promptA);
      const ws = await complete(s.port, short(1)), wc = await complete(s.port, promptB);
      const row = { cold_short: cs.ms, cold_cached: cc.ms, warm_short: ws.ms, warm_cached: wc.ms };
      rows[b].push(row);
      console.log(`${o.bins[b]} rep ${rep + 1}: short ${r1(cs.ms)} -> ${r1(ws.ms)} ms, cached ${r1(cc.ms)} -> ${r1(wc.ms)} ms ` +
        `(${cc.cached}, ${wc.cached} cached tokens)`);
    } finally {
      await stopServe(s);
    }
  }
}
const med = (a) => { const x = [...a].sort((p, q) => p - q); return x.length % 2 ? x[(x.length - 1) / 2] : (x[x.length / 2 - 1] + x[x.length / 2]) / 2; };
for (let b = 0; b < o.bins.length; b++) {
  const m = Object.fromEntries(keys.map((k) => [k, med(rows[b].map((r) => r[k]))]));
  console.log(`${o.bins[b]}: median of ${o.reps}: short request cold ${r1(m.cold_short)} ms, warm ${r1(m.warm_short)} ms ` +
    `(cold/warm ${(m.cold_short / m.warm_short).toFixed(2)}); cached ${o.prompt}-token request cold ${r1(m.cold_cached)} ms, ` +
    `warm ${r1(m.warm_cached)} ms (cold/warm ${(m.cold_cached / m.warm_cached).toFixed(2)})`);
}
if (tmp) fs.rmSync(tmp, { recursive: true, force: true });
