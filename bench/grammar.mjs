#!/usr/bin/env node
// bench/grammar: what structured output costs in tokenmill, side by side with llama.cpp.
//
//   bench/grammar [--threads N] [--tokens T] [--streams 1,16] [--docs D] [--no-llama]
//
// On a random-weight tiny Qwen3 with the 151,936-token Qwen2 vocabulary (tests/data, run
// scripts/fetch-testdata.sh first), for a typical tool schema and a larger nested one:
//  - compile time (`tokenmill grammar check --stats`: schema -> GBNF -> byte automaton);
//  - mask work alone (`tokenmill grammar bench`: D documents one after another, tokens drawn
//    uniformly from the allowed ones, no model compute): microseconds per token, mean and
//    p99, by the wall clock and in CPU time (the work, on a shared machine), over all
//    documents, the first (cold: the grammar's memos empty) and the second half (warm: what a
//    server sees once a schema has been used);
//  - decode tokens/s at 1 and 16 streams, unconstrained and constrained, T tokens each, at
//    temperature 1 (`grammar sample --stats`);
//  - the same model and schemas through llama.cpp's grammar sampler (node-llama-cpp,
//    llama.createGrammarForJsonSchema; bench/grammar_llama.mjs), one sequence, and for both
//    engines the grammar's cost per generated token: constrained s/token - free s/token.
// Prints tables and writes bench/out/grammar.json.
import {execFileSync, spawnSync} from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import {fileURLToPath} from 'node:url';
import {parseArgs} from './args.mjs';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
process.chdir(root);
const o = parseArgs('bench/grammar', [
  {name: '--threads', kind: 'number', default: os.availableParallelism?.() ?? os.cpus().length, help: 'threads of both engines'},
  {name: '--tokens', arg: 'T', kind: 'number', default: 256, help: 'tokens of each document'},
  {name: '--streams', arg: 'N,N', default: '1,16', help: 'streams of the decode runs'},
  {name: '--docs', arg: 'D', kind: 'number', default: 64, help: 'documents of the mask benchmark'},
  {name: '--no-llama', key: 'llama', kind: 'flag', value: false, default: true, help: 'tokenmill only'},
]);
const bin = 'build/tokenmill', out = 'bench/out';
fs.mkdirSync(out, {recursive: true});
const vocab = 'tests/data/llama.cpp/models/ggml-vocab-qwen2.gguf';
const model = path.join(out, 'grammar-qwen3-tiny-qwen2vocab.gguf');
if (!fs.existsSync(model))
  execFileSync(bin, ['mkmodel', '--arch', 'qwen3', '--preset', 'tiny', '--vocab', vocab, '--type', 'q8_0',
    '--seed', '5', '-o', model], {stdio: 'inherit'});

const schemas = {
  tool: {type: 'object', properties: {location: {type: 'string', maxLength: 32},
    unit: {enum: ['celsius', 'fahrenheit']}, days: {type: 'integer', minimum: 1, maximum: 14}},
    required: ['location', 'unit'], additionalProperties: false},
  nested: {type: 'object', properties: {
    id: {type: 'string', format: 'uuid'}, customer: {type: 'object', properties: {name: {type: 'string', maxLength: 20},
      email: {type: 'string', pattern: '^[a-z]{1,10}@[a-z]{1,10}\\.com$'}}, required: ['name'], additionalProperties: false},
    lines: {type: 'array', maxItems: 4, items: {type: 'object', properties: {sku: {type: 'string', pattern: '^[A-Z]{3}-[0-9]{4}$'},
      qty: {type: 'integer', minimum: 1, maximum: 99}}, required: ['sku', 'qty'], additionalProperties: false}}},
    required: ['id', 'lines'], additionalProperties: false},
};

