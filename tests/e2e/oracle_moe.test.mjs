// oracle_moe: tokenmill's numbers against llama.cpp's (tests/oracle/llama_eval.mjs) on
// mixture-of-experts models that llama.cpp's own gguf-py writes (tests/oracle/gguf_moe.py:
// tensor names, metadata keys and types, Q8_0 / MXFP4 blocks as llama.cpp's Python writes
// them, not mkmodel's C), one per family: qwen3moe, deepseek2 in DeepSeek-V3's shape (q-LoRA
// 96, the sigmoid router with its selection bias, 8 groups of which 4 kept, routed scaling,
// a shared expert, a dense lead layer) and in V2-Lite's (softmax, no renormalisation, 2 shared
// experts), gpt-oss (sliding-window layers, sinks, biases, the clamped SwiGLU), glm4moe in
// GLM-4.5-Air's shape (biased Q/K/V, NEOX RoPE over half of each head, a dense lead layer, the
// sigmoid router with its bias and routed scale, a shared expert, a NextN block that the model
// runs without) and with GLM-4.5's q/k head norms, and mistral4 (deepseek2's layer under its own
// name, as Mistral3Model's Mistral4Model converter writes it).
//
// F32 weights with an F32 KV cache on both sides (no f16 or int8 rounding to flip): batched
// sequences of 1..100 tokens in one step, then 24 greedy steps together; every position's
// top-10 log-probabilities within 1e-3 and the greedy continuations identical. The quantised
// types (Q8_0; gpt-oss: MXFP4 experts, Q8_0 elsewhere) on 24 one-token sequences (nothing to
// propagate: the kernels on gguf-py's blocks) within 2e-3 at the median and 0.05 everywhere
// (V3's shape and gpt-oss: between them every quantised kernel these models use).
//
// Router near-ties: two experts (or groups) whose scores differ by less than the engines'
// rounding may be chosen differently by each, and the token's output then differs by far
// more than a rounding. `tokenmill eval` reports each token's smallest routing margin
// (route_margin); a sequence is compared only up to its first token whose margin is below
// TIE (that token's own distribution and everything after it are left out, and the report
// says so), and any other difference fails.
//
// The models use a generated 8192-token vocabulary (mkmodel's, copied by gguf_moe.py): the
// comparisons feed token ids, and a real vocabulary's 100k+ output rows would only make the
// test slower. Needs python3 with numpy (scripts/deps.sh installs Debian's python3-numpy);
// skipped without it. Models are cached under tests/data/gen/, keyed by the generator's hash.
import {test, after} from 'node:test';
import assert from 'node:assert/strict';
import {spawnSync} from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import {root, bin, gen, oracleFiles, rng, posDiff, runBoth} from './oracle_common.mjs';

const script = path.join(root, 'tests/oracle/gguf_moe.py');
const TOP = 10;
const TOL_F32 = 1e-3;
const MEDIAN_TOL = 2e-3;
const SINGLE_TOL = 0.05;
// a routing margin below this (in the router's own units: probabilities, sigmoid scores or
// gpt-oss logits, all of order 1) is within what the two engines' F32 arithmetic may differ by
const TIE = 1e-5;
const LENS = [1, 9, 40, 100];
const GREEDY = 24;
const N_SINGLES = 24;
// the quantised one-token check once per kernel set: V3's Q8_0 runs every Q8_0 kernel the
// others would (dense, experts, MLA heads), gpt-oss's MXFP4 the experts' MXFP4
const FAMILIES = {
  qwen3moe: {},
  'deepseek2-v3': {quant: 'q8_0'},
  'deepseek2-v2': {},
  'gpt-oss': {quant: 'mxfp4'},
  // flips: sequences allowed past SINGLE_TOL (at most 1 in logprob): an activation on an int8
  // rounding boundary that one engine quantises to the other value (oracle_arch.test.mjs) moves
  // one sequence by 0.1-1; glm4moe's Q8_0 file has one such (0.27, its router margin 2e-2: not a
  // routing difference), the other 23 agree within 1e-5
  glm4moe: {quant: 'q8_0', lens: [1, 40, 150], invariance: true, flips: 1},
  'glm4moe-qknorm': {},
  mistral4: {},
};

const {python, skip, cached} = oracleFiles([script, path.join(root, 'tests/oracle/gguf_common.py')]);

const report = [];
after(() => {
  for (const r of report) console.log(`oracle_moe: ${r}`);
});

