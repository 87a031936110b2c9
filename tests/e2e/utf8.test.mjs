// utf8: generated text that splits characters, made on purpose. A generated model (qwen3
// architecture, the Qwen2 byte-level vocabulary) is made to emit chosen tokens by id with
// logit_bias (+100 on two tokens, sampled at temperature 1 with a seed, so the two mix):
//   - byte 0xE2 (a character's lead byte) alone, and mixed with the ASCII token "ab": the 0xE2
//     can never be completed, so each becomes U+FFFD, the text is a run of "\uFFFD" and "ab";
//   - the first three bytes of U+1D11E (F0 9D 84) and its last byte (9E): some pairs complete
//     the character, the other pieces become U+FFFD, exactly as a WHATWG decoder of the raw
//     bytes reads them (and the raw bytes are what chat logprobs report in `bytes`).
// Every API (chat, completions, responses, messages), streaming and not, on `serve` and
// through a gateway with one prefill and one decode worker: the raw response bytes are valid
// UTF-8 (a fatal decoder accepts them), the streamed text equals the non-streamed one, and the
// text is the expected one.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync, spawn } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";

import { root, bin, startServer, stopServers } from "./server.mjs";

const vocab = path.join(root, "tests/data/llama.cpp/models/ggml-vocab-qwen2.gguf");
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "tm-utf8-"));
const model = path.join(tmp, "q3.gguf");
// Ids of the Qwen2 vocabulary (GPT-2 byte-level: ids 0..255 are the single bytes).
const E2 = 158, AB = 370, G3 = 124596, X9E = 252;
const RAW = { [E2]: [0xe2], [AB]: [0x61, 0x62], [G3]: [0xf0, 0x9d, 0x84], [X9E]: [0x9e] };
const FFFD = "\uFFFD";
const strict = new TextDecoder("utf-8", { fatal: true });
const procs = [];
let S, G;

function waitListening(p, what) {
  let log = "";
  return new Promise((resolve, reject) => {
    const t = setTimeout(() => reject(new Error(`${what} did not start: ${log}`)), 30000);
    const on = (d) => {
      log += d;
      const m = /listening on (?:http:\/\/[^:]+:|port )(\d+)/.exec(log);
      const reg = /register at [^:\s]+:(\d+)/.exec(log);
      if (m && (what !== "gateway" || reg) && (!what.startsWith("worker") || /registered with the gateway/.test(log))) {
        clearTimeout(t); p.stderr.removeListener("data", on); p.stderr.resume(); resolve({ port: Number(m[1]), reg: reg && Number(reg[1]) });
      }
    };
    p.stderr.on("data", on);
    p.on("exit", (c) => { clearTimeout(t); reject(new Error(`${what} exited ${c}: ${log}`)); });
  });
}

before(async () => {
  execFileSync(bin, ["mkmodel", "--arch", "qwen3", "--preset", "tiny", "--vocab", vocab, "--type", "q8_0",
    "--seed", "5", "-o", model], { stdio: "pipe" });
  S = await startServer(model, ["--ctx", "256", "--max-seqs", "4"]);
  const store = path.join(tmp, "store");
  fs.mkdirSync(store);
  const spawnP = (args) => { const p = spawn(bin, args, { stdio: ["ignore", "ignore", "pipe"] }); procs.push(p); return p; };
  const gw = spawnP(["gateway", "-m", model, "--listen", "127.0.0.1:0", "--register", "127.0.0.1:0", "--cache", `dir:${store}`,
    "--ctx", "256", "--wait-timeout", "20"]);
  const g = await waitListening(gw, "gateway");
  for (const role of ["prefill", "decode"])
    await waitListening(spawnP(["worker", "--role", role, "-m", model, "--listen", "127.0.0.1:0", "--gateway", `127.0.0.1:${g.reg}`,
      "--cache", `dir:${store}`, "--threads", "1", "--ctx", "256"]), `worker ${role}`);
  G = { url: `http://127.0.0.1:${g.port}` };
});

after(async () => {
  for (const p of procs) if (p.exitCode === null && p.signalCode === null) p.kill("SIGKILL");
  await stopServers();
  fs.rmSync(tmp, { recursive: true, force: true });
});

