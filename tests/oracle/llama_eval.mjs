#!/usr/bin/env node
// llama.cpp side of the `tokenmill eval` contract: the numeric oracle.
//
//   node tests/oracle/llama_eval.mjs -m MODEL.gguf --input IN.json [--threads N] [--kv f16|f32|q8_0|q4_0]
//        [--flash-attn on|off|auto] [--batch-size N] [--full-probs]
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
// tokenmill's; --kv f32 for both sides removes that rounding: then an F32 model agrees to ~1e-5;
// flash attention is then off by default, because under flash attention llama.cpp casts an F32
// KV cache to F16 anyway), flash attention ON by default with F16 KV, which is what llama.cpp's
// "auto" picks on CPU (measured: auto
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
// (llama_node re-runs this script under UV_THREADPOOL_SIZE=1: llama.cpp's best speed here)
import {getLlama, LlamaLogLevel} from './llama_node.mjs';

function usage(msg) {
  if (msg) process.stderr.write(`llama_eval: ${msg}\n`);
  process.stderr.write('usage: llama_eval.mjs -m MODEL --input IN.json [--threads N] [--kv f16|f32|q8_0|q4_0] ' +
    '[--flash-attn on|off|auto] [--batch-size N] [--full-probs]\n');
  process.exit(2);
}

function parseArgs(argv) {
  const o = {threads: os.availableParallelism?.() ?? os.cpus().length, kv: 'f16', flashAttn: null, batchSize: 0};
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i], v = () => (i + 1 < argv.length ? argv[++i] : usage(`${a} needs a value`));
    if (a === '-m' || a === '--model') o.model = v();
    else if (a === '--input' || a === '-i') o.input = v();
    else if (a === '--threads' || a === '-t') o.threads = parseInt(v(), 10);
    else if (a === '--kv') o.kv = v();
    else if (a === '--flash-attn') o.flashAttn = v();
    else if (a === '--batch-size') o.batchSize = parseInt(v(), 10);
    else if (a === '--full-probs') o.fullProbs = true;
    else usage(`unknown argument ${a}`);
  }
  if (!o.model || !o.input) usage('-m and --input are required');
  // q8_0 / q4_0: a quantised cache, which llama.cpp reads only under flash attention
  if (!['f16', 'f32', 'q8_0', 'q4_0'].includes(o.kv)) usage('--kv must be f16, f32, q8_0 or q4_0');
  // llama.cpp casts an F32 KV cache to F16 under flash attention (llama-graph.cpp,
  // build_attn_mha), so F32 KV only means F32 with flash attention off.
  o.flashAttn ??= o.kv === 'f32' ? 'off' : 'on';
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

// Two ways to get the top-K log-probabilities at a position:
//  full (--full-probs): one pass asking for the whole probability Map (the addon sorts the
//    vocabulary and hands over a 2×n_vocab array per position: ~100 ms of CPU per position
//    for a 152k vocabulary, too slow for every position of every test model);
//  two passes (default): pass 1 asks for the greedy token and its probability ("confidence",
//    a softmax over the whole vocabulary, so p_top1 = exp(l_top1 − logsumexp)); pass 2 replays
//    exactly the same tokens in exactly the same batches (so the logits are bit-identical) and
//    asks a top-k=K sampler (temperature 1, top-p 1, min-p 0) for its probabilities: a softmax
//    over those K logits only, which gives l_i − l_top1 = log(q_i / q_top1). Then
//    logprob_i = log(p_top1) + log(q_i) − log(q_top1). Pass 2's top token must be pass 1's
//    greedy token (else the two passes did not compute the same logits: an error).
const wantFull = {generateNext: {probabilities: true, token: true}};
const wantConf = {generateNext: {confidence: true, token: true}};
const wantTopK = {generateNext: {probabilities: true, options: {temperature: 1, topK: K, topP: 1, minP: 0, seed: 1}}};

// One pass over one sequence: the prompt, then G-1 single-token steps feeding `feed(g, r)`
// (the token to feed after greedy step g, given this step's result). `step` is awaited in
// lockstep by the batched driver, so it is split into prompt() and next().
function seqPass(sq, tokens, opts) {
  return {
    async prompt() {
      const res = await sq.controlledEvaluate(tokens.map((t) => [t, opts]));
      return tokens.map((_, i) => {
        if (!res[i]?.next) throw new Error(`no result at position ${i}`);
        return res[i].next;
      });
    },
    async step(token) {
      const res = await sq.controlledEvaluate([[token, opts]]);
      if (!res[0]?.next) throw new Error('no result for a greedy step');
      return res[0].next;
    },
  };
}

