#!/usr/bin/env node
// bench/cache_llama: the llama.cpp side of bench/cache_agents (a benchmark, not a
// test). Runs the same multi-turn agent workload (the same token ids, read from --workload)
// through node-llama-cpp@3.21.1's prebuilt CPU llama.cpp, driven the way llama.cpp's
// server drives its slots, and prints one JSON line with the same figures as the tokenmill
// runs (TTFT mean/P99, hit rate, wall time).
//
// Slots, as in llama.cpp's server (tools/server/server.cpp, get_available_slot and
// launch_slot_with_task): --slots S sequences of one context, each holding one prompt's KV
// (--ctx tokens per slot, KV F16 like the server's default). A request takes the idle slot
// whose cached tokens share the longest common prefix with its prompt if that prefix is
// more than --similarity (the server's --slot-prompt-similarity, 0.1) of the prompt, else
// the least recently used idle slot; with no idle slot it waits (FIFO) for one to finish.
// The slot keeps its longest common prefix with the new prompt (at most prompt-1 tokens:
// at least one is always evaluated, like the server), erases the rest
// (llama_memory_seq_rm) and evaluates only the new tokens. Reused tokens count as hits.
// With --slots >= agents every agent ends up with its own slot; with fewer, agents share
// slots as a loaded server would, and mostly only the system prompt is reused.
// Not emulated: the newer server's host-memory prompt cache (--cache-ram), which saves and
// restores whole slot states on a switch, and --cache-reuse (KV shifting of chunks).
//
// --no-reuse empties the slot before every request (the baseline for llama.cpp's own
// speed-up); --serial sends one request at a time (TTFT = that request's prefill alone).
// Flash attention is on by default: the server's default (--flash-attn auto) turns it on for
// the CPU backend, and it is llama.cpp's faster setting here for these contexts.
//
// Decoding: greedy, --answer tokens per request (no EOS stop); the first token comes with
// the prompt evaluation (TTFT: request issued → first token, including the wait for a
// slot), the rest one token per call. Concurrent sequences are batched into one
// llama_decode by node-llama-cpp (up to --batch tokens, its "maximumParallelism" strategy),
// as the server batches its slots. Model loading, context creation and one small warm-up
// evaluation are not timed.
//
//   node bench/cache_llama.mjs -m MODEL --workload FILE.json [--slots 8|pool:MIB] [--threads N]
//        [--batch 512] [--answer 24] [--similarity 0.1] [--flash-attn on|off] [--no-reuse] [--serial]
//   (--slots pool:MIB: as many slots as MIB MiB of F16 KV cache hold, at least one, at most one per agent)
//   FILE.json: {"prompts": [[[ids of agent 0 turn 0], [turn 1], ...], [agent 1 ...], ...]}
//   → {"ttft_mean_ms", "ttft_p99_ms", "hit", "prompt_tokens", "cached_tokens", "wall_s",
//      "slots", "ctx", "kv_mib", "engine", "answers": ["a/t:ids", ...]}
import fs from 'node:fs';
import os from 'node:os';
// (llama_node re-runs this script under UV_THREADPOOL_SIZE=1: llama.cpp's best speed here)
import {getLlama, LlamaLogLevel} from '../tests/oracle/llama_node.mjs';
import {parseArgs} from './args.mjs';

const o = parseArgs('bench/cache_llama', [
  {name: '-m', key: 'model', arg: 'MODEL', required: true, help: 'the GGUF file'},
  {name: '--workload', arg: 'FILE.json', required: true, help: "the prompts: {\"prompts\": [[[ids of agent 0 turn 0], ...], ...]}"},
  {name: '--slots', arg: 'S|pool:MIB', default: '8', help: 'slots, or as many as MIB MiB of F16 KV hold'},
  {name: '--threads', kind: 'number', default: os.availableParallelism?.() ?? os.cpus().length, help: 'threads'},
  {name: '--batch', kind: 'number', default: 512, help: 'batch size'},
  {name: '--answer', kind: 'number', default: 24, help: 'tokens generated per request'},
  {name: '--similarity', kind: 'number', default: 0.1, help: "the server's --slot-prompt-similarity"},
  {name: '--flash-attn', default: 'on', choices: ['on', 'off'], help: 'flash attention'},
  {name: '--no-reuse', kind: 'flag', help: 'empty the slot before every request'},
  {name: '--serial', kind: 'flag', help: 'one request at a time'},
]);
o.flashAttn = o.flashAttn === 'on';
const prompts = JSON.parse(fs.readFileSync(o.workload, 'utf8')).prompts;
const maxPrompt = Math.max(...prompts.flat().map((p) => p.length));
const ctxSize = maxPrompt + o.answer + 8;

