#!/usr/bin/env node
// llama.cpp side of `tokenmill bench`: the same measurements through node-llama-cpp@3.21.1's
// prebuilt CPU library, printing the same JSON shape.
//
//   node bench/llama_bench.mjs -m MODEL [--threads N] [--pp 512] [--tg 128] [--seqs 1,4,16] [--reps R]
//   → {"model": path, "threads": N, "pp": {"n": 512, "tok_s": [R]}, "tg": {"n": 128, "tok_s": [R]},
//      "batched": [{"seqs": S, "n": 128, "tok_s": [R]}, ...], "engine": "llama.cpp ..."}
//
// What is timed (model loading and context creation are not):
//   pp  – one llama_decode of N random prompt tokens from an empty cache (n_batch = n_ubatch
//         = N, logits for the last token only, like llama-bench's pp test);
//   tg  – N single-token decode steps from position 0, each computing the logits (like
//         llama-bench's tg test); each next token is the greedy pick (an argmax over the
//         vocabulary in the addon, ~0.1 ms, included);
//   batched S – S sequences in one context, each step decodes one token of every sequence
//         in one llama_decode (submitted concurrently; node-llama-cpp batches them), N steps,
//         aggregate tokens/s = S·N / time.
// Flash attention off, KV cache F16 (llama.cpp's defaults on CPU for these models), the
// thread count given for both prompt and generation. One untimed warm-up per context.
import os from 'node:os';
// (llama_node re-runs this script under UV_THREADPOOL_SIZE=1: llama.cpp's best speed here)
import {getLlama, LlamaLogLevel} from '../tests/oracle/llama_node.mjs';
import {parseArgs} from './args.mjs';

const o = parseArgs('bench/llama_bench', [
  {name: '-m', alias: ['--model'], key: 'model', arg: 'MODEL', required: true, help: 'the GGUF file'},
  {name: '--threads', alias: ['-t'], kind: 'number', default: os.availableParallelism?.() ?? os.cpus().length, help: 'threads'},
  {name: '--pp', kind: 'number', default: 512, help: 'prompt tokens'},
  {name: '--tg', kind: 'number', default: 128, help: 'generated tokens'},
  {name: '--seqs', kind: 'list', of: 'number', default: [1, 4, 16], help: 'sequences of the batched runs'},
  {name: '--reps', arg: 'R', kind: 'number', default: 1, help: 'repetitions'},
  {name: '--flash-attn', default: 'off', choices: ['on', 'off'], help: 'flash attention'},
]);
o.flashAttn = o.flashAttn === 'on';

const llama = await getLlama({gpu: false, build: 'never', logLevel: LlamaLogLevel.error, maxThreads: 0,
  progressLogs: false});
const model = await llama.loadModel({modelPath: o.model, gpuLayers: 0, useMmap: true});
const nVocab = model.fileInfo.metadata?.tokenizer?.ggml?.tokens?.length ?? 1000;

let rngState = 0x9e3779b9;
function rand(n) { // mulberry32
  rngState = (rngState + 0x6D2B79F5) >>> 0;
  let t = rngState;
  t = Math.imul(t ^ (t >>> 15), t | 1);
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
  return (((t ^ (t >>> 14)) >>> 0) % n);
}
const randTokens = (n) => Array.from({length: n}, () => rand(nVocab));
const wantToken = {generateNext: {token: true}};

function makeContext(nSeq, ctxSize, batchSize) {
  return model.createContext({sequences: nSeq, contextSize: ctxSize, batchSize, threads: o.threads,
    flashAttention: o.flashAttn, failedCreationRemedy: false, ignoreMemorySafetyChecks: true});
}

// Decodes `steps` single tokens on every sequence of `seqs` together; returns seconds.
async function decodeSteps(seqs, steps) {
  let cur = seqs.map(() => rand(nVocab));
  const t0 = performance.now();
  for (let s = 0; s < steps; s++) {
    const res = await Promise.all(seqs.map((sq, i) => sq.controlledEvaluate([[cur[i], wantToken]])));
    cur = res.map((r) => r[0]?.next?.token ?? rand(nVocab));
  }
  return (performance.now() - t0) / 1000;
}

const result = {model: o.model, threads: o.threads, pp: {n: o.pp, tok_s: []}, tg: {n: o.tg, tok_s: []},
  batched: o.seqs.map((s) => ({seqs: s, n: o.tg, tok_s: []})),
  engine: `llama.cpp via node-llama-cpp 3.21.1 (prebuilt CPU), flash_attn ${o.flashAttn ? 'on' : 'off'}, kv f16`};

if (o.pp > 0) {
  const ctx = await makeContext(1, o.pp + 1, o.pp);
  const sq = ctx.getSequence();
  await sq.controlledEvaluate([...randTokens(15), [rand(nVocab), wantToken]]); // warm-up
  for (let r = 0; r < o.reps; r++) {
    await sq.clearHistory();
    const toks = randTokens(o.pp);
    const items = toks.map((t, i) => (i === toks.length - 1 ? [t, wantToken] : t));
    const t0 = performance.now();
    await sq.controlledEvaluate(items);
    result.pp.tok_s.push(o.pp / ((performance.now() - t0) / 1000));
  }
  await ctx.dispose();
}
if (o.tg > 0) {
  const ctx = await makeContext(1, o.tg + 1, 1);
  const sq = ctx.getSequence();
  await decodeSteps([sq], 4); // warm-up
  for (let r = 0; r < o.reps; r++) {
    await sq.clearHistory();
    result.tg.tok_s.push(o.tg / await decodeSteps([sq], o.tg));
  }
  await ctx.dispose();
}
for (const b of result.batched) {
  if (o.tg <= 0) break;
  const ctx = await makeContext(b.seqs, o.tg + 1, b.seqs);
  const sqs = Array.from({length: b.seqs}, () => ctx.getSequence());
  await decodeSteps(sqs, 2); // warm-up
  for (let r = 0; r < o.reps; r++) {
    await Promise.all(sqs.map((s) => s.clearHistory()));
    b.tok_s.push(b.seqs * o.tg / await decodeSteps(sqs, o.tg));
  }
  await ctx.dispose();
}
process.stdout.write(JSON.stringify(result) + '\n');
await model.dispose();
await llama.dispose();