// Runs one pass over all sequences (batched: together, in lockstep; else one at a time).
// feedTokens(s, g) gives the token fed at greedy step g (g = 0..G-2) of sequence s, or the
// pass decides it from the previous result when feedTokens is null. Returns per sequence the
// list of results: prompt positions, then G-1 steps (G results for the greedy tokens in all).
async function runPass(ctxSeqs, opts, feedTokens) {
  const results = seqs.map(() => []);
  const fed = (s, g, prev) => (feedTokens ? feedTokens(s, g) : prev.token);
  if (!batched) {
    for (let s = 0; s < seqs.length; s++) {
      const sq = ctxSeqs[0];
      await sq.clearHistory();
      const p = seqPass(sq, seqs[s], opts);
      results[s].push(...await p.prompt());
      for (let g = 0; g + 1 < G; g++) results[s].push(await p.step(fed(s, g, results[s].at(-1))));
    }
  } else {
    await Promise.all(ctxSeqs.map((sq) => sq.clearHistory()));
    const ps = seqs.map((toks, s) => seqPass(ctxSeqs[s], toks, opts));
    const pr = await Promise.all(ps.map((p) => p.prompt()));
    pr.forEach((r, s) => results[s].push(...r));
    for (let g = 0; g + 1 < G; g++) {
      const st = await Promise.all(ps.map((p, s) => p.step(fed(s, g, results[s].at(-1)))));
      st.forEach((r, s) => results[s].push(r));
    }
  }
  return results;
}

const ctx = await makeContext(batched ? seqs.length : 1);
countDecodes(ctx);
const ctxSeqs = batched ? seqs.map(() => ctx.getSequence()) : [ctx.getSequence()];
const out = seqs.map(() => ({top: [], greedy: [], greedy_top: []}));
const fill = (s, tops, greedyTokens) => {
  const n = seqs[s].length;
  out[s].top = tops.slice(0, n);
  // the greedy token g is picked from the distribution at result n-1+g
  for (let g = 0; g < G; g++) {
    out[s].greedy.push(greedyTokens[g]);
    out[s].greedy_top.push(tops[n - 1 + g]);
  }
};
if (opt.fullProbs) {
  const r = await runPass(ctxSeqs, wantFull, null);
  r.forEach((res, s) => fill(s, res.map((x) => topK(x.probabilities, K)),
    res.slice(seqs[s].length - 1).map((x) => x.token)));
} else {
  const r1 = await runPass(ctxSeqs, wantConf, null);
  const greedyOf = r1.map((res, s) => res.slice(seqs[s].length - 1).map((x) => x.token));
  const r2 = await runPass(ctxSeqs, wantTopK, (s, g) => greedyOf[s][g]);
  r1.forEach((res1, s) => {
    const tops = res1.map((x1, i) => {
      const q = [...r2[s][i].probabilities].sort((a, b) => b[1] - a[1] || a[0] - b[0]).slice(0, K);
      if (q.length === 0 || !(x1.confidence > 0)) throw new Error(`seq ${s} position ${i}: empty result`);
      if (q[0][0] !== x1.token && q[0][1] !== q[1]?.[1])
        throw new Error(`seq ${s} position ${i}: pass 2 top token ${q[0][0]} != pass 1 greedy ${x1.token}`);
      const base = Math.log(x1.confidence) - Math.log(q[0][1]);
      return q.map(([id, qi]) => [id, qi > 0 ? base + Math.log(qi) : null]);
    });
    fill(s, tops, greedyOf[s]);
  });
}
await ctx.dispose();

const result = {
  seqs: out,
  oracle: {
    engine: 'llama.cpp via node-llama-cpp 3.21.1 (prebuilt CPU)',
    threads: opt.threads, kv: opt.kv, flash_attention: opt.flashAttn, batch_size: batchSize,
    ubatch_size: batchSize, batched, decode_calls: decodeCalls, n_vocab: nVocab,
    method: opt.fullProbs ? 'full probabilities, one pass' : 'two passes: greedy confidence + top-k softmax',
  },
};
process.stdout.write(JSON.stringify(result) + '\n');
await model.dispose();
await llama.dispose();
