// oracle: tokenmill's numbers against llama.cpp's (node-llama-cpp@3.21.1's prebuilt CPU library,
// driven by tests/oracle/llama_eval.mjs), on random-weight models that `tokenmill mkmodel`
// writes in real shapes with real vocabularies: llama (Llama 3 vocabulary and RoPE scaling,
// untied output), qwen2 (q/k/v biases, tied), qwen3 (per-head q/k norms, head_dim*heads != dim,
// tied), qwen3moe (16 experts, 4 per token, untied), each in F32, F16, Q8_0 and Q4_K (llama's
// one-token sequences also in Q5_K_M; qwen2's Q8_0 and Q4_K on the one-token sequences only,
// see ARCHS); and
// deepseek2 (multi-head latent attention) in a V3-like and a V2-Lite-like form and gpt-oss
// (sliding-window layers, sinks, MXFP4 experts) (their comments below), in fewer types. The V3-like router (sigmoid scores plus a bias, the best
// groups, then the best experts) moves tokens between experts on the smallest difference, so
// its quantised types are compared on the one-token sequences only (a 300-token prompt there
// differs from llama.cpp about as much as llama.cpp differs from itself, ~10 logprob units,
// and greedy parts on its first steps); F32 is compared everywhere, batched too.
//
// Mixture of experts: a rounding flip (below) can also move a token to another expert at some
// layer, which changes its later logits by far more than a flip in a dense model. llama.cpp
// against itself then differs by several units of logprob on a 300-token prompt, and the
// tolerance derived from that is loose for the quantised qwen3moe types; the tight checks
// there are F32 (1e-3, no flips) and the one-token medians.
//
// For every model: a 300-token prompt of seeded random ids; at every position the top-10
// log-probabilities of both engines must agree within the type's tolerance (the max |Δ| is
// printed as an "oracle:" line and written to tests/data/gen/oracle-report.json), and the
// greedy 64-token continuations must be identical. Once per architecture, 8 sequences of
// different lengths (1..200 tokens, crossing the 128-token KV block) go through both engines
// in one forward step and then decode together; the same checks apply.
//
// KV cache: F32 weights run with an F32 KV cache on both sides (llama.cpp then with flash
// attention off, since under flash attention it casts F32 KV to F16): the comparison is then
// free of f16 rounding and the tolerance is tight. The quantised and F16 types run with the
// default F16 KV cache (llama.cpp's flash attention on, its CPU default).
//
// Noise floor: these random models amplify tiny numeric differences. A quantised type
// quantises every activation vector (Q8_0 / Q8_K) before each matmul; when two engines (or
// llama.cpp with two batch splits) differ by 1e-7 somewhere, an activation near a rounding
// boundary lands on the other int8 value now and then (every ~30-100 positions), a 0.15 %
// change of that vector, which the model turns into 0.1-1 of logprob at that position and,
// through the KV cache, at every later one. llama.cpp is no closer to itself: the same prompt
// in one batch vs one token at a time differs by up to 0.11 (F16), 0.8 (Q8_0), 1.1 (Q4_K).
// So each comparison also runs llama.cpp a second way (prompt one token per batch; batched
// inputs unbatched) and the tolerance is max(TOL[type], 1.5 × that self-difference); both are
// printed. Kernel errors cannot hide behind it: 32 one-token sequences (position 0, nothing
// to propagate), in one step and one by one, must agree at their median position within
// MEDIAN_TOL, and F32 weights with an F32 KV cache (no rounding flips) within 1e-3 everywhere.
// The amplification is mkmodel's: its output norm (weights ~20, logits with a standard
// deviation ~10) makes one flip worth 0.05-0.3; with ~5 the same runs differ 5x less, at the
// price of closer greedy top-2 gaps.
//
// Greedy near-ties: if the continuations differ at step k and llama.cpp's own top-2 gap
// there is below the tolerance (and tokenmill's token is one of those tied at the top), the
// two are compared only up to k and the test says so; any other divergence fails.
//
// The other weight types (Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, IQ4_NL, IQ4_XS): small llama and
// qwen3moe models, one-token sequences only (MORE_TYPES below).
//
// The codebook types (IQ2_XXS ... IQ1_M): small llama and qwen3moe models that gguf-py
// rewrites with random blocks of the types (IQ_TYPES below), one-token sequences only.
//
// MoE models written by llama.cpp's gguf-py instead of mkmodel: oracle_moe.test.mjs.
//
// Models are cached under tests/data/gen/ keyed by mkmodel's arguments and a hash of the
// sources that write them. ORACLE_ONLY=llama,q8_0 (substrings) limits what runs.
import {test, after} from 'node:test';
import assert from 'node:assert/strict';
import {spawn, spawnSync} from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import {rng} from './oracle_common.mjs';

