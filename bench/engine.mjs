#!/usr/bin/env node
// bench/engine: tokenmill vs llama.cpp on the same GGUF files, same thread count.
//
//   bench/engine [--threads N] [--reps R] [--models q8_0,q4_k_m] [--pp 512] [--tg 128]
//                [--seqs 1,4,16] [--only tokenmill|llama] [--quick] [--model-file GGUF] [--wait-quiet S]
//                [--preset qwen3-0.6b|llama3.2-1b|qwen3-30b-a3b|deepseek-v2-lite|gpt-oss-20b|deepseek-v4-flash|
//                          qwen3.5-4b|qwen3.5-35b-a3b|gemma4-31b|gemma4-26b-a4b] [--baseline BIN]
//
// 1. Builds the models with `tokenmill mkmodel` (--preset's shape, by default Qwen3-0.6B;
//    qwen3-30b-a3b, deepseek-v2-lite and gpt-oss-20b: the MoE models' layers, 4 of them (for
//    gpt-oss, --models mxfp4 makes its MXFP4 experts, the rest Q8_0; deepseek-v4-flash: 3 of
//    its 43 layers at real widths, --models mxfp4 as its published files; qwen3.5-4b and
//    qwen3.5-35b-a3b: 4 layers at real widths, three gated delta nets and one full attention;
//    gemma4-31b and gemma4-26b-a4b: 6 of their layers, 5 window and 1 global); random
//    weights, seed 1), cached in bench/out/ under a name made of their arguments (a .args file beside each
//    records the full command; a changed command or mkmodel source rebuilds).
// 2. Measures the machine's memory read bandwidth with bench/membw.c (built here, cc -O2), and
//    again before every tokenmill run: each round's runs are divided by their round's reading.
// 3. For each model, R rounds of: `tokenmill bench --reps 1`, then bench/llama_bench.mjs
//    --reps 1 (node-llama-cpp's prebuilt llama.cpp), alternating so that drift in machine
//    state hits both alike. Each prints {"pp": {"tok_s": [..]}, "tg": .., "batched": [..]}.
//    With --baseline BIN (another build of tokenmill, e.g. of the commit before a change),
//    each round runs it too, just before the current build: the before/after ratio of a
//    change measured side by side, in the same machine state.
// 4. Prints a table of the medians with the ratio tokenmill/llama.cpp per row and decode's
//    share of the memory-bandwidth limit (the median over rounds of bytes read per decode step ×
//    steps/s ÷ that round's read bandwidth; a step reads every weight once, the token embedding table only when it is
//    also the output matrix, and of a MoE model's expert tensors the share of the experts a
//    token uses), and writes everything to bench/out/engine.json. The tg row has one more
//    share: `tokenmill bench --limit` decodes tg tokens again, each step followed by a read of
//    the bytes it reads on the same threads, and reports the median of read time / step time;
//    on a host whose bandwidth moves within seconds, that limit is taken at the step's moment.
import {spawnSync} from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import {fileURLToPath} from 'node:url';
import {benchModel} from './models.mjs';
import {parseArgs} from './args.mjs';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
process.chdir(root);
const outDir = 'bench/out';
fs.mkdirSync(outDir, {recursive: true});

const o = parseArgs('bench/engine', [
  {name: '--threads', alias: ['-t'], kind: 'number', default: os.availableParallelism?.() ?? os.cpus().length, help: 'threads of both engines'},
  {name: '--reps', kind: 'number', default: 3, help: 'rounds (medians shown)'},
  {name: '--models', kind: 'list', default: ['q8_0', 'q4_k_m'], help: 'weight types to build'},
  {name: '--pp', kind: 'number', default: 512, help: 'prompt tokens'},
  {name: '--tg', kind: 'number', default: 128, help: 'generated tokens'},
  {name: '--seqs', arg: 'N,N', default: '1,4,16', help: 'sequences of the batched runs'},
  {name: '--only', choices: ['tokenmill', 'llama'], help: 'one engine only'},
  {name: '--quick', kind: 'flag', sets: {reps: 1, pp: 128, tg: 32}, help: '= --reps 1 --pp 128 --tg 32'},
  {name: '--tokenmill', arg: 'BIN', default: 'build/tokenmill', help: 'the tokenmill build'},
  {name: '--model-file', arg: 'GGUF', help: "an existing GGUF instead of mkmodel's"},
  {name: '--wait-quiet', arg: 'S', kind: 'number', default: 60, help: 'seconds to wait for idle CPUs'},
  {name: '--preset', arg: 'P', default: 'qwen3-0.6b', help: 'the model shape (bench/models.mjs)'},
  {name: '--baseline', arg: 'BIN', help: 'another build of tokenmill, run just before the current one each round'},
]);

