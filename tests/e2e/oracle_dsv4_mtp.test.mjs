// oracle_dsv4_mtp: DeepSeek V4's MTP drafting (an MTP-only file beside its trunk, both written by
// tests/oracle/gguf_dsv4.py with llama.cpp's gguf-py) against llama.cpp's own draft-mtp rounds
// (tests/oracle/dsv4_mtp_llama.cpp, built here against the pinned node-llama-cpp's prebuilt
// libllama: its JavaScript API has no MTP context). Both catch the MTP block up on every target
// step (entry p: token p with the target's streams of p - 1), draft N tokens by chaining the
// block from the target's greedy token, and accept what the target's greedy choices confirm;
// every round's anchor, position and drafted tokens must be equal and each draft's
// log-probability within TOL. The prompts cross the 16-position window (40 and 70 tokens). The
// model's indexer keys are 128 wide against heads of 64: the pinned llama.cpp's MTP context
// divides by zero when they are equal (gguf_dsv4.py's comment says why). The same for the pair
// `tokenmill mkmodel --arch deepseek4 --mtp-out` writes, at every weight type mkmodel writes.
import {test, after} from 'node:test';
import assert from 'node:assert/strict';
import {spawnSync} from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';

import {root, bin, gen, rng, llamaDriver, llamaDriverSkip} from './oracle_common.mjs';
import {dsv4Model, skip as skipModel} from './dsv4_model.mjs';

const harness = path.join(root, 'tests/oracle/dsv4_mtp_llama.cpp');
const TOL = 1e-4;
const N_DRAFT = 4, ROUNDS = 6;
const r = rng(21);
const PROMPTS = [Array.from({length: 40}, () => 10 + r(7900)), Array.from({length: 70}, () => 10 + r(7900)), [5]];

const skip = skipModel || llamaDriverSkip;

const report = [];
after(() => {
  for (const line of report) console.log(`oracle_dsv4_mtp: ${line}`);
});

function run(cmd, args, what) {
  const res = spawnSync(cmd, args, {encoding: 'utf8', maxBuffer: 1 << 26});
  assert.equal(res.status, 0, `${what} failed: ${res.stderr}`);
  return res.stdout;
}

const harnessBin = () => llamaDriver(harness, 'dsv4_mtp_llama');

const rounds = (text) => text.trim().split('\n').filter((l) => l).map((l) => JSON.parse(l));

test('deepseek4 MTP drafts from an MTP-only file equal llama.cpp draft-mtp\'s, round by round', {skip, timeout: 300000}, () => {
  const t = dsv4Model('f32', ['--idx-dim', '128'], '-idx128');
  const mtp = dsv4Model('f32', ['--idx-dim', '128', '--mtp'], '-idx128-mtp');
  const dir = fs.mkdtempSync(path.join(gen, 'in-dsv4-mtp-'));
  const inFile = path.join(dir, 'in.json');
  fs.writeFileSync(inFile, JSON.stringify({seqs: PROMPTS, n_draft: N_DRAFT, rounds: ROUNDS, mode: 'mtp'}));
  const tm = rounds(run(bin, ['eval', '-m', t, '--draft', mtp, '--input', inFile, '--kv', 'f32', '--threads', '1'],
    'tokenmill eval --draft (mtp)'));
  fs.rmSync(dir, {recursive: true, force: true});
  let max = 0, slots = 0, accepted = 0;
  PROMPTS.forEach((p, si) => {
    const ref = rounds(run(harnessBin(), [t, mtp, String(N_DRAFT), String(ROUNDS), p.join(',')], 'dsv4_mtp_llama'));
    const got = tm.filter((x) => x.seq === si);
    assert.equal(got.length, ref.length, `prompt ${si}: rounds`);
    for (let k = 0; k < ref.length; k++) {
      const a = got[k], b = ref[k], label = `prompt ${si} round ${k}`;
      assert.equal(a.pos, b.pos, `${label}: position`);
      assert.equal(a.anchor, b.anchor, `${label}: anchor`);
      assert.equal(a.slots.length, N_DRAFT, `${label}: slots`);
      for (let j = 0; j < N_DRAFT; j++) {
        assert.equal(a.slots[j].token, b.slots[j].token, `${label} slot ${j}: token`);
        max = Math.max(max, Math.abs(a.slots[j].logprob - b.slots[j].logprob));
        slots++;
      }
      if (k + 1 < ref.length) accepted += ref[k + 1].pos - b.pos - 1;
    }
  });
  assert.ok(max < TOL, `log-probability differs by ${max}`);
  report.push(`${slots} drafted tokens over ${PROMPTS.length} prompts x ${ROUNDS} rounds equal, log-probabilities within ${max.toExponential(1)}; ${accepted} drafts accepted by the target`);
});

