// bert: BERT-style encoders (`bert`, `nomic-bert`) on `tokenmill serve` against llama.cpp (node-llama-cpp's
// prebuilt library) on small random models that llama.cpp's gguf-py writes as its converter
// does (tests/oracle/gguf_bert.py): the WordPiece tokenizer token for token (case folding,
// accents, punctuation, CJK, unknown words), the embeddings of mean- and CLS-pooled bert and a
// nomic-bert (cosine >= 0.9999, several inputs in one call and each alone), a model without a pooling
// key pooled by the mean, the openai SDK's embeddings.create (float and base64), and the
// refusals: text generation in each API's error shape, an input longer than the position
// table, `tokenmill run`; through a gateway and a prefill worker, the same vectors as `serve`'s
// (CLS pooling on the wire), inputs bounded by the worker's step (a 400, not the worker's
// refusal as a 500) and a decode worker of an encoder refused.
import {test, before, after} from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import {spawnSync} from 'node:child_process';
import {getLlama} from 'node-llama-cpp';
import OpenAI from 'openai';
import {root, bin, oracleFiles} from './oracle_common.mjs';
import {startServer, startCluster, stopServers} from './server.mjs';

const script = path.join(root, 'tests/oracle/gguf_bert.py');
const {python, skip, cached} = oracleFiles([script, path.join(root, 'tests/oracle/gguf_common.py')]);   // it imports gguf_common's finish
const models = {};
let llama;

function model(pooling, arch = 'bert') {
  return cached(`${arch}-${pooling}`, (out) => {
    const r = spawnSync(python, [script, '--arch', arch, '--pooling', pooling, '--seed', '3', '-o', out], {encoding: 'utf8'});
    assert.equal(r.status, 0, `gguf_bert.py failed: ${r.stderr}`);
  });
}

before(async () => {
  if (skip) return;
  for (const p of ['mean', 'cls', 'none']) models[p] = model(p);
  models.nomic = model('mean', 'nomic-bert');
  llama = await getLlama({gpu: false, build: 'never', logLevel: 'fatal'});
});
after(async () => {
  await stopServers();
});

const texts = ['the quick brown fox jumps over the lazy dog', 'Hello, World! Café déjà vu.',
  'embedding zzz qq 世 x7 (once) upon-a-time', 'a', 'The  Cat\tjumped;\nover   THE dog?'];

const cos = (a, b) => a.reduce((s, x, i) => s + x * b[i], 0) /
  Math.sqrt(a.reduce((s, x) => s + x * x, 0) * b.reduce((s, x) => s + x * x, 0));

async function post(url, route, body) {
  const res = await fetch(url + route, {method: 'POST', headers: {'content-type': 'application/json'},
    body: JSON.stringify(body)});
  return {status: res.status, body: await res.json()};
}

async function tokenize(url, content, addSpecial) {
  return (await post(url, '/tokenize', {content, add_special: addSpecial})).body.tokens;
}

test('WordPiece tokenizer: the same ids as llama.cpp, [CLS] and [SEP] around them', {skip}, async () => {
  const srv = await startServer(models.mean);
  const m = await llama.loadModel({modelPath: models.mean});
  for (const t of texts) {
    assert.deepEqual(await tokenize(srv.url, t, false), Array.from(m.tokenize(t)), JSON.stringify(t));
    const withSpecial = await tokenize(srv.url, t, true);
    assert.deepEqual([withSpecial[0], withSpecial.at(-1)], [101, 102]);
  }
  await m.dispose();
});

const KINDS = {mean: 'bert, mean pooling', cls: 'bert, CLS pooling', nomic: 'nomic-bert (RoPE, fused QKV, SwiGLU), mean pooling'};
for (const pooling of Object.keys(KINDS)) {
  test(`${KINDS[pooling]}: agrees with llama.cpp's embeddings (cosine >= 0.9999), batched or alone`, {skip}, async () => {
    const srv = await startServer(models[pooling]);
    const m = await llama.loadModel({modelPath: models[pooling]});
    const ctx = await m.createEmbeddingContext({contextSize: 512});
    const all = await post(srv.url, '/v1/embeddings', {input: texts});
    assert.equal(all.status, 200, JSON.stringify(all.body));
    let n = 0, worst = 1, worstD = 0;
    for (let i = 0; i < texts.length; i++) {
      const ids = await tokenize(srv.url, texts[i], true);
      n += ids.length;
      const got = all.body.data[i].embedding;
      assert.equal(got.length, 128);
      assert.ok(Math.abs(got.reduce((s, x) => s + x * x, 0) - 1) < 1e-4, 'L2-normalised');
      const alone = await post(srv.url, '/v1/embeddings', {input: ids});
      assert.deepEqual(alone.body.data[0].embedding, got, 'alone (as ids) as in the batch');
      const want = Array.from((await ctx.getEmbeddingFor(ids)).vector);
      const c = cos(got, want);
      const wn = Math.sqrt(want.reduce((s, x) => s + x * x, 0));
      const d = Math.max(...got.map((x, k) => Math.abs(x - want[k] / wn)));
      assert.ok(c >= 0.9999 && d < 2e-3, `${pooling} input ${i}: cosine ${c}, max |diff| ${d}`);
      worst = Math.min(worst, c);
      worstD = Math.max(worstD, d);
    }
    assert.equal(all.body.usage.prompt_tokens, n);
    console.log(`${KINDS[pooling]}: lowest cosine ${worst}, max |diff| ${worstD.toExponential(2)}`);
    await ctx.dispose();
    await m.dispose();
  });
}