const root = path.resolve(import.meta.dirname, '../..');
const bin = path.join(root, 'build/tokenmill');
const gen = path.join(root, 'tests/data/gen');
const vocabDir = path.join(root, 'tests/data/llama.cpp/models');
// tokenmill runs with 2 threads (its threaded paths are under test); llama.cpp with 1: its
// results do not depend on the thread count at these lengths (its split-KV attention path
// starts at 512 KV rows), and its spinning barriers make 2 threads 5-10x slower when the 2
// cores are shared with other processes, as they are during `make test`.
const THREADS = 2;
const LLAMA_THREADS = 1;
const TOP = 10;
const GREEDY = 64;
const PROMPT = 300;
const BATCH_LENS = [1, 9, 33, 64, 100, 129, 150, 200];

// Tolerance on |Δ logprob| of the top-10 tokens, per weight type (see the calibration notes
// in the report at the end of this file's output; measured values are printed every run).
const TOL = {f32: 1e-3, f16: 0.05, q8_0: 0.05, q4_k: 0.08, q5_k_m: 0.08, mxfp4: 0.05,
  q4_1: 0.08, q5_0: 0.08, q5_1: 0.08, q2_k: 0.08, q3_k: 0.08, q3_k_m: 0.08, iq4_nl: 0.08, iq4_xs: 0.08,
  iq2_xxs: 0.08, iq2_xs: 0.08, iq2_s: 0.08, iq3_xxs: 0.08, iq3_s: 0.08, iq1_s: 0.08, iq1_m: 0.08, tq1_0: 0.08,
  tq2_0: 0.08, iq_mix: 0.08};
const NOISE_FACTOR = 1.5;
const MEDIAN_TOL = 2e-3;
const N_SINGLES = 32;
const KV = {f32: 'f32', f16: 'f16', q8_0: 'f16', q4_k: 'f16', q5_k_m: 'f16', mxfp4: 'f16',
  q4_1: 'f16', q5_0: 'f16', q5_1: 'f16', q2_k: 'f16', q3_k: 'f16', q3_k_m: 'f16', iq4_nl: 'f16', iq4_xs: 'f16',
  iq2_xxs: 'f16', iq2_xs: 'f16', iq2_s: 'f16', iq3_xxs: 'f16', iq3_s: 'f16', iq1_s: 'f16', iq1_m: 'f16', tq1_0: 'f16',
  tq2_0: 'f16', iq_mix: 'f16'};
// The weight types beyond the above, one small model each (every matrix, the tied embedding
// included, in the type): the one-token sequences check each type's kernels against llama.cpp
// where nothing else differs; a generated vocabulary of 2048 tokens keeps the files and
// llama.cpp's start small (ids drawn below 2000); only the 32 sequences in one step (oneStep:
// test_ops checks every kernel one token at a time against the same scalar reference), so
// the eight checks stay near 25 s
const MORE_TYPES = ['q4_1', 'q5_0', 'q5_1', 'q2_k', 'q3_k', 'q3_k_m', 'iq4_nl', 'iq4_xs', 'iq3_xxs', 'iq3_s', 'iq2_s',
  'tq1_0', 'tq2_0'];