// mkmodel's pair: `mkmodel --arch deepseek4 --mtp-out FILE` writes the model and its MTP-only
// file; llama.cpp's draft-mtp loads both and drafts what tokenmill drafts, at F32 and in the
// published files' weight types (MXFP4 experts with Q8_0 elsewhere, a K-quant mix); the keys
// and tensors llama.cpp's loader requires of the MTP-only file are the converter's.
// Where the two quantise activations differently (llama.cpp's Q8_0 rows for quantised weights)
// a draft may flip at a close call: the round is compared up to a
// differing token only when both sides drafted it with probability below CLOSE, and the
// log-probabilities within the type's tolerance.
const MK_TYPES = [['f32', 1e-4], ['mxfp4', 0.25], ['q8_0', 0.25], ['q4_k_m', 0.5]];
const CLOSE = Math.log(0.6);
// the trunk's greedy token may part from llama.cpp's where its two best are both this likely
// (quantised random weights amplify rounding order: docs/deepseek4.md)
const NEAR_TIE = Math.log(0.2);
test('mkmodel deepseek4 --mtp-out: the pair loads in llama.cpp draft-mtp and tokenmill, and the drafts agree',
  {skip, timeout: 600000}, () => {
    const dir = fs.mkdtempSync(path.join(gen, 'mk-dsv4-mtp-'));
    try {
      const inFile = path.join(dir, 'in.json'), evalFile = path.join(dir, 'eval.json');
      const prompts = PROMPTS.slice(0, 2);
      fs.writeFileSync(inFile, JSON.stringify({seqs: prompts, n_draft: N_DRAFT, rounds: ROUNDS, mode: 'mtp'}));
      for (const [type, tol] of MK_TYPES) {
        const t = path.join(dir, `t-${type}.gguf`), mtp = path.join(dir, `mtp-${type}.gguf`);
        run(bin, ['mkmodel', '--arch', 'deepseek4', '--indexer-dim', '128', '--vocab-size', '8192', '--type', type,
          '--seed', '4', '--threads', '2', '-o', t, '--mtp-out', mtp], `mkmodel --type ${type}`);
        const tm = rounds(run(bin, ['eval', '-m', t, '--draft', mtp, '--input', inFile, '--kv', 'f32', '--threads', '1'],
          `tokenmill eval --draft (mkmodel ${type})`));
        let max = 0, slots = 0, compared = 0;
        prompts.forEach((p, si) => {
          const ref = rounds(run(harnessBin(), [t, mtp, String(N_DRAFT), String(ROUNDS), p.join(',')], `dsv4_mtp_llama ${type}`));
          const got = tm.filter((x) => x.seq === si);
          assert.equal(got.length, ref.length, `${type} prompt ${si}: rounds`);
          for (let k = 0; k < ref.length; k++) {
            const label = `${type} prompt ${si} round ${k}`;
            assert.equal(got[k].pos, ref[k].pos, `${label}: position`);
            if (tol > 1e-3 && got[k].anchor !== ref[k].anchor) {
              // the trunk's greedy token parted at a near tie: both anchors are tokenmill's two
              // most likely tokens there, each at least NEAR_TIE; the rounds after it differ
              const seq = p.concat(got.slice(0, k).map((x) => x.anchor));
              fs.writeFileSync(evalFile, JSON.stringify({seqs: [seq], top: 2, greedy: 1, batched: false}));
              const top = JSON.parse(run(bin, ['eval', '-m', t, '--input', evalFile, '--kv', 'f32', '--threads', '1'],
                `tokenmill eval (mkmodel ${type})`)).seqs[0].top.at(-1);
              const ids = top.map(([id]) => id).sort(), want = [got[k].anchor, ref[k].anchor].sort();
              assert.deepEqual(ids, want, `${label}: anchor ${got[k].anchor} against llama.cpp's ${ref[k].anchor} is not a near tie (top ${JSON.stringify(top)})`);
              assert.ok(top.every(([, lp]) => lp >= NEAR_TIE), `${label}: anchors ${want} apart by more than a near tie (${JSON.stringify(top)})`);
              report.push(`mkmodel ${type}: prompt ${si} parted at a near tie in round ${k} (${JSON.stringify(top)})`);
              break;
            }
            assert.equal(got[k].anchor, ref[k].anchor, `${label}: anchor`);
            compared++;
            for (let j = 0; j < N_DRAFT; j++) {
              const a = got[k].slots[j], b = ref[k].slots[j];
              if (tol > 1e-3 && a.token !== b.token && a.logprob < CLOSE && b.logprob < CLOSE) break;   /* a close call */
              assert.equal(a.token, b.token, `${label} slot ${j}: token`);
              max = Math.max(max, Math.abs(a.logprob - b.logprob));
              slots++;
            }
          }
        });
        assert.ok(max < tol, `${type}: log-probability differs by ${max}`);
        assert.ok(compared >= ROUNDS, `${type}: only ${compared} rounds compared before near ties`);
        report.push(`mkmodel ${type}: ${slots} drafted tokens equal llama.cpp's, log-probabilities within ${max.toExponential(1)}`);
      }
    } finally {
      fs.rmSync(dir, {recursive: true, force: true});
    }
  });

