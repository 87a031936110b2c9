// oracle_dflash: tokenmill's DFlash / DSpark drafter (engine_dflash) against llama.cpp's own
// (tests/oracle/dflash_llama.cpp, built here against the pinned node-llama-cpp's prebuilt
// libllama, as draft-dflash / draft-dspark drive it): the same rounds of injection, block pass,
// greedy verification and rollback, on random drafters llama.cpp's gguf-py writes
// (tests/oracle/gguf_dflash.py) for an mkmodel qwen3 target.
//
// Per round and drafted slot: the token equal (up to a near-tie: both engines' top
// log-probabilities within TOL of each other, after which the block's Markov chain and the
// rounds after it are not compared), its log-probability and the confidence head's value within
// TOL. Cases: DSpark with the confidence head (anchor-first blocks of 3 and 5 slots, and 7,
// longer than the trained block of 6: the Markov head is then skipped on both sides), DSpark
// without the confidence head, with sample_from_anchor false, with its own embedding and head,
// and DFlash (no Markov head, [last, mask x K]). tokenmill runs all prompts of a case in one
// batched pass per round; llama.cpp one prompt at a time.
//
// DSpark drafters with the DeepSeek V4 backbone (tests/oracle/gguf_dspark_v4.py: hyper-connections,
// V4 attention with sinks over a sliding window, MoE; conversion/deepseek.py's
// DeepseekV4DSparkModel) for the gguf_dsv4.py V4 target, reading the mean of its streams at
// layer 1 and after its last layer: the same comparison, with the Markov and confidence heads
// (blocks of 3 and 5, and 7 past the trained 6), without the confidence head, without the
// Markov head (DFlash rounds), with its own head, and a window of 8 that the prompts cross.
//
// Mismatched drafters are refused by name: another width (llama.cpp refuses it too: fc's
// shape), a target layer the model lacks, another vocabulary (and `serve --draft` refuses the
// first the same way; serving is spec_dflash.test.mjs). F32 weights and KV on both sides. Needs python3 with
// numpy and g++; skipped without them. Models and the harness are cached under tests/data/gen/.
import {test, after} from 'node:test';
import assert from 'node:assert/strict';
import {spawnSync} from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import {root, bin, gen, oracleFiles, llamaDriver, llamaDriverSkip} from './oracle_common.mjs';
import {dsv4Model, skip as skipV4Model} from './dsv4_model.mjs';

const script = path.join(root, 'tests/oracle/gguf_dflash.py');
const harness = path.join(root, 'tests/oracle/dflash_llama.cpp');
const TOL = 2e-3;
const PROMPTS = [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [17, 300, 42, 1999, 5, 5, 5, 812, 64, 9, 1000, 1500, 7, 3, 11, 250],
  [77, 78, 79]];
const ROUNDS = 4;

const {python, skip: skipPy, cached} = oracleFiles([script, path.join(root, 'tests/oracle/gguf_common.py')]);
const skip = skipPy || llamaDriverSkip;

const report = [];
after(() => {
  for (const r of report) console.log(`oracle_dflash: ${r}`);
});

function run(cmd, args, what) {
  const r = spawnSync(cmd, args, {encoding: 'utf8', maxBuffer: 1 << 26});
  assert.equal(r.status, 0, `${what} failed: ${r.stderr}`);
  return r.stdout;
}

const harnessBin = () => llamaDriver(harness, 'dflash_llama');

const target = () => cached('dflash-target', (tmp) => run(bin, ['mkmodel', '--arch', 'qwen3', '--layers', '4', '--dim', '256',
  '--ffn', '512', '--heads', '4', '--kv-heads', '2', '--head-dim', '64', '--vocab-size', '2048', '--tied', '--type', 'f32',
  '--seed', '1', '-o', tmp], 'mkmodel'));
const drafter = (name, args, t = target()) => cached(`dflash-${name}`, (tmp) =>
  run(python, [script, '--target', t, ...args, '-o', tmp], `gguf_dflash ${name}`));

function rounds(text) {
  return text.trim().split('\n').filter((l) => l).map((l) => JSON.parse(l));
}

