// oracle_dsv4_mtp: DeepSeek V4's MTP drafting (an MTP-only file beside its trunk, both written by
// tests/oracle/gguf_dsv4.py with llama.cpp's gguf-py) against llama.cpp's own draft-mtp rounds
// (tests/oracle/dsv4_mtp_llama.cpp, built here against the pinned node-llama-cpp's prebuilt
// libllama: its JavaScript API has no MTP context). Both catch the MTP block up on every target
// step (entry p: token p with the target's streams of p - 1), draft N tokens by chaining the
// block from the target's greedy token, and accept what the target's greedy choices confirm;
// every round's anchor, position and drafted tokens must be equal and each draft's
// log-probability within TOL. The prompts cross the 16-position window (40 and 70 tokens). The
// model's indexer keys are 128 wide against heads of 64: the pinned llama.cpp's MTP context
// divides by zero when they are equal (gguf_dsv4.py's comment says why).
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