function stats(text, re) { const m = text.match(re); return m ? m.slice(1).map(Number) : null; }
const rows = [], masks = [];
for (const [name, schema] of Object.entries(schemas)) {
  const f = path.join(out, `grammar-${name}.json`), docs = path.join(out, 'grammar-empty.json');
  fs.writeFileSync(f, JSON.stringify(schema));
  fs.writeFileSync(docs, '[]');
  const c = spawnSync(bin, ['grammar', 'check', '--schema', f, '--input', docs, '--stats'], {encoding: 'utf8'});
  const [compileMs] = stats(c.stderr, /compiled in ([0-9.]+) ms/) ?? [NaN];
  const mb = JSON.parse(execFileSync(bin, ['grammar', 'bench', '-m', vocab, '--schema', f, '-n', String(o.docs),
    '--max-tokens', String(o.tokens), '--seed', '1'], {encoding: 'utf8'}));
  masks.push({schema: name, tokens: mb.tokens, all: mb.mask, cold: mb.mask_first_document, warm: mb.mask_second_half,
    cpu: mb.cpu, cpu_cold: mb.cpu_first_document, cpu_warm: mb.cpu_second_half});
  for (const streams of o.streams.split(',').map(Number)) {
    const run = (constrained) => {
      const r = spawnSync(bin, ['grammar', 'sample', '-m', model, ...(constrained ? ['--schema', f] : []), '-n', String(streams),
        '--max-tokens', String(o.tokens), '--temp', '1', '--seed', '1', '-p', 'JSON:', '-t', String(o.threads), '--stats'],
        {encoding: 'utf8', maxBuffer: 256 << 20});
      if (r.status !== 0) throw new Error(r.stderr);
      const [tokens, secs] = stats(r.stderr, /decode: (\d+) tokens in ([0-9.]+) s/);
      const m = stats(r.stderr, /masks: (\d+) from the cache, (\d+) computed \(([0-9.]+) us/);
      return {tok_s: tokens / secs, tokens, masks_cached: m?.[0], masks_composed: m?.[1], composed_us: m?.[2]};
    };
    const free = run(false), con = run(true);
    const perToken = con.composed_us * con.masks_composed / (con.masks_cached + con.masks_composed);
    rows.push({schema: name, compile_ms: compileMs, streams, free_tok_s: free.tok_s, constrained_tok_s: con.tok_s,
      masks_cached: con.masks_cached, masks_composed: con.masks_composed, composed_us: con.composed_us,
      mask_us_per_token: perToken});
  }
}
// llama.cpp side by side, one sequence (tokenmill's 1-stream rows), the same model and length
let peer = [];
if (o.llama) {
  const sf = path.join(out, 'grammar-schemas.json');
  fs.writeFileSync(sf, JSON.stringify(schemas));
  const r = spawnSync(process.execPath, ['bench/grammar_llama.mjs', '-m', model, '--schemas', sf, '--threads', String(o.threads),
    '--tokens', String(o.tokens), '--docs', '1'], {encoding: 'utf8'});
  if (r.status !== 0) throw new Error(r.stderr);
  peer = JSON.parse(r.stdout);
}
fs.writeFileSync(path.join(out, 'grammar.json'), JSON.stringify({decode: rows, masks, llama: peer}, null, 2));
const f1 = (x, w) => (Number.isFinite(x) ? x.toFixed(1) : '-').padStart(w);
console.log('mask work alone (tokenmill grammar bench), us per token, wall clock / CPU time');
console.log('schema   tokens            mean             p99       cold mean       warm mean        warm p99');
const wc = (a, b) => `${f1(a.mean_us, 7)} /${f1(b.mean_us, 7)}`;
for (const m of masks)
  console.log(`${m.schema.padEnd(7)} ${String(m.tokens).padStart(7)} ${wc(m.all, m.cpu)} ` +
    `${f1(m.all.p99_us, 7)} /${f1(m.cpu.p99_us, 7)} ${wc(m.cold, m.cpu_cold)} ${wc(m.warm, m.cpu_warm)} ` +
    `${f1(m.warm.p99_us, 7)} /${f1(m.cpu_warm.p99_us, 7)}`);
console.log('\ndecode (tokenmill grammar sample)');
console.log('schema  compile ms  streams  free tok/s  constrained tok/s  masks cached/composed  composed us  us/token');
for (const r of rows)
  console.log(`${r.schema.padEnd(7)} ${r.compile_ms.toFixed(2).padStart(10)} ${String(r.streams).padStart(8)} ` +
    `${r.free_tok_s.toFixed(1).padStart(11)} ${r.constrained_tok_s.toFixed(1).padStart(18)} ` +
    `${`${r.masks_cached}/${r.masks_composed}`.padStart(22)} ${r.composed_us.toFixed(0).padStart(12)} ${r.mask_us_per_token.toFixed(0).padStart(9)}`);
if (peer.length) {
  console.log('\nside by side, one sequence: tok/s free / constrained, grammar ms per token (constrained - free)');
  console.log('schema   tokenmill free  constrained  ms/token   llama.cpp free  constrained  ms/token   compile ms tm / llama');
  for (const p of peer) {
    const t = rows.find((r) => r.schema === p.schema && r.streams === 1);
    if (!t) continue;
    const lf = p.free.tokens / p.free.s, lc = p.constrained.tokens / p.constrained.s;
    const tmMs = (1 / t.constrained_tok_s - 1 / t.free_tok_s) * 1e3, llMs = (1 / lc - 1 / lf) * 1e3;
    console.log(`${p.schema.padEnd(7)} ${f1(t.free_tok_s, 15)} ${f1(t.constrained_tok_s, 12)} ${f1(tmMs, 9)} ` +
      `${f1(lf, 16)} ${f1(lc, 12)} ${f1(llMs, 9)}   ${t.compile_ms.toFixed(1)} / ${p.grammar_ms.toFixed(1)}`);
  }
}