// tokenmill's rounds for all prompts at once, llama.cpp's per prompt; compared round by round
// noHead: a block longer than the trained one, where both skip the Markov and confidence heads
// (llama.cpp's confidence rows are then zeros, tokenmill says -1: none)
function compare(name, file, nDraft, mode, noHead = false, t = target()) {
  const dir = fs.mkdtempSync(path.join(gen, 'in-dflash-'));
  const inFile = path.join(dir, 'in.json');
  fs.writeFileSync(inFile, JSON.stringify({seqs: PROMPTS, n_draft: nDraft, rounds: ROUNDS, mode}));
  const tm = rounds(run(bin, ['eval', '-m', t, '--draft', file, '--input', inFile, '--kv', 'f32', '--threads', '1'],
    'tokenmill eval --draft'));
  fs.rmSync(dir, {recursive: true, force: true});
  let slots = 0, ties = 0;
  PROMPTS.forEach((p, si) => {
    const ref = rounds(run(harnessBin(), [t, file, String(nDraft), String(ROUNDS), p.join(','), mode], 'dflash_llama'));
    const got = tm.filter((r) => r.seq === si);
    assert.equal(got.length, ref.length, `${name} prompt ${si}: rounds`);
    outer: for (let r = 0; r < ref.length; r++) {
      const a = got[r], b = ref[r], label = `${name} prompt ${si} round ${r}`;
      assert.equal(a.pos, b.pos, `${label}: position`);
      assert.equal(a.anchor, b.anchor, `${label}: anchor`);
      assert.equal(a.slots.length, b.slots.length, `${label}: slots`);
      for (let j = 0; j < b.slots.length; j++) {
        const x = a.slots[j], y = b.slots[j];
        if (x.token !== y.token) {
          assert.ok(Math.abs(x.logprob - y.logprob) < TOL,
            `${label} slot ${j}: token ${x.token} (${x.logprob}) against llama.cpp's ${y.token} (${y.logprob})`);
          ties++;
          break outer;   // the chain (and the acceptance) go on from another token
        }
        assert.ok(Math.abs(x.logprob - y.logprob) < TOL, `${label} slot ${j}: logprob ${x.logprob} vs ${y.logprob}`);
        if (noHead) assert.ok(x.conf === -1 && y.conf === 0, `${label} slot ${j}: confidence ${x.conf} vs ${y.conf}`);
        else assert.ok(Math.abs(x.conf - y.conf) < TOL, `${label} slot ${j}: confidence ${x.conf} vs ${y.conf}`);
        slots++;
      }
    }
  });
  report.push(`${name} (${mode}, ${nDraft} drafts): ${slots} slots equal${ties ? `, ${ties} near-ties` : ''}`);
  assert.ok(slots >= PROMPTS.length * ROUNDS * Math.min(nDraft, 3) / 2, `${name}: only ${slots} slots compared`);
  return tm;
}

test('DSpark with the confidence head: tokens, log-probs and confidences as llama.cpp\'s', {skip}, () => {
  const f = drafter('dspark', ['--block', '6', '--markov', '16', '--conf']);
  for (const k of [3, 5]) {
    const tm = compare(`dspark-conf block ${k}`, f, k, 'dspark');
    const confs = tm.flatMap((r) => r.slots.map((s) => s.conf));
    assert.ok(confs.every((c) => c > 0 && c < 1), 'confidences in (0, 1)');
  }
  compare('dspark-conf block 7 (past the trained 6)', f, 7, 'dspark', true);
});

test('DSpark without the confidence head, without anchor sampling, with its own head', {skip}, () => {
  compare('dspark-noconf', drafter('dspark-noconf', ['--block', '6', '--markov', '8']), 4, 'dspark');
  compare('dspark-noanchor', drafter('dspark-noanchor', ['--block', '6', '--markov', '8', '--conf', '--anchor', 'false']),
    4, 'dspark');
  compare('dspark-ownhead', drafter('dspark-ownhead', ['--block', '8', '--markov', '8', '--conf', '--own-head',
    '--layers', '1', '--seed', '3']), 5, 'dspark');
});

test('DFlash (no Markov head): [last, mask x K] blocks as llama.cpp\'s', {skip}, () => {
  const f = drafter('dflash', ['--block', '6']);
  compare('dflash block 4', f, 4, 'dflash');
  compare('dflash block 2', f, 2, 'dflash');
});

const v4Script = path.join(root, 'tests/oracle/gguf_dspark_v4.py');
const v4Files = oracleFiles([v4Script, path.join(root, 'tests/oracle/gguf_dsv4.py'),
  path.join(root, 'tests/oracle/gguf_common.py')]);
const skipV4 = skip || skipV4Model || v4Files.skip;
const v4Drafter = (name, args) => v4Files.cached(`dspark-v4-${name}`, (tmp) =>
  run(v4Files.python, [v4Script, '--target', dsv4Model(), ...args, '-o', tmp], `gguf_dspark_v4 ${name}`));

