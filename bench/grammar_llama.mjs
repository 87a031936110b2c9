#!/usr/bin/env node
// llama.cpp side of bench/grammar: decode speed with and without a JSON-schema grammar through
// node-llama-cpp@3.21.1's prebuilt CPU library (llama.createGrammarForJsonSchema, llama.cpp's
// grammar sampler), on the same model and schemas as tokenmill's columns.
//
//   node bench/grammar_llama.mjs -m MODEL --schemas F.json [--threads N] [--tokens T] [--docs D]
//   F.json: {"name": schema, ...}  →  [{"schema": name, "docs": D, "free": {"tokens", "s"},
//                                      "constrained": {"tokens", "s"}, "grammar_ms": compile}]
//
// Each run generates D completions of "JSON:" of at most T tokens at temperature 1 (seeds
// 1..D), one sequence at a time; the time covers generation only (the model and the context
// are made before). Constrained runs end at the end of their documents, free ones at T.
import fs from 'node:fs';
import os from 'node:os';
import {getLlama, LlamaLogLevel} from '../tests/oracle/llama_node.mjs';
import {LlamaCompletion} from 'node-llama-cpp';
import {parseArgs} from './args.mjs';

const o = parseArgs('bench/grammar_llama', [
  {name: '-m', alias: ['--model'], key: 'model', arg: 'MODEL', required: true, help: 'the GGUF file'},
  {name: '--schemas', arg: 'F.json', required: true, help: '{"name": schema, ...}'},
  {name: '--threads', alias: ['-t'], kind: 'number', default: os.availableParallelism?.() ?? os.cpus().length, help: 'threads'},
  {name: '--tokens', arg: 'T', kind: 'number', default: 128, help: 'most tokens of each completion'},
  {name: '--docs', arg: 'D', kind: 'number', default: 4, help: 'completions of each run'},
]);
const schemas = JSON.parse(fs.readFileSync(o.schemas, 'utf8'));

const llama = await getLlama({gpu: false, build: 'never', logLevel: LlamaLogLevel.error, maxThreads: 0, progressLogs: false});
const model = await llama.loadModel({modelPath: o.model, gpuLayers: 0, useMmap: true});
const ctx = await model.createContext({contextSize: o.tokens + 64, threads: o.threads, failedCreationRemedy: false,
  ignoreMemorySafetyChecks: true});
const seq = ctx.getSequence();
const completion = new LlamaCompletion({contextSequence: seq});

async function run(grammar) {
  let tokens = 0, s = 0;
  for (let d = 0; d < o.docs; d++) {
    await seq.clearHistory();
    const t0 = performance.now();
    const r = await completion.generateCompletionWithMeta('JSON:', {maxTokens: o.tokens, temperature: 1, topK: 0, topP: 1,
      minP: 0, seed: d + 1, grammar, onToken: (t) => { tokens += t.length; }});
    s += (performance.now() - t0) / 1000;
    if (grammar && r.metadata.stopReason === 'eogToken') JSON.parse(r.response);  // a document, or this throws
  }
  return {tokens, s};
}

const out = [];
await run(undefined);  // warm-up
for (const [name, schema] of Object.entries(schemas)) {
  const t0 = performance.now();
  const grammar = await llama.createGrammarForJsonSchema(schema);
  const grammarMs = performance.now() - t0;
  out.push({schema: name, docs: o.docs, free: await run(undefined), constrained: await run(grammar), grammar_ms: grammarMs});
}
process.stdout.write(JSON.stringify(out) + '\n');
await ctx.dispose();
await model.dispose();
await llama.dispose();
