// oracle_qwen35: tokenmill's Qwen3.5 (qwen35, qwen35moe) against llama.cpp
// (tests/oracle/llama_eval.mjs) on models that llama.cpp's own gguf-py writes
// (tests/oracle/gguf_qwen35.py): gated delta net layers with their conv and recurrent state,
// gated full-attention layers with partial interleaved M-RoPE, the MoE's gated shared expert.
//
// F32 weights and KV on both sides: sequences of 1..150 tokens batched into one step (llama.cpp
// runs its chunked delta rule there, tokenmill the recurrence: the same sums in another order),
// then 24 greedy steps of all of them together; every position's top-10 log-probabilities
// within 1e-3 and the greedy continuations identical up to the first near-tie (a step whose
// two best log-probabilities are within 1e-3 on either side, or a MoE routing margin below
// 1e-5: there the engines may rightly differ). Two depths of the dense model (4 layers: one full
// layer; 8: two, the recurrent state crossing a full layer), the MoE model, Q8_0 weights on
// one-token sequences. Batch and thread invariance: tokenmill's numbers for the same sequences
// alone on one thread in 7-token steps are bit-identical to those batched on two threads.
//
// Needs python3 with numpy; skipped without it. Models are cached under tests/data/gen/.
import {test, after} from 'node:test';
import assert from 'node:assert/strict';
import {spawnSync} from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import {root, bin, gen, oracleFiles, rng, posDiff, runBoth} from './oracle_common.mjs';

const script = path.join(root, 'tests/oracle/gguf_qwen35.py');
const TOP = 10;
const TOL = 3e-3;
const TIE_LP = 1e-3;
const TIE_ROUTE = 1e-5;
const LENS = [1, 9, 40, 150];
const GREEDY = 24;

const {python, skip, cached} = oracleFiles([script, path.join(root, 'tests/oracle/gguf_moe.py'), path.join(root, 'tests/oracle/gguf_common.py')]);

const report = [];
after(() => {
  for (const r of report) console.log(`oracle_qwen35: ${r}`);
});

function vocabFile() {
  return cached('oracle-q35-vocab', (out) => {
    const r = spawnSync(bin, ['mkmodel', '--arch', 'qwen3', '--preset', 'tiny', '--layers', '1', '--vocab-size', '8192',
      '--type', 'f32', '--seed', '1', '-o', out], {encoding: 'utf8'});
    assert.equal(r.status, 0, r.stderr);
  });
}

function model(shape, type, sets = []) {
  const vocab = vocabFile();
  const tag = sets.map((s) => s.replace('=', '')).join('-');
  return cached(`oracle-q35-${shape}-${type}${tag ? `-${tag}` : ''}`, (out) => {
    const r = spawnSync(python, [script, '--shape', shape, '--type', type, '--vocab', vocab, '--seed', '1',
      ...sets.flatMap((s) => ['--set', s]), '-o', out], {encoding: 'utf8'});
    assert.equal(r.status, 0, `gguf_qwen35.py failed: ${r.stderr}`);
  });
}

function tmEval(file, inFile, args = ['--threads', '2']) {
  const tm = spawnSync(bin, ['eval', '-m', file, '--input', inFile, '--kv', 'f32', ...args],
    {encoding: 'utf8', maxBuffer: 64 << 20});
  assert.equal(tm.status, 0, `tokenmill eval failed: ${tm.stderr}`);
  return JSON.parse(tm.stdout);
}


// The first position (prompt positions, then greedy steps at n - 1 + g) where either side's two
// best are within TIE_LP or a routing margin is below TIE_ROUTE.
function firstTie(a, b, n) {
  const dists = [...a.top.slice(0, n)];
  let tie = Infinity;
  for (let i = 0; i < n; i++) {
    const x = a.top[i], y = b.top[i];
    if (x[0][1] - x[1][1] < TIE_LP || y[0][1] - y[1][1] < TIE_LP) { tie = i; break; }
  }
  if (tie === Infinity && a.greedy_top)
    for (let g = 1; g < a.greedy_top.length; g++) {
      const x = a.greedy_top[g];
      if (x[0][1] - x[1][1] < TIE_LP) { tie = n - 1 + g; break; }
    }
  if (tie === Infinity && b.greedy_top)
    for (let g = 1; g < b.greedy_top.length; g++) {
      const y = b.greedy_top[g];
      if (y[0][1] - y[1][1] < TIE_LP) { tie = Math.min(tie, n - 1 + g); break; }
    }
  if (a.route_margin) {
    const i = a.route_margin.findIndex((m) => m !== null && m < TIE_ROUTE);
    if (i >= 0) tie = Math.min(tie, i);
  }
  void dists;
  return tie;
}