test('DSpark with the DeepSeek V4 backbone on a V4 target: as llama.cpp\'s', {skip: skipV4}, () => {
  const t = dsv4Model();
  const f = v4Drafter('conf', ['--block', '6', '--markov', '16', '--conf']);
  for (const k of [3, 5]) {
    const tm = compare(`v4 dspark-conf block ${k}`, f, k, 'dspark', false, t);
    const confs = tm.flatMap((r) => r.slots.map((s) => s.conf));
    assert.ok(confs.every((c) => c > 0 && c < 1), 'confidences in (0, 1)');
  }
  compare('v4 dspark-conf block 7 (past the trained 6)', f, 7, 'dspark', true, t);
  compare('v4 dspark-noconf window 8', v4Drafter('noconf-w8', ['--block', '6', '--markov', '8', '--window', '8']), 4,
    'dspark', false, t);
  compare('v4 dspark-ownhead', v4Drafter('ownhead', ['--block', '8', '--markov', '8', '--conf', '--own-head',
    '--layers', '1', '--seed', '3']), 5, 'dspark', false, t);
  const df = v4Drafter('dflash', ['--block', '6']);
  compare('v4 dflash block 4', df, 4, 'dflash', false, t);
  compare('v4 dflash block 2', df, 2, 'dflash', false, t);
});

test('V4 and Qwen3 drafters are refused beside the other family\'s target', {skip: skipV4}, () => {
  const dir = fs.mkdtempSync(path.join(gen, 'in-dflash-'));
  const inFile = path.join(dir, 'in.json');
  fs.writeFileSync(inFile, JSON.stringify({seqs: [[1, 2, 3]], n_draft: 3, rounds: 1, mode: 'dspark'}));
  const evalWith = (m, file) => spawnSync(bin, ['eval', '-m', m, '--draft', file, '--input', inFile, '--threads', '1'],
    {encoding: 'utf8'});
  let r = evalWith(dsv4Model(), v4Drafter('deep', ['--target-layers', '1,5']));
  assert.equal(r.status, 1);
  assert.match(r.stderr, /target layers: the drafter reads layer 5, the model has 4 \(0\.\.4\)/);
  r = evalWith(target(), v4Drafter('conf', ['--block', '6', '--markov', '16', '--conf']));
  assert.equal(r.status, 1);
  assert.match(r.stderr, /DeepSeek V4 backbone drafts for a deepseek4 model, not 'qwen3'/);
  r = evalWith(dsv4Model(), drafter('dflash', ['--block', '6']));
  assert.equal(r.status, 1);
  assert.match(r.stderr, /Qwen3 backbone drafts for a decoder .* not 'deepseek4'/);
  fs.rmSync(dir, {recursive: true, force: true});
});

test('a drafter that does not fit the model is refused by name, by eval and by serve', {skip}, () => {
  const t = target();
  const dir = fs.mkdtempSync(path.join(gen, 'in-dflash-'));
  const inFile = path.join(dir, 'in.json');
  fs.writeFileSync(inFile, JSON.stringify({seqs: [[1, 2, 3]], n_draft: 3, rounds: 1, mode: 'dspark'}));
  const evalWith = (file) => spawnSync(bin, ['eval', '-m', t, '--draft', file, '--input', inFile, '--threads', '1'],
    {encoding: 'utf8'});
  const narrow = drafter('narrow', ['--dim', '128', '--heads', '2', '--kv-heads', '1']);
  let r = evalWith(narrow);
  assert.equal(r.status, 1);
  assert.match(r.stderr, /fc\.weight reads 2 target layers of width 256, but the drafter's width is 128/);
  // llama.cpp refuses it too
  const h = spawnSync(harnessBin(), [t, narrow, '3', '1', '1,2,3', 'dspark'], {encoding: 'utf8'});
  assert.notEqual(h.status, 0);
  r = evalWith(drafter('deep', ['--target-layers', '1,4']));
  assert.equal(r.status, 1);
  assert.match(r.stderr, /target layers: the drafter reads layer 4, the model has 4 \(0\.\.3\)/);
  const small = cached('dflash-target-small', (tmp) => run(bin, ['mkmodel', '--arch', 'qwen3', '--layers', '4', '--dim', '256',
    '--ffn', '512', '--heads', '4', '--kv-heads', '2', '--head-dim', '64', '--vocab-size', '1024', '--tied', '--type', 'f32',
    '--seed', '1', '-o', tmp], 'mkmodel'));
  r = evalWith(drafter('othervocab', ['--block', '6'], small));
  assert.equal(r.status, 1);
  assert.match(r.stderr, /vocabulary: the drafter has 1024 tokens, the model 2048/);
  r = spawnSync(bin, ['serve', '-m', t, '--draft', narrow, '--host', '127.0.0.1', '--port', '0', '--threads', '1'],
    {encoding: 'utf8', timeout: 60000});
  assert.notEqual(r.status, 0);
  assert.match(r.stderr, /width/);
  fs.rmSync(dir, {recursive: true, force: true});
});