// Every other weight type mkmodel writes for deepseek4: the pair loads in llama.cpp's draft-mtp
// and in tokenmill, and both draft every round (the types above compare the drafts).
const ALL_TYPES = ['f16', 'bf16', 'q4_0', 'q4_1', 'q5_0', 'q5_1', 'q2_k', 'q3_k', 'q3_k_m', 'q4_k', 'q5_k', 'q5_k_m',
  'q6_k', 'iq4_nl', 'iq4_xs', 'iq3_xxs', 'iq3_s', 'iq2_s', 'tq1_0', 'tq2_0'];
test('mkmodel deepseek4 --mtp-out at every other weight type: both load the pair and draft', {skip, timeout: 600000}, () => {
  const dir = fs.mkdtempSync(path.join(gen, 'mk-dsv4-mtp-types-'));
  try {
    const p = PROMPTS[0].slice(0, 20);
    const inFile = path.join(dir, 'in.json');
    fs.writeFileSync(inFile, JSON.stringify({seqs: [p], n_draft: 2, rounds: 2, mode: 'mtp'}));
    for (const type of ALL_TYPES) {
      const t = path.join(dir, 't.gguf'), mtp = path.join(dir, 'mtp.gguf');
      run(bin, ['mkmodel', '--arch', 'deepseek4', '--indexer-dim', '128', '--vocab-size', '8192', '--type', type,
        '--seed', '4', '--threads', '1', '-o', t, '--mtp-out', mtp], `mkmodel --type ${type}`);
      const tm = rounds(run(bin, ['eval', '-m', t, '--draft', mtp, '--input', inFile, '--threads', '1'], `tokenmill ${type}`));
      const ref = rounds(run(harnessBin(), [t, mtp, '2', '2', p.join(',')], `dsv4_mtp_llama ${type}`));
      assert.equal(tm.length, 2, `${type}: tokenmill's rounds`);
      assert.equal(ref.length, 2, `${type}: llama.cpp's rounds`);
      for (const x of [...tm, ...ref]) assert.equal(x.slots.length, 2, `${type}: drafts of a round`);
    }
    report.push(`mkmodel ${ALL_TYPES.length} more weight types: both load the pair and draft`);
  } finally {
    fs.rmSync(dir, {recursive: true, force: true});
  }
});