const log = (...a) => process.stderr.write(a.join(' ') + '\n');
const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b), n = s.length;
  return n === 0 ? null : n % 2 ? s[(n - 1) / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
};

function run(cmd, args, {env} = {}) {
  const r = spawnSync(cmd, args, {encoding: 'utf8', maxBuffer: 64 << 20, env: {...process.env, ...env}});
  return {ok: r.status === 0, out: r.stdout ?? '', err: (r.stderr ?? '') + (r.error ? String(r.error) : ''),
    status: r.status};
}
const lastJson = (s) => JSON.parse(s.trim().split('\n').filter((l) => l.startsWith('{')).pop());

// ---- models (bench/models.mjs) ----------------------------------------------------------
const buildModel = (type) => benchModel(o.preset, type, {tokenmill: o.tokenmill, log: (l) => log(`bench: ${l}`)});

// Bytes of one ggml block and the number of weights it holds, for the types we write.
const typeSizes = {0: [4, 1], 1: [2, 1], 30: [2, 1], 8: [34, 32], 2: [18, 32], 12: [144, 256], 14: [210, 256],
  10: [84, 256], 11: [110, 256], 13: [176, 256], 3: [20, 32], 6: [22, 32], 7: [24, 32], 39: [17, 32],
  20: [18, 32], 23: [136, 256], 16: [66, 256], 17: [74, 256], 22: [82, 256], 18: [98, 256], 21: [110, 256],
  19: [50, 256], 29: [56, 256], 34: [54, 256], 35: [66, 256]};
async function weightInfo(file) {
  const {readGgufFileInfo} = await import('node-llama-cpp');
  const info = await readGgufFileInfo(file, {readTensorInfo: true});
  let total = 0, perStep = 0;
  const names = new Set(info.fullTensorInfo?.map((t) => t.name) ?? info.tensorInfo.map((t) => t.name));
  // a MoE model: a token reads expert_used_count of the expert_count experts of each layer
  const arch = info.metadata?.general?.architecture, am = info.metadata?.[arch] ?? {};
  const expertShare = am.expert_count ? Number(am.expert_used_count) / Number(am.expert_count) : 1;
  const types = {};
  for (const t of info.fullTensorInfo ?? info.tensorInfo) {
    const n = t.dimensions.reduce((a, b) => a * Number(b), 1);
    const [bs, bn] = typeSizes[t.ggmlType] ?? [4, 1];
    const bytes = n / bn * bs;
    total += bytes;
    types[t.ggmlType] = (types[t.ggmlType] ?? 0) + bytes;
    const embOnly = t.name === 'token_embd.weight' && names.has('output.weight');
    // a hash-routed layer's token -> experts table (deepseek4): one row per token
    const rowOnly = embOnly || /ffn_gate_tid2eid\.weight$/.test(t.name);
    perStep += rowOnly ? bytes / Number(t.dimensions[1]) : /_exps\.weight$/.test(t.name) ? bytes * expertShare : bytes;
  }
  return {weight_bytes: total, bytes_per_decode_step: perStep, bytes_by_ggml_type: types};
}

// ---- bandwidth ----------------------------------------------------------------------------
function memBandwidth() {
  const bin = path.join(outDir, 'membw');
  if (!fs.existsSync(bin) || fs.statSync(bin).mtimeMs < fs.statSync('bench/membw.c').mtimeMs) {
    const r = run(process.env.CC || 'cc', ['-O2', '-march=native', '-pthread', '-o', bin, 'bench/membw.c']);
    if (!r.ok) throw new Error(`cc bench/membw.c failed: ${r.err}`);
  }
  const r = run(bin, [String(o.threads), '1024', '7']);
  if (!r.ok) throw new Error(`membw failed: ${r.err}`);
  return lastJson(r.out);
}

// ---- runs ---------------------------------------------------------------------------------
const common = ['--threads', String(o.threads), '--pp', String(o.pp), '--tg', String(o.tg), '--seqs', o.seqs,
  '--reps', '1'];
function benchTokenmill(file, bin = o.tokenmill) {
  // --limit: the current build's tg again, each step held against a read of its bytes (a
  // --baseline build may predate the option)
  const r = run(bin, ['bench', '-m', file, ...common, ...(bin === o.tokenmill && o.tg > 0 ? ['--limit'] : [])]);
  if (!r.ok) return {error: `tokenmill bench failed (${r.status}): ${r.err.trim().split('\n').slice(-3).join(' | ')}`};
  try { return lastJson(r.out); } catch (e) { return {error: `tokenmill bench printed no JSON: ${r.out.slice(0, 200)}`}; }
}
function benchLlama(file) {
  const r = run(process.execPath, ['bench/llama_bench.mjs', '-m', file, ...common], {env: {UV_THREADPOOL_SIZE: '1'}});
  if (!r.ok) return {error: `llama_bench failed (${r.status}): ${r.err.trim().split('\n').slice(-3).join(' | ')}`};
  return lastJson(r.out);
}