// The codebook types mkmodel does not write (ggml quantises IQ2_XXS, IQ2_XS and IQ1_S only
// with an importance matrix; IQ1_M's search is not ported): llama.cpp's gguf-py
// rewrites mkmodel's F32 model with random blocks of the type (tests/oracle/gguf_retype.py),
// every matrix in one type on the small llama; on the small qwen3moe one file mixes them as
// the "dynamic" downloads do, a different type per expert tensor and layer (IQ_MIX).
const IQ_TYPES = ['iq2_xxs', 'iq2_xs', 'iq1_s', 'iq1_m'];
const IQ_MIX = ['--type', 'iq3_s', '--map', 'token_embd=tq1_0',
  '--map', 'blk.0.ffn_gate_exps=iq2_xxs', '--map', 'blk.0.ffn_up_exps=iq2_xs', '--map', 'blk.0.ffn_down_exps=iq1_s',
  '--map', 'blk.1.ffn_gate_exps=iq1_m', '--map', 'blk.1.ffn_up_exps=iq3_xxs', '--map', 'blk.1.ffn_down_exps=iq2_s'];
const SMALL = ['--layers', '2', '--dim', '256', '--ffn', '512', '--heads', '4', '--kv-heads', '2'];

const SHAPE = ['--layers', '4', '--dim', '256', '--ffn', '512', '--heads', '4', '--kv-heads', '2'];
const ARCHS = {
  // also Q5_K_M (Q5_K matrices, Q6_K output and the "more bits" layers' attn_v / ffn_down), on
  // the one-token sequences: the kernels' check (a long prompt adds only the noise above)
  llama: {vocab: 'ggml-vocab-llama-bpe.gguf', extra: ['--rope-scaling', 'llama3', '--untied'], batchedType: 'q4_k',
    singlesTypes: ['q5_k_m']},
  // Its Q8_0 / Q4_K files on the one-token sequences only: a 300-token prompt there runs the
  // same code as llama's Q8_0 / Q4_K prompts (same shape, same kernels) plus the two things
  // qwen2 adds, each checked on a prompt elsewhere: the q/k/v biases (F32 in every file,
  // added after the matmul whatever its type: qwen2's F32 / F16 prompts) and the tied output
  // from a quantised embedding (qwen3's Q8_0 / Q4_K prompts)
  qwen2: {vocab: 'ggml-vocab-qwen2.gguf', extra: ['--tied'], types: ['f32', 'f16'], singlesTypes: ['q8_0', 'q4_k'],
    batchedType: 'f16'},
  qwen3: {vocab: 'ggml-vocab-qwen2.gguf', extra: ['--head-dim', '128', '--tied'], batchedType: 'q8_0'},
  // Qwen3-30B-A3B's layer in small: 16 experts, 4 per token, untied output
  // Batched: 32 greedy steps, not 64; its eight sequences all part from llama.cpp's at a
  // near-tie by step 17 (routing flips, above), and past that point a greedy token is compared
  // to nothing
  qwen3moe: {vocab: 'ggml-vocab-qwen2.gguf', extra: ['--head-dim', '128', '--experts', '16', '--experts-used', '4',
    '--expert-ffn', '256', '--untied'], batchedType: 'q4_k', batchedGreedy: 32},
  // DeepSeek-V3-like: q-LoRA, multi-head latent attention, a leading dense layer, the sigmoid
  // router with its selection bias, 4 groups of which 2 are kept, routed scaling, a shared expert
  'deepseek2-v3': {arch: 'deepseek2', vocab: 'ggml-vocab-deepseek-llm.gguf', extra: ['--q-lora', '128', '--kv-lora', '256',
    '--nope-dim', '64', '--rope-dim', '32', '--v-dim', '64', '--experts', '16', '--experts-used', '4', '--expert-ffn', '256',
    '--shared-experts', '1', '--dense-layers', '1', '--router', 'sigmoid', '--expert-groups', '4', '--groups-used', '2',
    '--routed-scale', '2.5', '--untied'], types: ['f32'], singlesTypes: ['q8_0', 'q4_k'], batchedType: 'f32'},
  // DeepSeek-V2-Lite-like: no q-LoRA, the softmax router without renormalisation, 2 shared
  // experts, YaRN RoPE scaling (factor 40, as the released files)
  'deepseek2-v2': {arch: 'deepseek2', vocab: 'ggml-vocab-deepseek-llm.gguf', extra: ['--q-lora', '0', '--kv-lora', '256',
    '--nope-dim', '64', '--rope-dim', '32', '--v-dim', '64', '--experts', '16', '--experts-used', '4', '--expert-ffn', '128',
    '--shared-experts', '2', '--dense-layers', '1', '--router', 'softmax', '--expert-groups', '0', '--rope-scaling', 'yarn',
    '--untied'],
  types: ['f32', 'f16'], batchedType: 'f16'},
  // gpt-oss-20b's layer in small: a 16-token window on the even layers (the 160-token prompt
  // spans 10 windows and crosses a KV block), sinks, biases, YaRN, 8 experts of which 2 per
  // token with the clamped SwiGLU, a generated vocabulary of 100352 tokens (the o200k one, as
  // mkmodel writes it, is mkmodel.test.mjs's: its 201088 rows only made each position dearer
  // here, mostly on llama.cpp's side); --type mxfp4 is
  // MXFP4 experts with Q8_0 elsewhere. F32 on the prompt and batched. Its routing flips as
  // the qwen3moe one does, so the quantised types are checked on the one-token sequences,
  // with an F32 cache on both sides (singlesKv): with a sink the softmax of one key is no
  // longer 1, and llama.cpp's f16 one-query path (Q and V rounded to f16) would then differ
  // from tokenmill's f32 attention by far more than the kernels under test.
  'gpt-oss': {vocabArgs: ['--vocab-size', '100352'],
    shape: ['--preset', 'gpt-oss-20b', '--layers', '4', '--dim', '256', '--ffn', '256', '--heads', '4', '--kv-heads', '2',
      '--head-dim', '64'],
    extra: ['--experts', '8', '--experts-used', '2', '--expert-ffn', '128', '--window', '16'],
    types: ['f32'], singlesTypes: ['mxfp4', 'q8_0'], singlesKv: 'f32', batchedType: 'f32',
    // shorter than the others' (CI time): still 10 windows, across a pool block
    prompt: 160, greedy: 32, batchLens: [1, 17, 33, 140]},
  'llama-small': {arch: 'llama', vocabArgs: ['--vocab-size', '2048'], ids: 2000, shape: SMALL, extra: ['--tied'],
    types: [], singlesTypes: MORE_TYPES, oneStep: true},
  // the experts (and every other matrix) in Q3_K, as the Q3_K_M downloads of MoE models hold them
  'qwen3moe-small': {arch: 'qwen3moe', vocabArgs: ['--vocab-size', '2048'], ids: 2000, shape: SMALL,
    extra: ['--head-dim', '64', '--experts', '8', '--experts-used', '2', '--expert-ffn', '256', '--tied'],
    types: [], singlesTypes: ['q3_k'], oneStep: true},
  'llama-iq': {arch: 'llama', vocabArgs: ['--vocab-size', '2048'], ids: 2000, shape: SMALL, extra: ['--tied'],
    types: [], singlesTypes: IQ_TYPES, oneStep: true, retype: (type) => ['--type', type]},
  'qwen3moe-iq': {arch: 'qwen3moe', vocabArgs: ['--vocab-size', '2048'], ids: 2000, shape: SMALL,
    extra: ['--head-dim', '64', '--experts', '8', '--experts-used', '2', '--expert-ffn', '256', '--tied'],
    types: [], singlesTypes: ['iq_mix'], oneStep: true, retype: () => IQ_MIX},
};
const TYPES = ['f32', 'f16', 'q8_0', 'q4_k'];

