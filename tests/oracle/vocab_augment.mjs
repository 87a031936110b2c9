// vocab_augment: writes a vocabulary-only GGUF that is a llama.cpp test vocabulary with some
// placeholder tokens ([PADnnn], <|reserved_special_token_n|>) replaced by the added tokens of a
// newer model of the same family, so that template tests see the real marker tokens:
//   qwen3      ggml-vocab-qwen2.gguf     + Qwen3's <tool_call>, <think>, <tool_response>, ...
//   llama31    ggml-vocab-llama-bpe.gguf + Llama 3.1's <|python_tag|>, <|eom_id|>
//   deepseek3  ggml-vocab-deepseek-llm   + DeepSeek V3's <｜User｜>, <｜Assistant｜>, tool tokens
//   deepseek4  deepseek3                  + V4's ｜DSML｜ (the one token of its DSML tool-call tags)
// Token types follow the models' GGUFs: 3 = control, 4 = user-defined (HF "special": false).
// Everything else (merges, pre-tokenizer, ids of existing tokens) is copied unchanged.
//   node tests/oracle/vocab_augment.mjs NAME OUT.gguf     (or import { augment })
import fs from "node:fs";
import path from "node:path";

const root = path.resolve(import.meta.dirname, "../..");
const models = path.join(root, "tests/data/llama.cpp/models");

export const AUGMENTS = {
  qwen3: {
    src: "ggml-vocab-qwen2.gguf",
    tokens: [
      [151646, "<|object_ref_start|>", 3], [151647, "<|object_ref_end|>", 3], [151648, "<|box_start|>", 3],
      [151649, "<|box_end|>", 3], [151650, "<|quad_start|>", 3], [151651, "<|quad_end|>", 3],
      [151652, "<|vision_start|>", 3], [151653, "<|vision_end|>", 3], [151654, "<|vision_pad|>", 3],
      [151655, "<|image_pad|>", 3], [151656, "<|video_pad|>", 3], [151657, "<tool_call>", 4],
      [151658, "</tool_call>", 4], [151659, "<|fim_prefix|>", 4], [151660, "<|fim_middle|>", 4],
      [151661, "<|fim_suffix|>", 4], [151662, "<|fim_pad|>", 4], [151663, "<|repo_name|>", 4],
      [151664, "<|file_sep|>", 4], [151665, "<tool_response>", 4], [151666, "</tool_response>", 4],
      [151667, "<think>", 4], [151668, "</think>", 4],
    ],
  },
  llama31: {
    src: "ggml-vocab-llama-bpe.gguf",
    tokens: [[128004, "<|finetune_right_pad_id|>", 3], [128008, "<|eom_id|>", 3], [128010, "<|python_tag|>", 3]],
  },
  deepseek3: {
    src: "ggml-vocab-deepseek-llm.gguf",
    tokens: [
      "<｜User｜>", "<｜Assistant｜>", "<think>", "</think>", "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>",
      "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>",
      "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>", "<｜tool▁sep｜>",
    ].map((t, i) => [100015 + i, t, 4]),
  },
};
AUGMENTS.deepseek4 = { src: AUGMENTS.deepseek3.src, tokens: [...AUGMENTS.deepseek3.tokens, [100028, "｜DSML｜", 4]] };

// --- minimal GGUF reader/writer for metadata-only files ---------------------------------
const SCALAR = { 0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8 };

function readKVs(buf) {
  if (buf.toString("latin1", 0, 4) !== "GGUF") throw new Error("not a GGUF file");
  const version = buf.readUInt32LE(4);
  const nTensors = buf.readBigUInt64LE(8);
  const nKV = Number(buf.readBigUInt64LE(16));
  if (nTensors !== 0n) throw new Error("expected a vocabulary-only GGUF");
  let o = 24;
  const str = () => {
    const n = Number(buf.readBigUInt64LE(o));
    const s = buf.toString("utf8", o + 8, o + 8 + n);
    o += 8 + n;
    return s;
  };
  const skip = (t) => {
    if (t in SCALAR) o += SCALAR[t];
    else if (t === 8) str();
    else if (t === 9) {
      const et = buf.readUInt32LE(o);
      const n = Number(buf.readBigUInt64LE(o + 4));
      o += 12;
      for (let i = 0; i < n; i++) skip(et);
    } else throw new Error(`bad GGUF type ${t}`);
  };
  const kvs = [];
  for (let i = 0; i < nKV; i++) {
    const key = str();
    const type = buf.readUInt32LE(o);
    o += 4;
    const st = o;
    skip(type);
    kvs.push({ key, type, raw: buf.subarray(st, o) });
  }
  return { version, kvs };
}

function u64(n) { const b = Buffer.alloc(8); b.writeBigUInt64LE(BigInt(n)); return b; }
function u32(n) { const b = Buffer.alloc(4); b.writeUInt32LE(n); return b; }
function gstr(s) { const b = Buffer.from(s, "utf8"); return Buffer.concat([u64(b.length), b]); }

function readStrArray(raw) {
  const n = Number(raw.readBigUInt64LE(4));
  const out = [];
  let o = 12;
  for (let i = 0; i < n; i++) {
    const l = Number(raw.readBigUInt64LE(o));
    out.push(raw.toString("utf8", o + 8, o + 8 + l));
    o += 8 + l;
  }
  return out;
}

// chatTemplate (optional): the tokenizer.chat_template to store (replacing the source's).
export function augment(name, out, chatTemplate) {
  const a = AUGMENTS[name];
  if (!a) throw new Error(`unknown augment ${name}`);
  const { version, kvs } = readKVs(fs.readFileSync(path.join(models, a.src)));
  const tk = kvs.find((k) => k.key === "tokenizer.ggml.tokens");
  const ty = kvs.find((k) => k.key === "tokenizer.ggml.token_type");
  const tokens = readStrArray(tk.raw);
  const types = [];
  for (let i = 0; i < tokens.length; i++) types.push(ty.raw.readInt32LE(12 + 4 * i));
  for (const [id, text, type] of a.tokens) {
    tokens[id] = text;
    types[id] = type;
  }
  tk.raw = Buffer.concat([u32(8), u64(tokens.length), ...tokens.map(gstr)]);
  ty.raw = Buffer.concat([u32(5), u64(types.length), ...types.map((t) => { const b = Buffer.alloc(4); b.writeInt32LE(t); return b; })]);
  if (chatTemplate !== undefined) {
    const kept = kvs.filter((k) => k.key !== "tokenizer.chat_template");
    kvs.length = 0;
    kvs.push(...kept, { key: "tokenizer.chat_template", type: 8, raw: gstr(chatTemplate) });
  }
  const parts = [Buffer.from("GGUF", "latin1"), u32(version), u64(0), u64(kvs.length)];
  for (const kv of kvs) parts.push(gstr(kv.key), u32(kv.type), kv.raw);
  let body = Buffer.concat(parts);
  const pad = (32 - (body.length % 32)) % 32;
  body = Buffer.concat([body, Buffer.alloc(pad)]);
  fs.mkdirSync(path.dirname(out), { recursive: true });
  fs.writeFileSync(out + ".tmp", body);
  fs.renameSync(out + ".tmp", out);
  return out;
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const [name, out] = process.argv.slice(2);
  if (!name || !out) {
    console.error("usage: vocab_augment.mjs qwen3|llama31|deepseek3|deepseek4 OUT.gguf");
    process.exit(2);
  }
  augment(name, out);
}