// A cached file made by make(tmpPath) unless one with the same key exists.
function vocabFile() {
  return cached('oracle-moe-vocab', (out) => {
    const r = spawnSync(bin, ['mkmodel', '--arch', 'qwen3', '--preset', 'tiny', '--layers', '1', '--vocab-size', '8192',
      '--type', 'f32', '--seed', '1', '-o', out], {encoding: 'utf8'});
    assert.equal(r.status, 0, r.stderr);
  });
}

function model(shape, type) {
  const vocab = vocabFile();
  return cached(`oracle-moe-${shape}-${type}`, (out) => {
    const r = spawnSync(python, [script, '--shape', shape, '--type', type, '--vocab', vocab, '--seed', '1', '-o', out],
      {encoding: 'utf8'});
    assert.equal(r.status, 0, `gguf_moe.py failed: ${r.stderr}`);
  });
}


// The first position whose token's routing margin is below TIE (Infinity: none).
function firstTie(margins) {
  assert.ok(Array.isArray(margins), 'tokenmill eval reports route_margin for a MoE model');
  const i = margins.findIndex((m) => m !== null && m < TIE);
  return i < 0 ? Infinity : i;
}

for (const [shape, fam] of Object.entries(FAMILIES)) {
  test(`${shape} (gguf-py, F32, F32 KV): batched prompts and greedy steps agree with llama.cpp up to any router near-tie`,
    {skip}, async () => {
      const file = model(shape, 'f32');
      const r = rng(7);
      const lens = fam.lens ?? LENS;
      const seqs = lens.map((n) => Array.from({length: n}, () => r(8000)));
      const {tm, ll} = await runBoth(file, {seqs, top: TOP, greedy: GREEDY, batched: true}, 'f32', 'moe');
      let maxDiff = 0, cut = 0;
      seqs.forEach((sq, s) => {
        const a = tm.seqs[s], b = ll.seqs[s], n = sq.length;
        assert.equal(a.route_margin.length, n + GREEDY - 1, `${shape} seq ${s}: a margin per fed token`);
        const tie = firstTie(a.route_margin);
        if (tie < Infinity) cut++;
        for (let i = 0; i < Math.min(n, tie); i++)
          maxDiff = Math.max(maxDiff, posDiff(a.top[i], b.top[i], TOL_F32, `${shape} seq ${s} position ${i}`));
        // greedy token g is picked at position n - 1 + g
        const upTo = Math.min(GREEDY, tie - (n - 1));
        assert.deepEqual(a.greedy.slice(0, Math.max(upTo, 0)), b.greedy.slice(0, Math.max(upTo, 0)),
          `${shape} seq ${s}: greedy continuations (compared up to step ${upTo})`);
        if (tie < Infinity)
          report.push(`${shape} seq ${s}: router near-tie at position ${tie} (margin ${a.route_margin[tie]}): compared up to it`);
      });
      assert.ok(maxDiff <= TOL_F32, `${shape}: max |Δ logprob| ${maxDiff} > ${TOL_F32}`);
      assert.ok(cut < seqs.length, `${shape}: every sequence stopped at a router near-tie`);
      report.push(`${shape} f32: max |Δ logprob| ${maxDiff.toExponential(2)} over ${lens.join('/')} tokens, ` +
        `greedy ${GREEDY} steps identical${cut ? ` (${cut} sequences up to a router near-tie)` : ''}`);
    });

  // batch invariance: each sequence alone gives the bits it gives batched with the others
  if (fam.invariance) test(`${shape} (gguf-py, F32): batched and alone give identical numbers`, {skip}, () => {
    const file = model(shape, 'f32');
    const r = rng(13);
    const seqs = (fam.lens ?? LENS).map((n) => Array.from({length: n}, () => r(8000)));
    const dir = fs.mkdtempSync(path.join(gen, 'inv-moe-'));
    try {
      const out = (batched) => {
        const inFile = path.join(dir, `in-${batched}.json`);
        fs.writeFileSync(inFile, JSON.stringify({seqs, top: TOP, greedy: 8, batched}));
        const p = spawnSync(bin, ['eval', '-m', file, '--input', inFile, '--threads', '2', '--kv', 'f32'],
          {encoding: 'utf8', maxBuffer: 1 << 26});
        assert.equal(p.status, 0, p.stderr);
        return JSON.parse(p.stdout).seqs;
      };
      assert.deepEqual(out(true), out(false), `${shape}: batched and alone differ`);
    } finally {
      fs.rmSync(dir, {recursive: true, force: true});
    }
  });

  if (fam.quant) test(`${shape} (gguf-py, ${fam.quant}): one-token sequences agree with llama.cpp`, {skip}, async () => {
    const file = model(shape, fam.quant);
    const r = rng(11);
    const seqs = Array.from({length: N_SINGLES}, () => [r(8000)]);
    const {tm, ll} = await runBoth(file, {seqs, top: TOP, greedy: 1, batched: true}, 'f32', 'moe');
    const diffs = [];
    seqs.forEach((_, s) => {
      if (firstTie(tm.seqs[s].route_margin) === 0) return;
      diffs.push(posDiff(tm.seqs[s].top[0], ll.seqs[s].top[0], fam.flips ? 1 : SINGLE_TOL, `${shape} ${fam.quant} single ${s}`));
    });
    diffs.sort((x, y) => x - y);
    const median = diffs[diffs.length >> 1], max = diffs.at(-1);
    assert.ok(diffs.length >= N_SINGLES / 2, `${shape}: too many router near-ties`);
    assert.ok(median <= MEDIAN_TOL, `${shape} ${fam.quant}: median |Δ logprob| ${median} > ${MEDIAN_TOL}`);
    const far = diffs.filter((d) => d > SINGLE_TOL);
    assert.ok(far.length <= (fam.flips ?? 0) && max <= 1,
      `${shape} ${fam.quant}: ${far.length} sequences past ${SINGLE_TOL} (${far.join(', ')}), ${fam.flips ?? 0} allowed`);
    report.push(`${shape} ${fam.quant}: one-token sequences median ${median.toExponential(2)} max ${max.toExponential(2)}` +
      (far.length ? ` (${far.length} rounding flip${far.length > 1 ? 's' : ''})` : ''));
  });
}