const only = (process.env.ORACLE_ONLY ?? '').split(',').filter(Boolean);
const selected = (...names) => only.length === 0 || only.every((o) => names.some((n) => n.includes(o)));

const report = [];
after(() => {
  if (report.length === 0) return;
  fs.mkdirSync(gen, {recursive: true});
  fs.writeFileSync(path.join(gen, 'oracle-report.json'), JSON.stringify(report, null, 1) + '\n');
  console.log('oracle: max |Δ logprob| of the top-10 tokens, tokenmill vs llama.cpp (tolerance):');
  for (const r of report)
    console.log(`oracle:   ${r.arch.padEnd(6)} ${r.type.padEnd(5)} kv ${r.kv} ${r.test.padEnd(32)} ` +
      (r.median_diff != null ? `median ${r.median_diff.toExponential(2)} max ${r.max_diff.toExponential(2)}, llama.cpp vs itself median ${r.llama_self_median.toExponential(2)} (tol on median ${r.tol.toPrecision(2)})`
        : `max ${r.max_diff.toExponential(2)}, llama.cpp vs itself ${r.llama_self ? r.llama_self.toExponential(2) : 'not run'} (tol ${r.tol.toPrecision(2)}); greedy ${r.greedy.replace(/ < [0-9.]+\)/g, ')')}`));
});

