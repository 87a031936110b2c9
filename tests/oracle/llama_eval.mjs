#!/usr/bin/env node
// llama.cpp side of the `tokenmill eval` contract: the numeric oracle.
//
//   node tests/oracle/llama_eval.mjs -m MODEL.gguf --input IN.json [--threads N] [--kv f16|f32]
//        [--flash-attn on|off|auto] [--batch-size N]
//
// IN.json: {"seqs": [[id, ...], ...], "top": K, "greedy": G, "batched": true|false}
// stdout:  {"seqs": [{"top": [[[id, logprob] x K best first] for every position i = the
//           distribution after consuming tokens 0..i], "greedy": [G ids],
//           "greedy_top": [[[id, logprob] x K] for every greedy step (the distribution the
//           greedy token was picked from; extra, for near-tie diagnosis)]}, ...],
//           "oracle": {the llama.cpp settings used}}
//
// How: node-llama-cpp@3.21.1's prebuilt CPU library (never built or downloaded here).
// LlamaContextSequence.controlledEvaluate returns, per chosen position, the softmax of the
// raw logits over the whole vocabulary (temperature 0 = greedy sampler, which leaves the
// logits untouched; the addon computes the softmax in float32 with expf). We take log() of
// those float32 probabilities in double: accurate for the top tokens, meaningless near
// underflow, which is why only the top K are compared (a 0 probability is written as null).
//
// Numerics settings (recorded in "oracle"): KV cache F16 by default (llama.cpp's default and
// tokenmill's; --kv f32 for both sides removes that rounding: then an F32 model agrees to ~1e-5),
// flash attention ON by default, which is what llama.cpp's "auto" picks on CPU (measured: auto
// and on give identical output; off differs by ~2e-2 in logprob on stories260K with F16 KV:
// without it K·Q rounds Q to f16 and softmax·V rounds the probabilities to f16; with it, Q is
// rounded to f16 for fewer than 64 query rows, and V is accumulated in f16), one ubatch large
// enough for the whole step (n_batch = n_ubatch = every token of the step), so a 300-token
// prompt is one forward pass, like tokenmill's prefill. batched=false: each sequence alone in
// a fresh context sequence; batched=true: one context with one llama.cpp sequence per input
// sequence, all prompts submitted concurrently so node-llama-cpp puts them into one
// llama_decode, then every greedy step of all sequences into one llama_decode
// ("decode_calls" in the output counts llama_decode calls to show it).
import fs from 'node:fs';
import os from 'node:os';
// node-llama-cpp runs every llama_decode on a libuv pool thread; with the default pool of 4
// threads, llama.cpp's compute threads on this 2-core machine run at about half speed and
// erratically (measured: 21-24 ms vs 10.5-11 ms per decode step of a 565 MB f32 model).
// A pool of one thread gives llama.cpp its best speed. The pool is sized when node starts,
// so re-run this script under UV_THREADPOOL_SIZE=1 when it isn't set.
if (process.env.UV_THREADPOOL_SIZE !== '1') {
  const {spawnSync} = await import('node:child_process');
  const r = spawnSync(process.execPath, [...process.execArgv, ...process.argv.slice(1)],
    {stdio: 'inherit', env: {...process.env, UV_THREADPOOL_SIZE: '1'}});
  process.exit(r.status ?? 1);
}
const {getLlama, LlamaLogLevel} = await import('node-llama-cpp');

function usage(msg) {
  if (msg) process.stderr.write(`llama_eval: ${msg}\n`);
  process.stderr.write('usage: llama_eval.mjs -m MODEL --input IN.json [--threads N] [--kv f16|f32] ' +
    '[--flash-attn on|off|auto] [--batch-size N]\n');
  process.exit(2);
}

function parseArgs(argv) {
  const o = {threads: os.availableParallelism?.() ?? os.cpus().length, kv: 'f16', flashAttn: 'on', batchSize: 0};
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i], v = () => (i + 1 < argv.length ? argv[++i] : usage(`${a} needs a value`));
    if (a === '-m' || a === '--model') o.model = v();
    else if (a === '--input' || a === '-i') o.input = v();
    else if (a === '--threads' || a === '-t') o.threads = parseInt(v(), 10);
    else if (a === '--kv') o.kv = v();
    else if (a === '--flash-attn') o.flashAttn = v();
    else if (a === '--batch-size') o.batchSize = parseInt(v(), 10);
    else usage(`unknown argument ${a}`);
  }
  if (!o.model || !o.input) usage('-m and --input are required');
  if (!['f16', 'f32'].includes(o.kv)) usage('--kv must be f16 or f32');
  if (!['off', 'on', 'auto'].includes(o.flashAttn)) usage('--flash-attn must be off, on or auto');
  if (!(o.threads >= 1)) usage('--threads must be >= 1');
  return o;
}

// Top-K of a probability Map as [[id, logprob], ...], best first, ties by lower id. The addon
// hands the Map over sorted by logit, best first, so the scan stops at the first probability
// below the K-th best (ties at the boundary are still all seen).
function topK(probs, k) {
  const best = [];
  for (const [id, p] of probs) {
    const last = best[best.length - 1];
    if (best.length >= k && p < last[1]) break;
    if (best.length < k || p > last[1] || (p === last[1] && id < last[0])) {
      best.push([id, p]);
      best.sort((a, b) => b[1] - a[1] || a[0] - b[0]);
      if (best.length > k) best.pop();
    }
  }
  return best.map(([id, p]) => [id, p > 0 ? Math.log(p) : null]);
}

