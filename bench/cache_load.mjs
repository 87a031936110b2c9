#!/usr/bin/env node
// bench/cache_load: where a request's time goes when its prefix comes from the block store
// after a restart (a benchmark, not a test). One prompt of --prompt 1750 random token ids is
// prefilled once into a fresh `dir:` store; then, --reps times, a new `tokenmill serve` process
// on that store (RAM tier empty) gets a short warm-up request and the prompt again, alone, with
// one token to generate. Per run, from the server's /metrics (deltas over the timed request):
//   srv TTFT   submit to first token (tokenmill_time_to_first_token_seconds)
//   load wait  the request's wait for its store load before admission
//              (tokenmill_cache_load_wait_seconds): reading + verifying its blocks
//   read       seconds the I/O threads spent reading + verifying, summed over the threads
//   fill wait  seconds engine steps waited for loaded blocks' layers to reach the KV pool
// and the cached tokens reported. Several binaries (--bin A,B,...) alternate run by run, so a
// before/after pair sees the same machine load; medians are printed at the end. With --nocache
// the servers run with --cache off and the prompt's first token changes every run (no hit):
// the no-cache TTFT of the same prompt.
//
//   node bench/cache_load.mjs -m MODEL [--bin build/tokenmill[,OTHER]] [--reps 5] [--prompt 1750]
//                             [--kv-mib 512] [--threads 2] [--store DIR] [--nocache]
// On the Qwen3-0.6B shape (build/tokenmill mkmodel --arch qwen3 --preset qwen3-0.6b --type q8_0
// --seed 1 -o MODEL) a 1,750-token prompt loads 13 blocks of 14.7 MB (1,664 tokens).
import fs from "node:fs";
import http from "node:http";
import os from "node:os";
import path from "node:path";
import { parseArgs } from "./args.mjs";
import { serverMetrics, startServe, stopServe, storeRunOptions } from "./server.mjs";

const o = parseArgs("bench/cache_load", [...storeRunOptions(1750, "tokens of the prompt"),
  { name: "--nocache", kind: "flag", default: false, help: "--cache off and a new first token every run: the uncached TTFT" },
]);
const tmp = o.store ? null : fs.mkdtempSync(path.join(os.tmpdir(), "tm-bench-load-"));
const store = o.store ?? path.join(tmp, "store");

let seed = 777;
const rnd = () => { seed = (seed * 1103515245 + 12345) % 2147483648; return seed; };
const prompt = Array.from({ length: o.prompt }, () => 10 + (rnd() % 3000));

const startServer = (bin) => startServe(bin, ["-m", o.model, "--port", "0", "--threads", String(o.threads), "--kv-mib", String(o.kvMib),
  "--ctx", String(o.prompt + 256), "--max-seqs", "1", ...(o.nocache ? ["--cache", "off"] : ["--cache-dir", store])]);
const stopServer = stopServe;
function complete(port, ids, max) {
  return new Promise((resolve, reject) => {
    const body = JSON.stringify({ prompt: ids, max_tokens: max, temperature: 0, ignore_eos: true });
    const req = http.request({ port, method: "POST", path: "/v1/completions", headers: { "content-type": "application/json" } }, (res) => {
      let t = "";
      res.on("data", (d) => (t += d));
      res.on("end", () => (res.statusCode === 200 ? resolve(JSON.parse(t)) : reject(new Error(`HTTP ${res.statusCode}: ${t}`))));
    });
    req.on("error", reject);
    req.end(body);
  });
}
const metrics = serverMetrics;

if (!o.nocache && !fs.existsSync(store)) {   // fill the store once
  const s = await startServer(o.bins[0]);
  try { await complete(s.port, prompt, 2); } finally { await stopServer(s); }
}
const rows = o.bins.map(() => []);
const r1 = (x) => Math.round(x * 10) / 10;
for (let rep = 0; rep < o.reps; rep++) {
  for (let b = 0; b < o.bins.length; b++) {
    const s = await startServer(o.bins[b]);
    try {
      await complete(s.port, [11, 12, 13, 14, 15, 16, 17, 18], 2);   // warm-up (no full block)
      const m0 = await metrics(s.port);
      const ids = o.nocache ? [3000 + rep * o.bins.length + b, ...prompt.slice(1)] : prompt;
      const out = await complete(s.port, ids, 1);
      const m1 = await metrics(s.port);
      const d = (k) => (m1[k] ?? 0) - (m0[k] ?? 0);
      const row = { ttft_ms: 1000 * d("tokenmill_time_to_first_token_seconds_sum"), load_wait_ms: 1000 * d("tokenmill_cache_load_wait_seconds_sum"),
        read_ms: 1000 * d("tokenmill_store_load_seconds_total"), fill_wait_ms: 1000 * d("tokenmill_store_fill_wait_seconds_total"),
        cached: out.usage.prompt_tokens_details?.cached_tokens ?? 0, blocks: d("tokenmill_store_blocks_loaded_total") };
      rows[b].push(row);
      console.log(`${o.bins[b]} rep ${rep + 1}: srv TTFT ${r1(row.ttft_ms)} ms, load wait ${r1(row.load_wait_ms)} ms, read ${r1(row.read_ms)} ms, ` +
        `fill wait ${r1(row.fill_wait_ms)} ms, ${row.cached} cached tokens, ${row.blocks} blocks read`);
    } finally {
      await stopServer(s);
    }
  }
}
const med = (a) => { const x = [...a].sort((p, q) => p - q); return x.length % 2 ? x[(x.length - 1) / 2] : (x[x.length / 2 - 1] + x[x.length / 2]) / 2; };
for (let b = 0; b < o.bins.length; b++) {
  const col = (k) => r1(med(rows[b].map((r) => r[k])));
  console.log(`${o.bins[b]}: median of ${o.reps}: srv TTFT ${col("ttft_ms")} ms, load wait ${col("load_wait_ms")} ms, read ${col("read_ms")} ms, fill wait ${col("fill_wait_ms")} ms`);
}
if (tmp) fs.rmSync(tmp, { recursive: true, force: true });