// ---- helpers ------------------------------------------------------------------------------
function srcHash() {
  const h = crypto.createHash('sha256');
  const walk = (d) => {
    for (const e of fs.readdirSync(d, {withFileTypes: true}).sort((a, b) => a.name.localeCompare(b.name))) {
      const p = path.join(d, e.name);
      if (e.isDirectory()) walk(p);
      else if (/mkmodel|quant|gguf/.test(e.name) && /\.[ch]$/.test(e.name)) h.update(e.name).update(fs.readFileSync(p));
    }
  };
  walk(path.join(root, 'src'));
  return h.digest('hex');
}
const SRC = srcHash();

// The python with numpy that gguf-py needs (the retyped models), or null.
function findPython() {
  for (const py of ['python3', '/usr/bin/python3'])
    if (spawnSync(py, ['-c', 'import numpy'], {encoding: 'utf8'}).status === 0) return py;
  return null;
}
const python = findPython();

function model(arch, type, retype = true) {
  const a = ARCHS[arch];
  if (a.retype && retype) { // mkmodel's F32 model, rewritten by gguf_retype.py
    const base = model(arch, 'f32', false), script = path.join(root, 'tests/oracle/gguf_retype.py');
    const args = a.retype(type);
    const key = crypto.createHash('sha256').update(JSON.stringify([path.basename(base), args]))
      .update(fs.readFileSync(script)).digest('hex').slice(0, 12);
    const file = path.join(gen, `oracle-${arch}-${type}-${key}.gguf`);
    if (fs.existsSync(file)) return file;
    for (const f of fs.readdirSync(gen))
      if (f.startsWith(`oracle-${arch}-${type}-`) && f.endsWith('.gguf')) fs.rmSync(path.join(gen, f));
    const r = spawnSync(python, [script, base, ...args, '--seed', '1', '-o', file], {encoding: 'utf8'});
    assert.equal(r.status, 0, `gguf_retype.py ${args.join(' ')} failed: ${r.stderr}`);
    return file;
  }
  const args = ['mkmodel', '--arch', a.arch ?? arch, ...(a.shape ?? SHAPE), ...a.extra,
    ...(a.vocabArgs ?? ['--vocab', path.join(vocabDir, a.vocab)]), '--type', type, '--seed', '1'];
  const key = crypto.createHash('sha256').update(JSON.stringify([args.map((x) => x.replace(root, '')), SRC]))
    .digest('hex').slice(0, 12);
  const file = path.join(gen, `oracle-${arch}-${type}-${key}.gguf`);
  if (fs.existsSync(file)) return file;
  fs.mkdirSync(gen, {recursive: true});
  for (const f of fs.readdirSync(gen)) // drop stale versions of this model
    if (f.startsWith(`oracle-${arch}-${type}-`) && f.endsWith('.gguf')) fs.rmSync(path.join(gen, f));
  const tmp = `${file}.tmp${process.pid}`;
  const r = spawnSync(bin, [...args, '-o', tmp], {encoding: 'utf8'});
  assert.equal(r.status, 0, `tokenmill ${args.join(' ')} failed: ${r.stderr}`);
  fs.renameSync(tmp, file);
  return file;
}

// Random ids among the ordinary tokens (both vocabularies have >100k below their specials).
const randomSeq = (r, n) => Array.from({length: n}, () => r(100000));