// Malformed glm4moe / mistral4 files (gguf-py's, one part dropped or one key added) are refused
// at load with a message naming what is wrong, never run.
test('glm4moe and mistral4: malformed files are refused naming the tensor or key', {skip}, () => {
  const vocab = vocabFile();
  const dir = fs.mkdtempSync(path.join(gen, 'bad-moe-'));
  try {
    const cases = [
      ['glm4moe', ['--drop', 'blk.1.attn_k.bias'], /blk\.1: attn_q\/k\/v\.bias must all be present or all absent/],
      ['glm4moe-qknorm', ['--drop', 'blk.0.attn_k_norm'], /blk\.0: attn_q_norm and attn_k_norm must both be present/],
      ['glm4moe', ['--drop', 'blk.2.exp_probs_b'], /missing tensor blk\.2\.exp_probs_b\.bias/],
      ['glm4moe', ['--drop', 'blk.1.post_attention_norm'], /missing tensor blk\.1\.post_attention_norm\.weight/],
      ['glm4moe', ['--drop', 'blk.3.nextn.hnorm'], /missing tensor blk\.3\.nextn\.hnorm\.weight/],
      ['glm4moe', ['--extra', 'glm4moe.expert_group_count=4'], /glm4moe\.expert_group_count: group-limited routing/],
      ['glm4moe', ['--extra', 'glm4moe.rope.dimension_sections=8,8,0,0'], /multi-section RoPE/],
      ['mistral4', ['--extra', 'mistral4.attention.temperature_scale=0.1'], /mistral4\.attention\.temperature_scale 0\.1/],
    ];
    cases.forEach(([shape, extra, re], i) => {
      const f = path.join(dir, `bad${i}.gguf`);
      const g = spawnSync(python, [script, '--shape', shape, '--vocab', vocab, '--seed', '1', ...extra, '-o', f], {encoding: 'utf8'});
      assert.equal(g.status, 0, g.stderr);
      const r = spawnSync(bin, ['run', '-m', f, '-p', 'hi', '-n', '1'], {encoding: 'utf8'});
      assert.notEqual(r.status, 0, `${shape} ${extra.join(' ')}: loaded`);
      assert.match(r.stderr, re, `${shape} ${extra.join(' ')}`);
    });
  } finally {
    fs.rmSync(dir, {recursive: true, force: true});
  }
});

// A dense model has no router: eval reports no margins.
test('eval: route_margin only for a model with experts', {skip}, () => {
  const vocab = vocabFile();
  const dir = fs.mkdtempSync(path.join(gen, 'in-moe-'));
  try {
    const inFile = path.join(dir, 'in.json');
    fs.writeFileSync(inFile, JSON.stringify({seqs: [[1, 2, 3]], top: 2, greedy: 2}));
    const r = spawnSync(bin, ['eval', '-m', vocab, '--input', inFile, '--threads', '1'], {encoding: 'utf8'});
    assert.equal(r.status, 0, r.stderr);
    assert.equal(JSON.parse(r.stdout).seqs[0].route_margin, undefined);
  } finally {
    fs.rmSync(dir, {recursive: true, force: true});
  }
});