// Flattens one bench JSON into {rowName: tok/s}.
function rowsOf(j) {
  const rows = {};
  if (!j || j.error) return rows;
  if (j.pp?.tok_s?.length) rows[`pp${j.pp.n}`] = j.pp.tok_s;
  if (j.tg?.tok_s?.length) rows[`tg${j.tg.n}`] = j.tg.tok_s;
  for (const b of j.batched ?? []) if (b.tok_s?.length) rows[`batched x${b.seqs}`] = b.tok_s;
  return rows;
}

// Other processes on the machine wreck both engines' numbers (llama.cpp's spinning barriers
// most: with 2 threads on 2 busy cores its decode drops 10-20x). Before each run, measure how
// busy the CPUs are over 1 s (/proc/stat) and wait, up to --wait-quiet seconds, for them to
// be idle; the busy fraction seen is recorded with every run and flagged in the table.
const sleepMs = (ms) => Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, ms);
function cpuBusy() {
  const read = () => fs.readFileSync('/proc/stat', 'utf8').split('\n')[0].trim().split(/\s+/).slice(1).map(Number);
  const a = read();
  sleepMs(1000);
  const b = read();
  const d = b.map((x, i) => x - a[i]);
  const total = d.reduce((x, y) => x + y, 0), idle = d[3] + (d[4] ?? 0);
  return total > 0 ? 1 - idle / total : 0;
}
function waitQuiet() {
  const until = Date.now() + o.waitQuiet * 1000;
  let busy = cpuBusy();
  while (busy > 0.15 && Date.now() < until) {
    log(`bench: CPUs ${(100 * busy).toFixed(0)} % busy with other work, waiting`);
    sleepMs(4000);
    busy = cpuBusy();
  }
  return busy;
}

// The bandwidth limit is read again before every tokenmill run: on a shared host it moves by
// 2x within minutes, with the engines' speeds. A run's share divides by the reading of its own
// round (llama.cpp's by the reading before the tokenmill run it follows) and the share columns
// are the medians of those; the readings' median and range go into the caption and the JSON.
const t0 = Date.now();
waitQuiet();
const bw = memBandwidth();
const bwReads = [bw.read_gb_s];
log(`bench: memory read bandwidth ${bw.read_gb_s.toFixed(1)} GB/s with ${o.threads} threads`);
const haveTokenmill = fs.existsSync(o.tokenmill);
const report = {date: new Date().toISOString(), host: {cpus: os.cpus()[0]?.model, n_cpus: os.cpus().length},
  threads: o.threads, reps: o.reps, membw: bw, membw_reads_gb_s: bwReads, baseline: o.baseline ?? null, models: []};

for (const type of o.models) {
  let file;
  try { file = o.modelFile ?? buildModel(type); } catch (e) {
    log(`bench: cannot build ${type} model: ${e.message}`);
    report.models.push({type, error: e.message});
    continue;
  }
  const wi = await weightInfo(file);
  const m = {type, file, ...wi, tokenmill: [], llama: [], baseline: []};
  for (let r = 0; r < o.reps; r++) {
    if (o.baseline && o.only !== 'llama') {
      const busy = waitQuiet();
      const j = benchTokenmill(file, o.baseline);
      j.busy_before = busy;
      m.baseline.push(j);
      if (j.error) log(`bench: baseline: ${j.error}`);
    }
    if (o.only !== 'llama' && haveTokenmill) {
      let busy = waitQuiet();
      bwReads.push(memBandwidth().read_gb_s);
      busy = waitQuiet();
      const j = benchTokenmill(file);
      j.busy_before = busy;
      j.membw_gb_s = bwReads.at(-1);
      m.tokenmill.push(j);
      if (j.error) log(`bench: ${j.error}`);
    }
    if (o.only !== 'tokenmill') {
      const busy = waitQuiet();
      const j = benchLlama(file);
      j.busy_before = busy;
      j.membw_gb_s = bwReads.at(-1);
      m.llama.push(j);
    }
    log(`bench: ${type} round ${r + 1}/${o.reps} done (${((Date.now() - t0) / 1000).toFixed(0)} s)`);
  }
  // Medians per row over all rounds.
  const collect = (runs) => {
    const acc = {};
    for (const j of runs) for (const [k, v] of Object.entries(rowsOf(j))) (acc[k] ??= []).push(...v);
    return acc;
  };
  const tm = collect(m.tokenmill), ll = collect(m.llama), bl = collect(m.baseline);
  const names = [...new Set([...Object.keys(ll), ...Object.keys(tm)])];
  m.rows = names.map((name) => {
    const tms = median(tm[name] ?? []), lls = median(ll[name] ?? []);
    const seqs = name.startsWith('batched x') ? parseInt(name.slice(9), 10) : name.startsWith('tg') ? 1 : 0;
    // each run's decode rate over its own round's reading, then the median
    const share = (runs) => {
      const xs = [];
      for (const j of runs)
        for (const tps of rowsOf(j)[name] ?? [])
          if (seqs && tps) xs.push(wi.bytes_per_decode_step * (tps / seqs) / (j.membw_gb_s * 1e9));
      return xs.length ? median(xs) : null;
    };
    const bls = median(bl[name] ?? []);
    // tg: the median over rounds of each round's median share of the read after each step
    const lim = name.startsWith('tg') ? m.tokenmill.map((j) => j.tg_limit?.share?.[1]).filter((x) => x > 0) : [];
    return {name, tokenmill_tok_s: tms, llama_tok_s: lls, ratio: tms && lls ? tms / lls : null,
      tokenmill_bw_share: share(m.tokenmill), llama_bw_share: share(m.llama),
      tokenmill_limit_share: lim.length ? median(lim) : null,
      ...(o.baseline ? {baseline_tok_s: bls, vs_baseline: tms && bls ? tms / bls : null} : {})};
  });
  report.models.push(m);
}