// One llama_eval.mjs run, asynchronous: llama.cpp runs on one thread (LLAMA_THREADS), so a
// test starts its independent llama.cpp runs (the compared one and the self-difference one)
// side by side and the second core does the other instead of idling. Each run's numbers do
// not depend on the other (one thread each, nothing shared but the read-only model file).
function llamaEval(file, inFile, kv, extra = []) {
  return new Promise((resolve, reject) => {
    const ch = spawn(process.execPath, [path.join(root, 'tests/oracle/llama_eval.mjs'), '-m', file, '--input', inFile,
      '--threads', String(LLAMA_THREADS), '--kv', kv, ...extra], {env: {...process.env, UV_THREADPOOL_SIZE: '1'}});
    const out = [], err = [];
    ch.stdout.on('data', (d) => out.push(d));
    ch.stderr.on('data', (d) => err.push(d));
    ch.on('error', reject);
    ch.on('close', (code) => {
      if (code !== 0) reject(new Error(`llama_eval failed (exit ${code}): ${Buffer.concat(err)}`));
      else {
        try { resolve(JSON.parse(Buffer.concat(out).toString('utf8'))); } catch (e) { reject(e); }
      }
    });
  });
}

// Writes `input` to a fresh temporary file; returns [file, remove].
function inputFile(input) {
  const tmp = fs.mkdtempSync(path.join(gen, 'in-'));
  const inFile = path.join(tmp, 'in.json');
  fs.writeFileSync(inFile, JSON.stringify(input));
  return [inFile, () => fs.rmSync(tmp, {recursive: true})];
}

// llama.cpp against itself: the same input split differently (batched → unbatched; a prompt
// → one token per llama_decode). llamaNoiseRun starts it; llamaNoise returns the max
// |Δ logprob| over matching top-K tokens between that run (alt) and the compared one (ll).
async function llamaNoiseRun(file, input, kv) {
  const [inFile, remove] = inputFile({...input, batched: false, greedy: 1});
  try { return await llamaEval(file, inFile, kv, input.batched ? [] : ['--batch-size', '1']); } finally { remove(); }
}
function llamaNoise(alt, ll) {
  let m = 0;
  alt.seqs.forEach((a, s) => a.top.forEach((t, i) => t.forEach(([id, lp]) => {
    const o = ll.seqs[s].top[i].find((x) => x[0] === id);
    if (o) m = Math.max(m, Math.abs(o[1] - lp));
  })));
  return m;
}

// tokenmill's eval, run to the end (alone: its 2 threads are under test and get both cores),
// and llama.cpp's on the same input, for the caller to start once no tokenmill run is left:
// returns {tm, llama: () => a promise of llama_eval's output}.
function runBoth(file, input, kv) {
  const [inFile, remove] = inputFile(input);
  const tm = spawnSync(bin, ['eval', '-m', file, '--input', inFile, '--threads', String(THREADS), '--kv', kv],
    {encoding: 'utf8', maxBuffer: 256 << 20});
  if (tm.status !== 0) remove();
  assert.equal(tm.status, 0, `tokenmill eval failed: ${tm.stderr}`);
  return {tm: JSON.parse(tm.stdout), llama: () => llamaEval(file, inFile, kv).finally(remove)};
}