test('no pooling key: the mean; openai SDK float and base64; generation and overlong inputs refused', {skip}, async () => {
  const mean = await startServer(models.mean);
  const srv = await startServer(models.none, ['--ctx', '64']);
  const a = await post(mean.url, '/v1/embeddings', {input: texts.slice(0, 2)});
  const b = await post(srv.url, '/v1/embeddings', {input: texts.slice(0, 2)});
  assert.deepEqual(b.body.data, a.body.data, 'the same weights pooled by the mean');
  const client = new OpenAI({baseURL: srv.url + '/v1', apiKey: 'x'});
  const id = (await client.models.list()).data[0].id;
  const f = await client.embeddings.create({model: id, input: texts.slice(0, 2), encoding_format: 'float'});
  const b64 = await client.embeddings.create({model: id, input: texts.slice(0, 2)});
  for (let i = 0; i < 2; i++)
    for (let d = 0; d < 128; d++) assert.ok(Math.abs(b64.data[i].embedding[d] - f.data[i].embedding[d]) < 1e-6);
  assert.deepEqual(f.data[0].embedding, a.body.data[0].embedding);
  // an encoder generates nothing: a 400 in each API's shape
  const chat = await post(srv.url, '/v1/chat/completions', {messages: [{role: 'user', content: 'hi'}]});
  assert.equal(chat.status, 400);
  assert.equal(chat.body.error.type, 'invalid_request_error');
  assert.match(chat.body.error.message, /embedding model/);
  assert.equal((await post(srv.url, '/v1/completions', {prompt: 'hi'})).status, 400);
  const msg = await post(srv.url, '/v1/messages', {model: id, max_tokens: 8, messages: [{role: 'user', content: 'hi'}]});
  assert.equal(msg.status, 400);
  assert.equal(msg.body.type, 'error');
  // --ctx 64: 64 tokens at most (the whole input is one step of the scheduler)
  const long = await post(srv.url, '/v1/embeddings', {input: Array(65).fill(120)});
  assert.equal(long.status, 400);
  assert.equal(long.body.error.code, 'context_length_exceeded');
  // one-token and whole-context inputs in one call: each as alone
  const mixed = await post(srv.url, '/v1/embeddings', {input: [[120], Array(64).fill(121), [101, 122, 102]]});
  assert.equal(mixed.status, 200, JSON.stringify(mixed.body));
  for (const [i, ids] of [[120], Array(64).fill(121), [101, 122, 102]].entries())
    assert.deepEqual((await post(srv.url, '/v1/embeddings', {input: ids})).body.data[0].embedding, mixed.body.data[i].embedding);
  const run = spawnSync(bin, ['run', '-m', models.none, '-p', 'hi'], {encoding: 'utf8'});
  assert.notEqual(run.status, 0);
  assert.match(run.stderr, /embedding model/);
});

test('through the gateway: a prefill worker computes the CLS-pooled vectors serve gives; a decode worker is refused', {skip}, async () => {
  const srv = await startServer(models.cls);
  // the worker computes an input whole in one step of at most 100 tokens (its --prefill-step-tokens):
  // the gateway bounds inputs by that, not by the 512 positions
  const cl = await startCluster(models.cls, ['prefill'], {workerArgs: ['--prefill-step-tokens', '100']});
  const want = await post(srv.url, '/v1/embeddings', {input: texts});
  const client = new OpenAI({baseURL: cl.url + '/v1', apiKey: 'x'});
  const id = (await client.models.list()).data[0].id;
  const got = await client.embeddings.create({model: id, input: texts, encoding_format: 'float'});
  assert.equal(got.data.length, texts.length);
  for (let i = 0; i < texts.length; i++) assert.deepEqual(got.data[i].embedding, want.body.data[i].embedding, `input ${i}`);
  assert.equal(got.usage.prompt_tokens, want.body.usage.prompt_tokens);
  const chat = await post(cl.url, '/v1/chat/completions', {messages: [{role: 'user', content: 'hi'}]});
  assert.equal(chat.status, 400);
  assert.match(chat.body.error.message, /embedding model/);
  const long = await post(cl.url, '/v1/embeddings', {input: Array(600).fill(120)});   // past the 512 positions
  assert.equal(long.status, 400);
  assert.equal(long.body.error.code, 'context_length_exceeded');
  const step = await post(cl.url, '/v1/embeddings', {input: [[120], Array(101).fill(120)]});   // past the worker's step
  assert.equal(step.status, 400, JSON.stringify(step.body));
  assert.equal(step.body.error.code, 'context_length_exceeded');
  assert.equal(step.body.error.param, 'input[1]');
  assert.match(step.body.error.message, /maximum context length is 100 tokens/);
  const whole = await post(cl.url, '/v1/embeddings', {input: Array(100).fill(120)});
  assert.equal(whole.status, 200, JSON.stringify(whole.body));
  assert.deepEqual(whole.body.data[0].embedding, (await post(srv.url, '/v1/embeddings', {input: Array(100).fill(120)})).body.data[0].embedding);
  const dec = spawnSync(bin, ['worker', '--role', 'decode', '-m', models.cls, '--listen', '127.0.0.1:0', '--cache', 'off'],
    {encoding: 'utf8', env: cl.env});
  assert.equal(dec.status, 2);
  assert.match(dec.stderr, /embedding model: its worker is a prefill or mixed one/);
});