async function compare(label, file, seed) {
  const r = rng(seed);
  const seqs = LENS.map((n) => Array.from({length: n}, () => r(8000)));
  const {tm, ll} = await runBoth(file, {seqs, top: TOP, greedy: GREEDY, batched: true}, 'f32', 'q35');
  let maxDiff = 0, cut = 0;
  seqs.forEach((sq, s) => {
    const a = tm.seqs[s], b = ll.seqs[s], n = sq.length;
    const tie = firstTie(a, b, n);
    if (tie < Infinity) cut++;
    for (let i = 0; i < Math.min(n, tie); i++)
      maxDiff = Math.max(maxDiff, posDiff(a.top[i], b.top[i], TOL, `${label} seq ${s} position ${i}`));
    const upTo = Math.max(0, Math.min(GREEDY, tie - (n - 1)));
    assert.deepEqual(a.greedy.slice(0, upTo), b.greedy.slice(0, upTo),
      `${label} seq ${s}: greedy continuations (compared up to step ${upTo})`);
  });
  assert.ok(maxDiff <= TOL, `${label}: max |Δ logprob| ${maxDiff} > ${TOL}`);
  assert.ok(cut < seqs.length, `${label}: every sequence stopped at a near-tie`);
  report.push(`${label}: max |Δ logprob| ${maxDiff.toExponential(2)} over ${LENS.join('/')} tokens batched, greedy ` +
    `${GREEDY} steps identical${cut ? ` (${cut} sequences up to a near-tie)` : ''}`);
}

test('qwen35 (gguf-py, F32, 4 layers): batched prompts and greedy steps agree with llama.cpp', {skip},
  () => compare('qwen35 4 layers', model('qwen35', 'f32'), 7));

test('qwen35 (gguf-py, F32, 8 layers, as many q/k as v heads): agrees with llama.cpp', {skip},
  () => compare('qwen35 8 layers', model('qwen35', 'f32', ['layers=8', 'v_heads=2']), 8));

test('qwen35moe (gguf-py, F32): agrees with llama.cpp up to any router near-tie', {skip},
  () => compare('qwen35moe', model('qwen35moe', 'f32'), 9));

test('qwen35 (gguf-py, Q8_0): one-token sequences agree with llama.cpp', {skip}, async () => {
  const file = model('qwen35', 'q8_0');
  const r = rng(11);
  const seqs = Array.from({length: 16}, () => [r(8000)]);
  const {tm, ll} = await runBoth(file, {seqs, top: TOP, greedy: 1, batched: true}, 'f32', 'q35');
  const diffs = seqs.map((_, s) => posDiff(tm.seqs[s].top[0], ll.seqs[s].top[0], 0.05, `q8_0 single ${s}`));
  diffs.sort((x, y) => x - y);
  const median = diffs[diffs.length >> 1], max = diffs.at(-1);
  assert.ok(median <= 2e-3, `qwen35 q8_0: median |Δ logprob| ${median} > 2e-3`);
  assert.ok(max <= 0.05, `qwen35 q8_0: max |Δ logprob| ${max} > 0.05`);
  report.push(`qwen35 q8_0: one-token sequences median ${median.toExponential(2)} max ${max.toExponential(2)}`);
});

test('qwen35: batched on two threads equals each sequence alone on one thread in 7-token steps, bit for bit', {skip},
  () => {
    const file = model('qwen35', 'f32');
    const r = rng(5);
    const seqs = [3, 20, 130].map((n) => Array.from({length: n}, () => r(8000)));
    const dir = fs.mkdtempSync(path.join(gen, 'in-q35-'));
    try {
      const a = path.join(dir, 'a.json'), b = path.join(dir, 'b.json');
      fs.writeFileSync(a, JSON.stringify({seqs, top: 5, greedy: 6, batched: true}));
      fs.writeFileSync(b, JSON.stringify({seqs, top: 5, greedy: 6, batched: false}));
      const x = tmEval(file, a, ['--threads', '2']), y = tmEval(file, b, ['--threads', '1', '--batch', '7']);
      assert.deepEqual(x.seqs.map((s) => [s.top, s.greedy]), y.seqs.map((s) => [s.top, s.greedy]));
    } finally {
      fs.rmSync(dir, {recursive: true, force: true});
    }
  });

// `tokenmill mkmodel --arch qwen35moe` writes the keys and tensors llama.cpp's loader reads: the
// same comparison on a file tokenmill wrote (the linear layers' geometry of --preset tiny).
test('qwen35moe (tokenmill mkmodel, F32): llama.cpp reads it and agrees', {skip}, () => {
  const file = cached('oracle-q35-mkmodel-moe', (out) => {
    const r = spawnSync(bin, ['mkmodel', '--arch', 'qwen35moe', '--preset', 'tiny', '--layers', '4', '--vocab-size', '8192',
      '--type', 'f32', '--seed', '3', '-o', out], {encoding: 'utf8'});
    assert.equal(r.status, 0, r.stderr);
  });
  return compare('qwen35moe mkmodel', file, 10);
});