// ---- table --------------------------------------------------------------------------------
const f1 = (x) => (x == null ? '—' : x.toFixed(1));
const f2 = (x) => (x == null ? '—' : x.toFixed(2));
const pc = (x) => (x == null ? '' : `${(100 * x).toFixed(0)} %`);
const typeName = {q8_0: 'Q8_0', q4_k_m: 'Q4_K_M', q4_k: 'Q4_K', q5_k_m: 'Q5_K_M', q5_k: 'Q5_K', f16: 'F16', f32: 'F32',
  q3_k_m: 'Q3_K_M', q2_k: 'Q2_K', iq4_xs: 'IQ4_XS'};
const lines = [];
lines.push(`${o.modelFile ? path.basename(o.modelFile) : `${o.preset}-shaped random-weight models (tokenmill mkmodel)`}, ${o.threads} threads, median of ${o.reps} ` +
  `alternating runs; memory read bandwidth ${median(bwReads).toFixed(1)} GB/s (bench/membw.c, median of ` +
  `${bwReads.length} readings, ${Math.min(...bwReads).toFixed(1)}-${Math.max(...bwReads).toFixed(1)}).`);
lines.push('');
const bcol = o.baseline ? ' baseline tok/s | tokenmill / baseline |' : '';
lines.push(`| model | test | tokenmill tok/s | llama.cpp tok/s | tokenmill / llama.cpp | decode share of BW limit: tokenmill | llama.cpp | tokenmill, of a read beside each step |${bcol}`);
lines.push('|---|---|---:|---:|---:|---:|---:|---:|' + (o.baseline ? '---:|---:|' : ''));
for (const m of report.models) {
  const label = `${typeName[m.type] ?? m.type}` + (m.weight_bytes ? ` (${(m.weight_bytes / 1e6).toFixed(0)} MB)` : '');
  if (m.error) { lines.push(`| ${label} | (no model: ${m.error.slice(0, 80)}) | | | | | | |`); continue; }
  for (const r of m.rows)
    lines.push(`| ${label} | ${r.name} | ${f1(r.tokenmill_tok_s)} | ${f1(r.llama_tok_s)} | ${f2(r.ratio)} | ` +
      `${pc(r.tokenmill_bw_share)} | ${pc(r.llama_bw_share)} | ${pc(r.tokenmill_limit_share)} |` +
      (o.baseline ? ` ${f1(r.baseline_tok_s)} | ${f2(r.vs_baseline)} |` : ''));
}
const busiest = Math.max(0, ...report.models.flatMap((m) => [...(m.tokenmill ?? []), ...(m.llama ?? []), ...(m.baseline ?? [])].map((j) => j.busy_before ?? 0)));
report.busiest_before_run = busiest;
if (busiest > 0.15) lines.push('', `(machine busy: up to ${(100 * busiest).toFixed(0)} % CPU used by other processes just before a run; numbers unreliable)`);
const tmErr = report.models.flatMap((m) => (m.tokenmill ?? []).filter((j) => j.error).map((j) => j.error));
if (!haveTokenmill) lines.push('', `(${o.tokenmill} not built: llama.cpp side only)`);
else if (tmErr.length) lines.push('', `(tokenmill bench failed: ${tmErr[0]})`);
report.table = lines.join('\n');
report.wall_s = (Date.now() - t0) / 1000;
fs.writeFileSync(path.join(outDir, 'engine.json'), JSON.stringify(report, null, 1) + '\n');
process.stdout.write(report.table + '\n');
log(`bench: wrote ${outDir}/engine.json (${report.wall_s.toFixed(0)} s)`);