async function postRaw(base, p, body) {
  const r = await fetch(base + p, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
  const bytes = new Uint8Array(await r.arrayBuffer());
  let text;
  assert.doesNotThrow(() => { text = strict.decode(bytes); }, `${p}: the response is not valid UTF-8`);
  assert.equal(r.status, 200, `${p}: ${text}`);
  return text;
}
const sse = (text) => text.split("\n\n").filter((b) => b.trim()).map((b) => /^data: (.*)$/m.exec(b)[1])
  .filter((d) => d !== "[DONE]").map((d) => JSON.parse(d));

// Each API: a request body for the bias, and readers of its answer (text, generated tokens).
const API = {
  chat: {
    path: "/v1/chat/completions",
    body: (bias, seed, n) => ({ messages: [{ role: "user", content: "hi" }], max_tokens: n, temperature: 1, seed, logit_bias: bias }),
    text: (j) => j.choices[0].message.content,
    tokens: (j) => j.usage.completion_tokens,
    streamText: (evs) => evs.map((e) => e.choices?.[0]?.delta?.content ?? "").join(""),
  },
  completions: {
    path: "/v1/completions",
    body: (bias, seed, n) => ({ prompt: "hi", max_tokens: n, temperature: 1, seed, logit_bias: bias }),
    text: (j) => j.choices[0].text,
    tokens: (j) => j.usage.completion_tokens,
    streamText: (evs) => evs.map((e) => e.choices?.[0]?.text ?? "").join(""),
  },
  responses: {
    path: "/v1/responses",
    body: (bias, seed, n) => ({ input: "hi", max_output_tokens: n, temperature: 1, seed, logit_bias: bias }),
    text: (j) => j.output.filter((o) => o.type === "message").flatMap((o) => o.content).map((c) => c.text).join(""),
    tokens: (j) => j.usage.output_tokens,
    streamText: (evs) => evs.filter((e) => e.type === "response.output_text.delta").map((e) => e.delta).join(""),
  },
  messages: {
    path: "/v1/messages",
    body: (bias, seed, n) => ({ messages: [{ role: "user", content: "hi" }], max_tokens: n, temperature: 1, seed, logit_bias: bias }),
    text: (j) => j.content.filter((c) => c.type === "text").map((c) => c.text).join(""),
    tokens: (j) => j.usage.output_tokens,
    streamText: (evs) => evs.filter((e) => e.type === "content_block_delta" && e.delta.type === "text_delta").map((e) => e.delta.text).join(""),
  },
};

// One API, streaming and not: both valid UTF-8 and the same text; returns [text, tokens].
async function run(base, api, bias, seed, n) {
  const a = API[api];
  const full = JSON.parse(await postRaw(base, a.path, a.body(bias, seed, n)));
  const streamed = a.streamText(sse(await postRaw(base, a.path, { ...a.body(bias, seed, n), stream: true })));
  assert.equal(streamed, a.text(full), `${api}: streamed text differs`);
  return [a.text(full), a.tokens(full)];
}

for (const [where, target] of [["serve", () => S.url], ["gateway", () => G.url]]) {
  test(`${where}: a lead byte that is never completed becomes U+FFFD in every API`, { timeout: 120000 }, async () => {
    let sawSplit = false;
    for (const api of Object.keys(API)) {
      // only the lead byte: each one is cut by the next, the last by the end of the output
      const [only, k] = await run(target(), api, { [E2]: 100 }, 1, 6);
      assert.equal(only, FFFD.repeat(k), `${api}: ${JSON.stringify(only)}`);
      assert.equal(k, 6);
      // with an ASCII token in the mix (which of the two the model prefers where is its own
      // business; completions' prompt gives lead bytes followed by "ab")
      for (const seed of [1, 2, 3]) {
        const [text, n] = await run(target(), api, { [E2]: 100, [AB]: 100 }, seed, 12);
        assert.match(text, /^(\uFFFD|ab)+$/, `${api} seed ${seed}: ${JSON.stringify(text)}`);
        assert.equal(text.replaceAll("ab", "x").length, n, `${api}: one unit per generated token`);
        sawSplit ||= text.includes(FFFD + "ab");
      }
    }
    assert.ok(sawSplit, "no 0xE2 followed by an ASCII token was generated");
  });

  test(`${where}: split characters are completed or replaced exactly as a decoder of the raw bytes reads them`, { timeout: 120000 }, async () => {
    const bias = { [G3]: 100, [X9E]: 100 };
    let sawWhole = false, sawBad = false;
    for (const seed of [1, 2, 3, 4]) {
      // chat: the raw bytes of the tokens (logprobs `bytes`, and the ids) give the expected text
      const body = { ...API.chat.body(bias, seed, 10), logprobs: true, return_token_ids: true };
      const j = JSON.parse(await postRaw(target(), API.chat.path, body));
      const c = j.choices[0];
      const fromIds = Buffer.from(c.token_ids.flatMap((id) => RAW[id]));
      const fromLp = Buffer.from(c.logprobs.content.flatMap((t) => t.bytes));
      assert.deepEqual(fromLp, fromIds, "logprobs bytes are the tokens' raw bytes");
      const expected = new TextDecoder().decode(fromIds);
      assert.equal(c.message.content, expected, `seed ${seed}`);
      sawWhole ||= expected.includes("\u{1D11E}");
      sawBad ||= expected.includes(FFFD);
      // every API renders the same conversation: the same tokens, so the same text
      for (const api of Object.keys(API).filter((x) => x !== "completions")) {
        const [text] = await run(target(), api, bias, seed, 10);
        assert.equal(text, expected, `${api} seed ${seed}`);
      }
      const [ctext] = await run(target(), "completions", bias, seed, 10);
      assert.match(ctext, /^(\uFFFD|\u{1D11E})+$/u, `completions seed ${seed}`);
    }
    assert.ok(sawWhole && sawBad, "the runs should both complete and break the character");
  });
}
