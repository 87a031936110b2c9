#!/usr/bin/env node
// bench/gap: the CPU gap between engine steps (the kernels' idle time: sampling, handing over
// or publishing the outputs, planning the next step) against the step time, with the step
// loop overlapped and with --no-overlap, side by side in one run, alternating.
//
//   node bench/gap.mjs [-m MODEL] [--clients 16] [--tokens 128] [--reps 3] [--threads N]
//                      [--logprobs K] [--bin A,B] [--args "EXTRA SERVE ARGS"]
//
// One run: `tokenmill serve` (--cache off, --max-seqs = clients), that many clients at once,
// each a streaming /v1/completions of --tokens tokens (greedy, EOS ignored) after a 32-token
// prompt (--logprobs K: with the log-probs of each token and K alternatives); then /metrics: tokenmill_cpu_gap_seconds_total and its parts (sampling, planning,
// publishing; every part with tokenmill_cpu_gap_part_seconds_total, which sum to the gap) as a
// percentage of tokenmill_engine_step_seconds_total; "step + gap" is the time per step the
// streams see, the figure to compare between builds. Per configuration the
// table shows the median over the reps [range]. --bin A,B compares two builds instead (the
// first with overlap, e.g. an older build/tokenmill; builds without the parts' series show
// "-"). Without -m a small random qwen3 model is generated under tests/data/gen/ (the one
// bench/serve uses).
import { spawn, execFileSync } from "node:child_process";
import fs from "node:fs";
import http from "node:http";
import path from "node:path";
import { parseArgs } from "./args.mjs";

const root = path.resolve(import.meta.dirname, "..");
const o = parseArgs("bench/gap", [
  { name: "-m", key: "model", arg: "MODEL", help: "the GGUF file (default: bench/serve's small random qwen3 under tests/data/gen/)" },
  { name: "--clients", kind: "number", default: 16, help: "concurrent streams (and --max-seqs)" },
  { name: "--tokens", kind: "number", default: 128, help: "tokens of each stream" },
  { name: "--reps", kind: "number", default: 3, help: "runs of each configuration (medians shown)" },
  { name: "--threads", kind: "number", default: 0, help: "the server's --threads (0: its default)" },
  { name: "--logprobs", arg: "K", kind: "number", default: -1, help: "each token's log-probs and K alternatives (-1: none)" },
  { name: "--bin", key: "bins", kind: "list", arg: "A,B", help: "compare these builds instead of overlap and --no-overlap" },
  { name: "--args", arg: '"EXTRA SERVE ARGS"', default: "", help: "more serve options, space-separated" },
]);
const bin = path.join(root, "build/tokenmill");
if (!o.model) {
  o.model = path.join(root, "tests/data/gen/bench-serve-qwen3-small-q8_0.gguf");
  if (!fs.existsSync(o.model)) {
    fs.mkdirSync(path.dirname(o.model), { recursive: true });
    execFileSync(bin, ["mkmodel", "--arch", "qwen3", "--preset", "small", "--type", "q8_0", "--seed", "1", "-o", o.model], { stdio: "inherit" });
  }
}
const extra = o.args.split(" ").filter(Boolean);
const configs = o.bins
  ? o.bins.map((b) => ({ name: b, bin: b, args: extra }))
  : [{ name: "overlap", bin, args: extra }, { name: "--no-overlap", bin, args: [...extra, "--no-overlap"] }];

const get = (port, p) => new Promise((res, rej) => http.get({ host: "127.0.0.1", port, path: p }, (s) => {
  let t = ""; s.on("data", (d) => t += d); s.on("end", () => res({ status: s.statusCode, body: t }));
}).on("error", rej));
const complete = (port, body) => new Promise((res, rej) => {
  const r = http.request({ host: "127.0.0.1", port, path: "/v1/completions", method: "POST",
    headers: { "content-type": "application/json" } }, (s) => { s.resume(); s.on("end", res); });
  r.on("error", rej);
  r.end(JSON.stringify(body));
});

// the gap's parts (tokenmill_cpu_gap_part_seconds_total), in the order they happen
const parts = ["commit", "sample", "draft", "lock", "publish", "handoff", "plan", "launch"];