const opt = parseArgs(process.argv.slice(2));
const input = JSON.parse(fs.readFileSync(opt.input, 'utf8'));
const seqs = input.seqs, K = input.top ?? 10, G = input.greedy ?? 0, batched = !!input.batched;
if (!Array.isArray(seqs) || seqs.length === 0 || seqs.some((s) => !Array.isArray(s) || s.length === 0))
  usage('input.seqs must be a non-empty array of non-empty token arrays');

const llama = await getLlama({gpu: false, build: 'never', logLevel: LlamaLogLevel.error, maxThreads: 0,
  progressLogs: false});
const model = await llama.loadModel({modelPath: opt.model, gpuLayers: 0, useMmap: true});
const nVocab = model.fileInfo.metadata?.tokenizer?.ggml?.tokens?.length ?? null;
for (const s of seqs) for (const t of s)
  if (!Number.isInteger(t) || t < 0 || (nVocab != null && t >= nVocab)) usage(`token id ${t} out of range`);

const maxLen = Math.max(...seqs.map((s) => s.length)) + G + 1;
const stepTokens = batched ? seqs.reduce((n, s) => n + s.length, 0) : maxLen;
const batchSize = opt.batchSize || Math.max(stepTokens, batched ? seqs.length : 1);
const flashAttention = opt.flashAttn === 'auto' ? 'auto' : opt.flashAttn === 'on';
const kvType = opt.kv.toUpperCase();

function makeContext(nSeq) {
  return model.createContext({
    sequences: nSeq, contextSize: maxLen, batchSize, threads: opt.threads, flashAttention,
    experimentalKvCacheKeyType: kvType, experimentalKvCacheValueType: kvType,
    failedCreationRemedy: false, ignoreMemorySafetyChecks: true,
  });
}

let decodeCalls = 0;
function countDecodes(ctx) {
  // The addon object's methods are read-only: wrap it in a proxy that counts decodeBatch.
  const inner = ctx._ctx;
  ctx._ctx = new Proxy(inner, {get(t, k) {
    const v = t[k];
    if (typeof v !== 'function') return v;
    if (k === 'decodeBatch') return (...a) => { decodeCalls++; return v.apply(t, a); };
    return v.bind(t);
  }});
}

const want = {generateNext: {probabilities: true, token: true}};

// Prompt: distributions at every position; the last position also yields the first greedy
// token. Returns {top, first} where first = [token, top-K] or null when G = 0.
async function evalPrompt(seq, tokens) {
  const items = tokens.map((t) => [t, want]);
  const res = await seq.controlledEvaluate(items);
  const top = [];
  for (let i = 0; i < tokens.length; i++) {
    const r = res[i];
    if (!r?.next?.probabilities) throw new Error(`no probabilities at position ${i}`);
    top.push(topK(r.next.probabilities, K));
  }
  const last = res[tokens.length - 1].next;
  return {top, next: last.token, nextTop: topK(last.probabilities, K)};
}

async function greedyStep(seq, token) {
  const res = await seq.controlledEvaluate([[token, want]]);
  const n = res[0].next;
  return {next: n.token, nextTop: topK(n.probabilities, K)};
}

const out = seqs.map(() => ({top: [], greedy: [], greedy_top: []}));
if (!batched) {
  const ctx = await makeContext(1);
  countDecodes(ctx);
  const seq = ctx.getSequence();
  for (let s = 0; s < seqs.length; s++) {
    await seq.clearHistory();
    const p = await evalPrompt(seq, seqs[s]);
    out[s].top = p.top;
    let next = p.next, nextTop = p.nextTop;
    for (let g = 0; g < G; g++) {
      out[s].greedy.push(next);
      out[s].greedy_top.push(nextTop);
      if (g + 1 < G) ({next, nextTop} = await greedyStep(seq, next));
    }
  }
  await ctx.dispose();
} else {
  const ctx = await makeContext(seqs.length);
  countDecodes(ctx);
  const sq = seqs.map(() => ctx.getSequence());
  const prompts = await Promise.all(seqs.map((toks, s) => evalPrompt(sq[s], toks)));
  let cur = prompts.map((p) => ({next: p.next, nextTop: p.nextTop}));
  prompts.forEach((p, s) => { out[s].top = p.top; });
  for (let g = 0; g < G; g++) {
    cur.forEach((c, s) => { out[s].greedy.push(c.next); out[s].greedy_top.push(c.nextTop); });
    if (g + 1 < G) cur = await Promise.all(cur.map((c, s) => greedyStep(sq[s], c.next)));
  }
  await ctx.dispose();
}

const result = {
  seqs: out,
  oracle: {
    engine: 'llama.cpp via node-llama-cpp 3.21.1 (prebuilt CPU)',
    threads: opt.threads, kv: opt.kv, flash_attention: opt.flashAttn, batch_size: batchSize,
    ubatch_size: batchSize, batched, decode_calls: decodeCalls, n_vocab: nVocab,
  },
};
process.stdout.write(JSON.stringify(result) + '\n');
await model.dispose();
await llama.dispose();