const llama = await getLlama({gpu: false, build: 'never', logLevel: LlamaLogLevel.error, maxThreads: 0, progressLogs: false});
const model = await llama.loadModel({modelPath: o.model, gpuLayers: 0, useMmap: true});
// F16 K and V of every layer per token (no SWA on these model families)
const kvBytesPerToken = (() => {
  const md = model.fileInfo.metadata, ar = md?.general?.architecture, h = md?.[ar] ?? {};
  const nHead = Number(h.attention?.head_count), nKv = Number(h.attention?.head_count_kv ?? nHead);
  const kDim = Number(h.attention?.key_length ?? h.embedding_length / nHead);
  const vDim = Number(h.attention?.value_length ?? h.embedding_length / nHead);
  const x = Number(h.block_count) * nKv * (kDim + vDim) * 2;
  return Number.isFinite(x) ? x : null;
})();
// --slots pool:MIB: as many slots as MIB MiB of F16 KV holds (at least one)
if (String(o.slots).startsWith('pool:')) {
  if (!kvBytesPerToken) {
    process.stderr.write('bench/cache_llama: cannot size --slots pool: from this model\'s metadata\n');
    process.exit(2);
  }
  o.slots = Math.max(1, Math.min(prompts.length, Math.floor(Number(o.slots.slice(5)) * 2 ** 20 / (ctxSize * kvBytesPerToken))));
} else o.slots = parseInt(o.slots, 10);
const ctx = await model.createContext({sequences: o.slots, contextSize: ctxSize, batchSize: o.batch, threads: o.threads,
  flashAttention: o.flashAttn, failedCreationRemedy: false, ignoreMemorySafetyChecks: true});
const want = {generateNext: {token: true, options: {temperature: 0}}};
const slots = Array.from({length: o.slots}, () => ({seq: ctx.getSequence(), busy: false, lastUsed: 0}));

{ // warm-up (untimed): a few tokens on every slot, then empty them
  await Promise.all(slots.map((s, i) => s.seq.controlledEvaluate([11 + i, 12, 13, [14, want]])));
  await Promise.all(slots.map((s) => s.seq.clearHistory()));
}

// the server's get_available_slot: longest common prefix above the similarity, else LRU
function slotPick(prompt) {
  let best = null, bestLcp = 0, lru = null;
  for (const s of slots) {
    if (s.busy) continue;
    const lcp = s.seq.compareContextTokens(prompt).firstDifferentIndex;
    if (lcp > bestLcp) { best = s; bestLcp = lcp; }
    if (!lru || s.lastUsed < lru.lastUsed) lru = s;
  }
  return best && bestLcp / prompt.length > o.similarity ? best : lru;
}
const waiting = [];
function slotAcquire(prompt) {
  const s = waiting.length ? null : slotPick(prompt);
  if (s) { s.busy = true; return Promise.resolve(s); }
  return new Promise((resolve) => waiting.push({prompt, resolve}));
}
function slotRelease(s) {
  s.busy = false;
  s.lastUsed = performance.now();
  if (waiting.length) {
    const w = waiting.shift(), n = slotPick(w.prompt);
    n.busy = true;
    w.resolve(n);
  }
}

const ttfts = [], answers = [];
let promptTokens = 0, cachedTokens = 0;
async function request(a, t, prompt) {
  const t0 = performance.now();
  const s = await slotAcquire(prompt);
  const seq = s.seq;
  const reuse = o.noReuse ? 0 : Math.min(seq.compareContextTokens(prompt).firstDifferentIndex, prompt.length - 1);
  if (reuse < seq.nextTokenIndex) await seq.eraseContextTokenRanges([{start: reuse, end: seq.nextTokenIndex}]);
  const items = prompt.slice(reuse).map((tok, i, arr) => (i === arr.length - 1 ? [tok, want] : tok));
  let res = await seq.controlledEvaluate(items);
  let tok = res[items.length - 1].next.token;
  ttfts.push(performance.now() - t0);
  const out = [tok];
  for (let i = 1; i < o.answer; i++) {
    res = await seq.controlledEvaluate([[tok, want]]);
    tok = res[0].next.token;
    out.push(tok);
  }
  slotRelease(s);
  promptTokens += prompt.length;
  cachedTokens += reuse;
  answers.push(`${a}/${t}:${out.join(',')}`);
}

const t0 = performance.now();
if (o.serial) { // one request at a time: TTFT is the prefill time of the request alone
  for (let a = 0; a < prompts.length; a++) for (let t = 0; t < prompts[a].length; t++) await request(a, t, prompts[a][t]);
} else {
  await Promise.all(prompts.map(async (turns, a) => {
    for (let t = 0; t < turns.length; t++) await request(a, t, turns[t]);
  }));
}
const wall = (performance.now() - t0) / 1000;
ttfts.sort((x, y) => x - y);
process.stdout.write(JSON.stringify({
  ttft_mean_ms: ttfts.reduce((x, y) => x + y, 0) / ttfts.length,
  ttft_p99_ms: ttfts[Math.min(ttfts.length - 1, Math.ceil(0.99 * ttfts.length) - 1)],
  hit: cachedTokens / promptTokens, prompt_tokens: promptTokens, cached_tokens: cachedTokens, wall_s: wall,
  slots: o.slots, ctx: ctxSize, kv_mib: kvBytesPerToken ? kvBytesPerToken * ctxSize * o.slots / 2 ** 20 : null,
  engine: `llama.cpp via node-llama-cpp 3.21.1 (prebuilt CPU), ${o.slots} slots x ${ctxSize} tokens, ` +
          `${o.noReuse ? 'no prefix reuse, ' : ''}batch ${o.batch}, ` +
          `flash_attn ${o.flashAttn ? 'on' : 'off'}, kv f16, ${o.threads} threads`,
  answers: answers.sort(),
}) + '\n');
await ctx.dispose();
await model.dispose();
await llama.dispose();
