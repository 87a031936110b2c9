// dsv4_model: the small DeepSeek V4 model (`deepseek4`) of the serving tests, written by
// llama.cpp's gguf-py (tests/oracle/gguf_dsv4.py: compression ratios 0, 4 and 128, the
// lightning indexer with top-k 6, a 16-position window, 4 hyper-connection streams) with the
// vocabulary of a generated qwen3 model; cached under tests/data/gen like the oracle tests'
// models (the same file as oracle_dsv4.test.mjs's). `skip` says why it cannot be written.
import assert from 'node:assert/strict';
import {spawnSync} from 'node:child_process';
import path from 'node:path';

import {root, bin, oracleFiles} from './oracle_common.mjs';

const script = path.join(root, 'tests/oracle/gguf_dsv4.py');
const files = oracleFiles([script, path.join(root, 'tests/oracle/gguf_common.py')]);

export const skip = files.skip;

// The test model at weight type `type`, with extra gguf_dsv4.py arguments (tag names them in the
// cache); the default is the serving tests' F32 model.
export function dsv4Model(type = 'f32', extra = [], tag = '') {
  const vocab = files.cached('oracle-dsv4-vocab', (out) => {
    const r = spawnSync(bin, ['mkmodel', '--arch', 'qwen3', '--preset', 'tiny', '--layers', '1', '--vocab-size', '8192',
      '--type', 'f32', '--seed', '1', '-o', out], {encoding: 'utf8'});
    assert.equal(r.status, 0, r.stderr);
  });
  return files.cached(`oracle-dsv4-${type}${tag}`, (out) => {
    const r = spawnSync(files.python, [script, '--vocab', vocab, '--type', type, '--seed', '1', ...extra, '-o', out],
      {encoding: 'utf8'});
    assert.equal(r.status, 0, `gguf_dsv4.py failed: ${r.stderr}`);
  });
}
