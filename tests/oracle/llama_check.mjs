// llama_check: loads a GGUF with llama.cpp (node-llama-cpp, CPU) and reports, as one JSON
// line, what a generated model looks like to the oracle: vocabulary size, the tokens of a
// prompt, the log-probability gap between the top two tokens at every prompt position
// (min / median: small gaps make token-for-token comparisons fragile), and a greedy
// continuation. Used to check `tokenmill mkmodel` output.
//   node tests/oracle/llama_check.mjs MODEL.gguf [--prompt TEXT] [-n N]
import { getLlama, LlamaLogLevel } from "node-llama-cpp";

const args = process.argv.slice(2);
let model = null, n = 32, prompt = "The quick brown fox jumps over the lazy dog. Once upon a time, 1234 tokens!";
for (let i = 0; i < args.length; i++) {
  if (args[i] === "-n") n = parseInt(args[++i], 10);
  else if (args[i] === "--prompt") prompt = args[++i];
  else model = args[i];
}
const llama = await getLlama({ gpu: false, logLevel: LlamaLogLevel.error, build: "never" });
const t0 = Date.now();
const m = await llama.loadModel({ modelPath: model });
const loadMs = Date.now() - t0;
const ctx = await m.createContext({ contextSize: 512, threads: 2 });
const seq = ctx.getSequence();
const toks = m.tokenize(prompt, false);
const input = [...(m.tokens.bos != null && m.fileInfo?.metadata?.tokenizer?.ggml?.add_bos_token !== false ? [m.tokens.bos] : []), ...toks];
const res = await seq.controlledEvaluate(input.map((t) => [t, { generateNext: { probabilities: true } }]));
const gaps = [];
for (const r of res) {
  if (!r?.next?.probabilities) continue;
  const it = r.next.probabilities.values();
  const p1 = it.next().value, p2 = it.next().value;
  gaps.push(Math.log(p1) - Math.log(p2));
}
gaps.sort((a, b) => a - b);
const gen = [];
const t1 = Date.now();
await seq.clearHistory();
for await (const tok of seq.evaluate(input, { temperature: 0 })) {
  gen.push(tok);
  if (gen.length >= n) break;
}
const genMs = Date.now() - t1;
console.log(JSON.stringify({
  n_vocab: m.tokens.vocabularySize ?? null,
  n_prompt: input.length,
  prompt_tokens: input.slice(0, 24),
  gap_min: +gaps[0].toFixed(3),
  gap_median: +gaps[gaps.length >> 1].toFixed(3),
  greedy: gen,
  text: m.detokenize(gen),
  load_ms: loadMs,
  gen_ms: genMs,
}));
await ctx.dispose();
await m.dispose();
await llama.dispose();