async function run(cfg, rep) {
  const port = 19000 + Math.floor(Math.random() * 2000);
  const args = ["serve", "-m", o.model, "--port", String(port), "--cache", "off", "--max-seqs", String(o.clients),
    ...(o.threads ? ["--threads", String(o.threads)] : []), ...cfg.args];
  const srv = spawn(cfg.bin, args, { stdio: ["ignore", "ignore", "inherit"] });
  try {
    for (let i = 0; ; i++) {
      try { if ((await get(port, "/health")).status === 200) break; } catch { /* not yet */ }
      if (i > 600) throw new Error("the server did not start");
      await new Promise((r) => setTimeout(r, 100));
    }
    const prompt = (c) => Array.from({ length: 32 }, (_, j) => 10 + ((rep * 101 + c * 37 + j * 11) % 900));
    await Promise.all(Array.from({ length: o.clients }, (_, c) =>
      complete(port, { prompt: prompt(c), max_tokens: o.tokens, temperature: 0, ignore_eos: true, stream: true,
        ...(o.logprobs >= 0 ? { logprobs: o.logprobs } : {}) })));
    const m = (await get(port, "/metrics")).body;
    const g = (n) => { const x = m.match(new RegExp(`^tokenmill_${n} (\\S+)$`, "m")); return x ? Number(x[1]) : NaN; };
    const step = g("engine_step_seconds_total"), steps = g("engine_steps_total");
    const gap = g("cpu_gap_seconds_total");
    const r = { stepMs: step / steps * 1e3, cycleMs: (step + gap) / steps * 1e3, gap: gap / step * 100,
      sampling: g("sampling_seconds_total") / step * 100, planning: g("planning_seconds_total") / step * 100,
      publishing: g("publishing_seconds_total") / step * 100 };
    for (const p of parts) {
      const x = m.match(new RegExp(`^tokenmill_cpu_gap_part_seconds_total\\{part="${p}"\\} (\\S+)$`, "m"));
      r[p] = x ? Number(x[1]) / step * 100 : NaN;
    }
    return r;
  } finally {
    srv.kill("SIGINT");
    await new Promise((r) => srv.on("exit", r));
  }
}

const res = configs.map(() => []);
for (let rep = 0; rep < o.reps; rep++) {
  const order = rep % 2 ? [...configs.keys()].reverse() : [...configs.keys()];
  for (const i of order) res[i].push(await run(configs[i], rep));
}
const med = (a) => { const s = [...a].sort((x, y) => x - y); return s[s.length >> 1]; };
const fmt = (rs, k, d = 1) => rs.some((r) => Number.isNaN(r[k])) ? "-" :
  `${med(rs.map((r) => r[k])).toFixed(d)} [${Math.min(...rs.map((r) => r[k])).toFixed(d)}-${Math.max(...rs.map((r) => r[k])).toFixed(d)}]`;
console.log(`${path.basename(o.model)}, ${o.clients} clients x ${o.tokens} tokens${o.logprobs >= 0 ? `, logprobs ${o.logprobs}` : ""}, ` +
  `${o.reps} reps; % of step time`);
console.log("| configuration | step ms | step + gap ms | gap % | sampling % | planning % | publishing % |");
console.log("|---|---|---|---|---|---|---|");
configs.forEach((c, i) => console.log(`| ${c.name} | ${fmt(res[i], "stepMs", 2)} | ${fmt(res[i], "cycleMs", 2)} | ${fmt(res[i], "gap")} | ` +
  `${fmt(res[i], "sampling")} | ${fmt(res[i], "planning", 2)} | ${fmt(res[i], "publishing")} |`));
if (res.some((rs) => rs.some((r) => !Number.isNaN(r.commit)))) {   // builds that measure every part
  console.log(`\nThe gap's parts, % of step time (they sum to the gap):\n`);
  console.log(`| configuration | ${parts.join(" | ")} |`);
  console.log(`|---|${parts.map(() => "---|").join("")}`);
  configs.forEach((c, i) => console.log(`| ${c.name} | ${parts.map((p) => fmt(res[i], p, 2)).join(" | ")} |`));
}
