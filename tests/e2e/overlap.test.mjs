// overlap: the step loop that publishes a step's outputs while the next step computes gives,
// through the server, exactly what the loop that publishes first (`--no-overlap`) gives: the
// three chat APIs streamed by the vendors' SDKs (four at once), stop strings (held-back text
// never leaks, the same finish), seeded sampling, with and without prompt-lookup drafts; and
// a client leaving a stream mid-way on every route frees its KV blocks, after which the
// answers are still the same; the blocks written to the block store (keys and bytes, drafts
// rejected among them) are the same. The model is generated (qwen3, random weights, the Qwen2
// vocabulary), so texts are gibberish but deterministic.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import OpenAI from "openai";
import Anthropic from "@anthropic-ai/sdk";

import { root, bin, startServer, stopServers, fetchMetrics, assertSameStores, postCompletion } from "./server.mjs";

const vocab = path.join(root, "tests/data/llama.cpp/models/ggml-vocab-qwen2.gguf");
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "tm-overlap-"));
const model = path.join(tmp, "q3.gguf");
const NAME = "tiny-qwen";
const MAX = 24;

// [name, args]: every server is compared with the first
const CONFIGS = [
  ["no overlap", ["--no-overlap"]],
  ["overlap", []],
  ["no overlap, ngram drafts", ["--no-overlap", "--spec", "ngram", "--spec-fixed", "2"]],
  ["overlap, ngram drafts", ["--spec", "ngram", "--spec-fixed", "2"]],
];
const S = [];

before(async () => {
  execFileSync(bin, ["mkmodel", "--arch", "qwen3", "--preset", "tiny", "--vocab", vocab, "--type", "q8_0",
    "--seed", "5", "-o", model], { stdio: "pipe" });
  const common = ["--ctx", "512", "--max-seqs", "4", "--threads", "2", "--cache", "off", "--model-name", NAME];
  const servers = await Promise.all(CONFIGS.map(([, a]) => startServer(model, [...common, ...a])));
  for (const srv of servers) {
    S.push({ srv, oai: new OpenAI({ baseURL: `${srv.url}/v1`, apiKey: "unused", maxRetries: 0 }),
      ant: new Anthropic({ baseURL: srv.url, apiKey: "unused", maxRetries: 0 }) });
  }
});

after(async () => {
  await stopServers();
  fs.rmSync(tmp, { recursive: true, force: true });
});

const user = (content) => [{ role: "user", content }];
// prompts that repeat themselves, so that prompt lookup drafts
const ask = (c) => `Repeat after me ${c}: ` + "alpha beta gamma delta ".repeat(3 + c);

// One streamed answer on each API: { text, finish, usage } per route.
async function answers({ oai, ant }, c, extra = {}) {
  const { stop, ...rest } = extra;
  let chat = "", chatFinish, chatUsage;
  const s1 = await oai.chat.completions.create({ model: NAME, messages: user(ask(c)), max_tokens: MAX, temperature: 0,
    stream: true, stream_options: { include_usage: true }, ...(stop ? { stop } : {}), ...rest });
  for await (const ch of s1) {
    chat += ch.choices[0]?.delta?.content ?? "";
    chatFinish = ch.choices[0]?.finish_reason ?? chatFinish;
    if (ch.usage) chatUsage = ch.usage.completion_tokens;
  }
  let resp = "", respUsage, respStatus;
  const s2 = await oai.responses.create({ model: NAME, input: ask(c), max_output_tokens: MAX, temperature: 0, stream: true,
    ...rest });
  for await (const ev of s2) {
    if (ev.type === "response.output_text.delta") resp += ev.delta;
    if (ev.type === "response.completed" || ev.type === "response.incomplete") {
      respUsage = ev.response.usage.output_tokens;
      respStatus = ev.response.status;
    }
  }
  let msg = "", msgStop, msgUsage;
  const s3 = await ant.messages.create({ model: NAME, max_tokens: MAX, temperature: 0, messages: user(ask(c)), stream: true,
    ...(stop ? { stop_sequences: stop } : {}) });
  for await (const ev of s3) {
    if (ev.type === "content_block_delta" && ev.delta.type === "text_delta") msg += ev.delta.text;
    if (ev.type === "message_delta") {
      msgStop = ev.delta.stop_reason;
      msgUsage = ev.usage.output_tokens;
    }
  }
  return { chat: [chat, chatFinish, chatUsage], responses: [resp, respStatus, respUsage], messages: [msg, msgStop, msgUsage] };
}

