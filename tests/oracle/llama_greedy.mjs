// llama_greedy: llama.cpp (node-llama-cpp's prebuilt CPU library) as the oracle for greedy
// generation. Loads MODEL, evaluates BOS (plus the tokens of --prompt, tokenized by llama.cpp)
// and prints the greedy continuation of N tokens as text on stdout (or token ids with --ids).
//   node tests/oracle/llama_greedy.mjs MODEL.gguf [-n N] [--prompt TEXT] [--ids] [--threads T]
import { getLlama, LlamaLogLevel } from "node-llama-cpp";

const args = process.argv.slice(2);
let model = null, n = 200, prompt = "", ids = false, threads = 2;
for (let i = 0; i < args.length; i++) {
  if (args[i] === "-n") n = parseInt(args[++i], 10);
  else if (args[i] === "--prompt") prompt = args[++i];
  else if (args[i] === "--ids") ids = true;
  else if (args[i] === "--threads") threads = parseInt(args[++i], 10);
  else model = args[i];
}
if (!model) {
  console.error("usage: llama_greedy.mjs MODEL.gguf [-n N] [--prompt TEXT] [--ids]");
  process.exit(2);
}

const llama = await getLlama({ gpu: false, logLevel: LlamaLogLevel.error, build: "never" });
const m = await llama.loadModel({ modelPath: model });
const ctx = await m.createContext({ contextSize: Math.min(2048, Math.max(256, n + 64 + prompt.length)), threads, batchSize: 512 });
const seq = ctx.getSequence();
const input = [m.tokens.bos, ...(prompt ? m.tokenize(prompt, false) : [])];
const out = [];
for await (const tok of seq.evaluate(input, { temperature: 0 })) {
  if (tok === m.tokens.eos || out.length >= n) break;
  out.push(tok);
  if (out.length >= n) break;
}
if (ids) process.stdout.write(JSON.stringify(out) + "\n");
else process.stdout.write(m.detokenize(out));
await ctx.dispose();
await m.dispose();
await llama.dispose();
