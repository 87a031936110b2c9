#!/usr/bin/env node
// bench/grammar: what structured output costs in tokenmill.
//
//   bench/grammar [--threads N] [--tokens T] [--streams 1,16]
//
// On a random-weight tiny Qwen3 with the 151,936-token Qwen2 vocabulary (tests/data, run
// scripts/fetch-testdata.sh first), for a typical tool schema and a larger nested one:
//  - compile time (`tokenmill grammar check --stats`: schema -> GBNF -> byte automaton);
//  - decode tokens/s at 1 and 16 streams, unconstrained and constrained, T tokens each, at
//    temperature 1 (`grammar sample --stats`);
//  - mask work: masks served from the whole-state cache, masks composed, and the mean time of
//    a composed one (the per-token mean is composed time / all masks).
// Prints a table and writes bench/out/grammar.json. The comparison with llama.cpp's grammar
// sampler that the design calls for is not here yet.
import {execFileSync, spawnSync} from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import {fileURLToPath} from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
process.chdir(root);
const o = {threads: os.availableParallelism?.() ?? os.cpus().length, tokens: 256, streams: '1,16'};
const argv = process.argv.slice(2);
for (let i = 0; i < argv.length; i++) {
  const a = argv[i], v = argv[++i];
  if (a === '--threads') o.threads = Number(v);
  else if (a === '--tokens') o.tokens = Number(v);
  else if (a === '--streams') o.streams = v;
  else { process.stderr.write('usage: bench/grammar [--threads N] [--tokens T] [--streams 1,16]\n'); process.exit(2); }
}
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
const rows = [];
for (const [name, schema] of Object.entries(schemas)) {
  const f = path.join(out, `grammar-${name}.json`), docs = path.join(out, 'grammar-empty.json');
  fs.writeFileSync(f, JSON.stringify(schema));
  fs.writeFileSync(docs, '[]');
  const c = spawnSync(bin, ['grammar', 'check', '--schema', f, '--input', docs, '--stats'], {encoding: 'utf8'});
  const [compileMs] = stats(c.stderr, /compiled in ([0-9.]+) ms/) ?? [NaN];
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
fs.writeFileSync(path.join(out, 'grammar.json'), JSON.stringify(rows, null, 2));
console.log('schema  compile ms  streams  free tok/s  constrained tok/s  masks cached/composed  composed us  us/token');
for (const r of rows)
  console.log(`${r.schema.padEnd(7)} ${r.compile_ms.toFixed(2).padStart(10)} ${String(r.streams).padStart(8)} ` +
    `${r.free_tok_s.toFixed(1).padStart(11)} ${r.constrained_tok_s.toFixed(1).padStart(18)} ` +
    `${`${r.masks_cached}/${r.masks_composed}`.padStart(22)} ${r.composed_us.toFixed(0).padStart(12)} ${r.mask_us_per_token.toFixed(0).padStart(9)}`);