test("streamed answers of the three APIs, four at once, equal those of the loop without overlap", async () => {
  const all = await Promise.all(S.map((x) => Promise.all([0, 1, 2, 3].map((c) => answers(x, c)))));
  for (let i = 1; i < S.length; i++)
    all[i].forEach((g, c) => assert.deepEqual(g, all[0][c], `${CONFIGS[i][0]}, prompt ${c}`));
  const m = await fetchMetrics(S[3].srv.url);
  assert.ok(m.tokenmill_spec_accepted_tokens_total > 0, "the drafts were used");
  // the gap between steps and its parts, which sum to it
  const parts = ["commit", "sample", "draft", "lock", "publish", "handoff", "plan", "launch"]
    .map((p) => m[`tokenmill_cpu_gap_part_seconds_total{part="${p}"}`]);
  assert.ok(parts.every((x) => Number.isFinite(x)), `every part is on /metrics: ${parts}`);
  const sum = parts.reduce((a, b) => a + b, 0);
  assert.ok(m.tokenmill_cpu_gap_seconds_total > 0 && Math.abs(sum - m.tokenmill_cpu_gap_seconds_total) < 1e-6,
    `gap ${m.tokenmill_cpu_gap_seconds_total}, parts ${sum}`);
  // measured where they happen: sampling and planning in every gap, drafting with drafts,
  // publishing on the engine thread only without overlap
  assert.ok(parts[1] > 0 && parts[6] > 0, `sampling and planning are parts of the gap: ${parts}`);
  assert.ok(parts[2] > 0, "drafting is a part of the gap");
  const n = await fetchMetrics(S[2].srv.url);
  assert.ok(n['tokenmill_cpu_gap_part_seconds_total{part="publish"}'] > 0, "without overlap the engine thread publishes");
});

test("stop strings end the answers at the same place, the held-back text never leaks", async () => {
  const base = await answers(S[0], 1);
  const chars = [...base.chat[0]];
  assert.ok(chars.length >= 8, `answer long enough: ${JSON.stringify(base.chat[0])}`);
  const stop = chars.slice(chars.length >> 1, (chars.length >> 1) + 2).join("");
  const want = await answers(S[0], 1, { stop: [stop] });
  assert.equal(want.chat[0], base.chat[0].slice(0, base.chat[0].indexOf(stop)));
  assert.equal(want.chat[1], "stop");
  assert.equal(want.messages[1], "stop_sequence");
  const got = await Promise.all(S.slice(1).map((x) => answers(x, 1, { stop: [stop] })));
  got.forEach((g, i) => assert.deepEqual(g, want, CONFIGS[i + 1][0]));
});

test("seeded sampled answers are the same with overlap", async () => {
  const run = async ({ oai }) => (await oai.chat.completions.create({ model: NAME, messages: user(ask(2)), max_tokens: MAX,
    temperature: 0.9, seed: 42, logprobs: true, top_logprobs: 2 })).choices[0];
  const [want, ...got] = await Promise.all(S.map(run));
  got.forEach((g, i) => {
    assert.equal(g.message.content, want.message.content, CONFIGS[i + 1][0]);
    assert.deepEqual(g.logprobs, want.logprobs, CONFIGS[i + 1][0]);
  });
});

test("a client leaving a stream mid-way frees its blocks on every route, with overlap", async () => {
  const want = await answers(S[0], 0);
  for (const i of [1, 3]) {
    const { oai, ant, srv } = S[i];
    const streams = [
      () => oai.chat.completions.create({ model: NAME, messages: user("Go on and on"), max_tokens: 400, stream: true }),
      () => oai.responses.create({ model: NAME, input: "Go on and on", max_output_tokens: 400, stream: true }),
      () => ant.messages.create({ model: NAME, max_tokens: 400, messages: user("Go on and on"), stream: true }),
    ];
    for (const open of i === 1 ? streams : streams.slice(0, 1)) {
      const before = await fetchMetrics(srv.url);
      const stream = await open();
      let n = 0;
      for await (const ev of stream) if (++n === 4) break;   // leaving the loop aborts the request
      let m;
      for (let t = 0; t < 250; t++) {
        m = await fetchMetrics(srv.url);
        if (m.tokenmill_kv_blocks_used === 0 && m.tokenmill_running_sequences === 0) break;
        await new Promise((r) => setTimeout(r, 20));
      }
      assert.equal(m.tokenmill_kv_blocks_used, 0, `${CONFIGS[i][0]}: blocks freed`);
      assert.equal(m['tokenmill_requests_finished_total{reason="cancelled"}'],
        before['tokenmill_requests_finished_total{reason="cancelled"}'] + 1);
    }
    assert.deepEqual(await answers(S[i], 0), want, `${CONFIGS[i][0]}: after the cancels`);
  }
});

test("the blocks stored with overlap equal those without, drafts rejected among them", async () => {
  const dirs = ["store-no-overlap", "store-overlap"].map((d) => path.join(tmp, d));
  const servers = await Promise.all([["--no-overlap"], []].map((a, i) => startServer(model, ["--ctx", "512",
    "--threads", "2", "--cache-dir", dirs[i], "--spec", "ngram", "--spec-fixed", "4", "--model-name", NAME, ...a])));
  const body = { model: NAME, prompt: "tool output: " + "alpha beta gamma delta ".repeat(40), max_tokens: 120,
    temperature: 0 };
  const texts = await Promise.all(servers.map(async (x) => {
    const j = await postCompletion(x.url, body);
    const u = j.usage;   // a full block holds generated tokens
    assert.ok(Math.floor(u.prompt_tokens / 128) < Math.floor((u.prompt_tokens + u.completion_tokens - 1) / 128), JSON.stringify(u));
    return j.choices[0].text;
  }));
  assert.equal(texts[1], texts[0]);
  const m = await fetchMetrics(servers[1].url);
  assert.ok(m.tokenmill_spec_accepted_tokens_total < m.tokenmill_spec_verified_tokens_total, "no draft was rejected");
  await assertSameStores(servers, dirs, 2);
});