// Compares one sequence. Returns {maxDiff, positions, greedy: 'identical' | 'near-tie at k ...'}.
function compareSeq(tmS, llS, tol, label) {
  assert.equal(tmS.top.length, llS.top.length, `${label}: number of positions`);
  let maxDiff = 0, where = -1;
  const perPos = [];
  for (let i = 0; i < llS.top.length; i++) {
    let posMax = 0;
    const ref = llS.top[i], got = tmS.top[i];
    assert.equal(got.length, ref.length, `${label} position ${i}: top-K length`);
    const gotMap = new Map(got.map(([id, lp]) => [id, lp]));
    const refMap = new Map(ref.map(([id, lp]) => [id, lp]));
    const gotLast = got[got.length - 1][1], refLast = ref[ref.length - 1][1];
    for (const [id, lp] of ref) {
      if (gotMap.has(id)) {
        const d = Math.abs(gotMap.get(id) - lp);
        posMax = Math.max(posMax, d);
        if (d > maxDiff) { maxDiff = d; where = i; }
      } else { // only acceptable at the top-K boundary
        assert.ok(lp <= gotLast + tol, `${label} position ${i}: llama.cpp's token ${id} (logprob ${lp}) ` +
          `missing from tokenmill's top-${TOP} (whose last is ${gotLast})`);
      }
    }
    for (const [id, lp] of got)
      if (!refMap.has(id))
        assert.ok(lp <= refLast + tol, `${label} position ${i}: tokenmill's token ${id} (logprob ${lp}) ` +
          `missing from llama.cpp's top-${TOP} (whose last is ${refLast})`);
    perPos.push(posMax);
  }
  assert.ok(maxDiff <= tol, `${label}: max |Δ logprob| ${maxDiff} at position ${where} exceeds ${tol}`);

  let greedy = 'identical';
  const k = llS.greedy.findIndex((t, j) => t !== tmS.greedy[j]);
  assert.equal(tmS.greedy.length, llS.greedy.length, `${label}: greedy length`);
  if (k >= 0) {
    const dist = llS.greedy_top[k];
    const gap = dist[0][1] - dist[1][1];
    const tmTok = dist.find(([id]) => id === tmS.greedy[k]);
    assert.ok(gap < tol && tmTok && dist[0][1] - tmTok[1] < tol,
      `${label}: greedy continuations differ at step ${k} (llama.cpp ${llS.greedy[k]}, tokenmill ` +
      `${tmS.greedy[k]}) where llama.cpp's top-2 gap is ${gap.toExponential(2)}, not a near-tie (tol ${tol})`);
    greedy = `identical up to a near-tie at step ${k} (llama.cpp top-2 gap ${gap.toExponential(2)} < ${tol})`;
  }
  return {maxDiff, positions: llS.top.length, greedy, perPos};
}

async function check(arch, type, batched) {
  const file = model(arch, type);
  const r = rng(batched ? 1000 + TYPES.indexOf(type) : 1);
  const A = ARCHS[arch], greedyN = (batched ? A.batchedGreedy : null) ?? A.greedy ?? GREEDY;
  const seqs = batched ? (A.batchLens ?? BATCH_LENS).map((n) => randomSeq(r, n)) : [randomSeq(r, A.prompt ?? PROMPT)];
  const kv = KV[type];
  const input = {seqs, top: TOP, greedy: greedyN, batched};
  const both = runBoth(file, input, kv), tm = both.tm;
  // F32 weights with F32 KV have no rounding flips: TOL alone (the self-difference is ~1e-5).
  const [ll, alt] = await Promise.all([both.llama(), type === 'f32' ? null : llamaNoiseRun(file, input, kv)]);
  assert.equal(tm.seqs.length, seqs.length);
  if (batched) assert.equal(ll.oracle.decode_calls, 2 * greedyN, 'llama.cpp did not batch the sequences together');
  const noise = alt ? llamaNoise(alt, ll) : 0;
  const tol = Math.max(TOL[type], NOISE_FACTOR * noise);
  let maxDiff = 0, positions = 0;
  const greedy = [];
  seqs.forEach((_, s) => {
    const c = compareSeq(tm.seqs[s], ll.seqs[s], tol, `${arch} ${type}${batched ? ` seq ${s}` : ''}`);
    maxDiff = Math.max(maxDiff, c.maxDiff);
    positions += c.positions;
    if (c.greedy !== 'identical') greedy.push(batched ? `seq ${s}: ${c.greedy}` : c.greedy);
  });
  const g = greedy.length ? greedy.join('; ') : `${greedyN} tokens identical${batched ? ` on all ${seqs.length}` : ''}`;
  report.push({arch, type, kv, test: batched ? `batched x${seqs.length}` : `prompt ${seqs[0].length}`, max_diff: maxDiff, llama_self: noise,
    tol, positions, greedy: g, llama: ll.oracle});
}

// 32 one-token sequences, once in one step (the batched matmul paths) and once one by one (the
// single-row decode paths): nothing propagates between positions, so a rounding flip touches
// one position only; the median position must agree tightly (a kernel error would move them
// all).
async function checkSingles(arch, type) {
  const file = model(arch, type);
  const r = rng(77);
  const seqs = Array.from({length: N_SINGLES}, () => ARCHS[arch].ids ? [r(ARCHS[arch].ids)] : randomSeq(r, 1));
  const kv = ARCHS[arch].singlesKv ?? KV[type];
  const modes = ARCHS[arch].oneStep ? [true] : [true, false];
  const evals = modes.map((batched) => ({batched, ...runBoth(file, {seqs, top: TOP, greedy: 1, batched}, kv)}));
  const runs = await Promise.all(evals.map(async ({batched, tm, llama}) => ({batched, tm, ll: await llama()})));
  // llama.cpp against itself: its single-token steps take other kernels than a 32-token step
  // (for F16 weights the activations are rounded to f16 one way and not the other), which
  // moves the median as much as a rounding difference of ours could; the tolerance is the
  // larger of MEDIAN_TOL and 1.5x that self-difference
  const self = runs.length < 2 ? [0] : seqs.map((_, s) => compareSeq(runs[1].ll.seqs[s], runs[0].ll.seqs[s], 1e9,
    `${arch} ${type} llama.cpp self ${s}`).perPos[0]).sort((a, b) => a - b);
  const selfMed = self[self.length >> 1];
  const tol = Math.max(MEDIAN_TOL, NOISE_FACTOR * selfMed);
  for (const {batched, tm, ll} of runs) {
    const per = seqs.map((_, s) => compareSeq(tm.seqs[s], ll.seqs[s], Math.max(TOL[type], 1),
      `${arch} ${type} single ${s}`).perPos[0]).sort((a, b) => a - b);
    const med = per[per.length >> 1];
    const what = `${N_SINGLES} one-token seqs ${batched ? 'in one step' : 'one by one'}`;
    report.push({arch, type, kv, test: what, median_diff: med, max_diff: per.at(-1), llama_self_median: selfMed, tol,
      llama: ll.oracle});
    assert.ok(med <= tol, `${arch} ${type}: median |Δ logprob| over ${what} ${med} > ${tol} ` +
      `(llama.cpp one step vs one by one: median ${selfMed})`);
  }
}

// ---- tests --------------------------------------------------------------------------------
const haveBin = fs.existsSync(bin);
const haveVocab = fs.existsSync(path.join(vocabDir, 'ggml-vocab-qwen2.gguf'));
const skip = !haveBin ? 'build/tokenmill not built' : !haveVocab ? 'no tests/data/llama.cpp (scripts/fetch-testdata.sh)' : false;

for (const arch of Object.keys(ARCHS)) {
  for (const type of ARCHS[arch].types ?? TYPES) {
    if (!selected(arch, type, 'single')) continue;
    test(`oracle ${arch} ${type}: ${ARCHS[arch].prompt ?? PROMPT}-token prompt top-${TOP} logprobs and greedy ` +
      `${ARCHS[arch].greedy ?? GREEDY} match llama.cpp`,
      {skip}, () => check(arch, type, false));
    if (type !== 'f32')
      test(`oracle ${arch} ${type}: ${N_SINGLES} one-token sequences match llama.cpp`, {skip}, () => checkSingles(arch, type));
  }
  const skipPy = ARCHS[arch].retype && !python ? 'no python3 with numpy (scripts/deps.sh installs python3-numpy)' : false;
  for (const type of ARCHS[arch].singlesTypes ?? [])
    if (selected(arch, type, 'single'))
      test(`oracle ${arch} ${type}: ${N_SINGLES} one-token sequences match llama.cpp`, {skip: skip || skipPy},
        () => checkSingles(arch, type));
  const bt = ARCHS[arch].batchedType;
  if (bt && selected(arch, bt, 'batched'))
    test(`oracle ${arch} ${bt}: ${(ARCHS[arch].batchLens ?? BATCH_LENS).length} sequences batched in one step match llama.cpp`,
      {skip}, () => check(arch, bt, true));
}
