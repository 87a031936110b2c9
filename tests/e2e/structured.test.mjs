// structured: structured output and forced tool calls through the HTTP APIs, with the real
// SDKs (openai chat + responses, @anthropic-ai/sdk messages), streaming and not.
//  - Random-weight models (they never "want" the format) at temperature 1: every answer under
//    a json_schema format ends, parses and validates with ajv; json_object answers are
//    objects; regex and choice answers match.
//  - Forced tool calls (chat/responses tool_choice "required" / a named function, Anthropic
//    {type: "any"} / {type: "tool"}) on a Qwen3-templated model (<tool_call> is a marker
//    token) and a Llama 3 one (no marker): the call parses, names an allowed tool and its
//    arguments validate against that tool's schema. tool_choice "none" never gives a call.
//  - Reasoning stays free: with a DeepSeek-R1 template (the prompt opens the think block) the
//    reasoning is unconstrained text and the answer after it validates.
//  - DeepSeek V3.1's forced calls: its call syntax is control tokens around the name and the
//    arguments (token terminals in the grammar), returned as a tool call in every API.
//  - Strict tools under tool_choice "auto" (Qwen3 and DeepSeek): the answer is free until the
//    model opens a call (a logit_bias on the family's opening token makes a random model do
//    it), then the call is bound: every call that closed parses and validates. With a
//    response format too, the answer is a document of the format or a valid call.
//  - A bad schema / regex / grammar / tool is a 400 in the route's vendor shape naming it;
//    an answer cut by max_tokens inside the document ends with "length".
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import OpenAI from "openai";
import Anthropic from "@anthropic-ai/sdk";
import AjvModule from "ajv";
import { startServer, stopServers, bin } from "./server.mjs";
import { augment } from "../oracle/vocab_augment.mjs";

const Ajv = AjvModule.default ?? AjvModule;
const ajv = new Ajv({ strict: false });
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "tm-structured-"));

// Realistic schemas, closed (additionalProperties false) so that random output ends.
const person = {
  type: "object",
  properties: {
    name: { type: "string", maxLength: 12 },
    age: { type: "integer", minimum: 0, maximum: 130 },
    role: { enum: ["admin", "user", "guest"] },
    email: { type: "string", pattern: "^[a-z]{1,8}@[a-z]{1,8}\\.com$" },
    tags: { type: "array", items: { type: "string", maxLength: 6 }, maxItems: 3 },
  },
  required: ["name", "age", "role"],
  additionalProperties: false,
};
const order = {
  type: "object",
  properties: {
    id: { type: "integer", minimum: 1, maximum: 99999 },
    items: {
      type: "array", minItems: 1, maxItems: 3,
      items: {
        type: "object",
        properties: { sku: { type: "string", pattern: "^[A-Z]{3}-[0-9]{3}$" }, qty: { type: "integer", minimum: 1, maximum: 9 } },
        required: ["sku", "qty"], additionalProperties: false,
      },
    },
    express: { type: "boolean" },
  },
  required: ["id", "items", "express"],
  additionalProperties: false,
};
const weather = {
  type: "object",
  properties: { city: { type: "string", maxLength: 12 }, unit: { enum: ["c", "f"] } },
  required: ["city", "unit"],
  additionalProperties: false,
};
const clock = {
  type: "object",
  properties: { tz: { type: "string", pattern: "^[A-Z][a-z]{1,8}/[A-Z][a-z]{1,8}$" } },
  required: ["tz"],
  additionalProperties: false,
};
const schemaOf = { get_weather: weather, get_time: clock };
const chatTools = Object.entries(schemaOf).map(([name, parameters]) =>
  ({ type: "function", function: { name, description: `tool ${name}`, parameters, strict: true } }));
const respTools = Object.entries(schemaOf).map(([name, parameters]) =>
  ({ type: "function", name, description: `tool ${name}`, parameters, strict: true }));
const antTools = Object.entries(schemaOf).map(([name, input_schema]) => ({ name, description: `tool ${name}`, input_schema }));

const user = (text) => [{ role: "user", content: text }];
const MAX = 1500;

function valid(schema, doc, what) {
  const v = ajv.compile(schema);
  assert.ok(v(doc), `${what}: ${JSON.stringify(doc)}: ${ajv.errorsText(v.errors)}`);
}

function checkCall(name, args, allowed, what) {
  assert.ok(allowed.includes(name), `${what}: tool ${name} not in ${allowed}`);
  valid(schemaOf[name], typeof args === "string" ? JSON.parse(args) : args, `${what} ${name}`);
}

// The tool calls of a streamed chat completion, by index, and its finish reason.
async function streamedCalls(stream) {
  const calls = [];
  let finish = null;
  for await (const ch of stream) {
    for (const tc of ch.choices[0]?.delta?.tool_calls ?? []) {
      if (tc.function?.name) calls[tc.index] = { name: tc.function.name, args: "" };
      calls[tc.index].args += tc.function?.arguments ?? "";
    }
    finish = ch.choices[0]?.finish_reason ?? finish;
  }
  return { calls, finish };
}

let Q, oai, ant;
before(async () => {
  const vocab = path.join(tmp, "vocab-q3.gguf"), model = path.join(tmp, "q3.gguf");
  augment("qwen3", vocab);
  execFileSync(bin, ["mkmodel", "--arch", "qwen3", "--preset", "tiny", "--vocab", vocab, "--type", "q8_0", "--seed", "5",
    "-o", model], { stdio: "pipe" });
  Q = await startServer(model, ["--ctx", "4096", "--template", "qwen3", "--model-name", "q3"]);
  oai = new OpenAI({ baseURL: `${Q.url}/v1`, apiKey: "x", maxRetries: 0, timeout: 600000 });
  ant = new Anthropic({ baseURL: Q.url, apiKey: "x", maxRetries: 0, timeout: 600000 });
});
after(async () => {
  await stopServers();
  fs.rmSync(tmp, { recursive: true, force: true });
});

test("chat response_format json_schema: every sample ends, parses and validates (n, and streaming)", async () => {
  for (const [name, schema] of [["person", person], ["order", order]]) {
    const r = await oai.chat.completions.create({
      model: "q3", messages: user("Give me one."), temperature: 1, seed: 3, n: 3, max_tokens: MAX,
      response_format: { type: "json_schema", json_schema: { name, schema, strict: true } },
    });
    assert.equal(r.choices.length, 3);
    for (const c of r.choices) {
      assert.equal(c.finish_reason, "stop", c.message.content);
      valid(schema, JSON.parse(c.message.content), name);
    }
  }
  const s = await oai.chat.completions.create({
    model: "q3", messages: user("One order."), temperature: 1, seed: 4, max_tokens: MAX, stream: true,
    response_format: { type: "json_schema", json_schema: { name: "order", schema: order } },
  });
  let text = "", finish = null;
  for await (const ch of s) {
    text += ch.choices[0]?.delta?.content ?? "";
    finish = ch.choices[0]?.finish_reason ?? finish;
  }
  assert.equal(finish, "stop");
  valid(order, JSON.parse(text), "streamed order");
});

test("chat json_object, guided_regex, guided_choice, guided_grammar, llama.cpp json_schema", async () => {
  const base = { model: "q3", messages: user("x"), temperature: 1, max_tokens: MAX };
  // an open object never has to end (random keys): an answer that ended is an object, one cut
  // by the budget is the start of one
  const o = await oai.chat.completions.create({ ...base, max_tokens: 200, seed: 1, n: 2, response_format: { type: "json_object" } });
  for (const c of o.choices) {
    assert.match(c.message.content, /^\s*\{/);
    if (c.finish_reason !== "stop") continue;
    const v = JSON.parse(c.message.content);
    assert.ok(v && typeof v === "object" && !Array.isArray(v), c.message.content);
  }
  const re = "[a-z]{2,6}@[a-z]{2,6}\\.(com|org)";
  const g = await oai.chat.completions.create({ ...base, seed: 2, n: 3, guided_regex: re });
  for (const c of g.choices) assert.match(c.message.content, new RegExp(`^(?:${re})$`));
  const choices = ["yes", "no", "maybe \"so\""];
  const ch = await oai.chat.completions.create({ ...base, seed: 3, n: 4, guided_choice: choices });
  for (const c of ch.choices) assert.ok(choices.includes(c.message.content), c.message.content);
  const gb = await oai.chat.completions.create({ ...base, seed: 4, n: 2, guided_grammar: 'root ::= "A" [0-9] [0-9]? "!"' });
  for (const c of gb.choices) assert.match(c.message.content, /^A[0-9][0-9]?!$/);
  const js = await oai.chat.completions.create({ ...base, seed: 5, n: 2, json_schema: person });
  for (const c of js.choices) valid(person, JSON.parse(c.message.content), "json_schema extension");
});

test("responses text.format json_schema (and streaming); json_object", async () => {
  const r = await oai.responses.create({
    model: "q3", input: "A person.", temperature: 1, max_output_tokens: MAX,
    text: { format: { type: "json_schema", name: "person", schema: person, strict: true } },
  });
  assert.equal(r.status, "completed");
  assert.equal(r.text.format.type, "json_schema");  // the response echoes the request's format
  valid(person, JSON.parse(r.output_text), "responses person");
  const s = await oai.responses.create({
    model: "q3", input: "An order.", temperature: 1, max_output_tokens: MAX, stream: true,
    text: { format: { type: "json_schema", name: "order", schema: order } },
  });
  let text = "", done = null;
  for await (const ev of s) {
    if (ev.type === "response.output_text.delta") text += ev.delta;
    if (ev.type === "response.completed") done = ev.response;
  }
  assert.ok(done, "completed");
  valid(order, JSON.parse(text), "streamed responses order");
  const o = await oai.responses.create({ model: "q3", input: "x", max_output_tokens: 200, text: { format: { type: "json_object" } } });
  assert.match(o.output_text, /^\s*\{/);
  if (o.status === "completed") assert.equal(typeof JSON.parse(o.output_text), "object");
});

test("forced tool calls, chat: required (n) and a named function (streaming) give valid calls", async () => {
  const r = await oai.chat.completions.create({
    model: "q3", messages: user("Weather or time?"), temperature: 1, seed: 7, n: 4, max_tokens: MAX,
    tools: chatTools, tool_choice: "required",
  });
  for (const c of r.choices) {
    assert.equal(c.finish_reason, "tool_calls");
    assert.equal(c.message.tool_calls.length, 1);
    const f = c.message.tool_calls[0].function;
    checkCall(f.name, f.arguments, ["get_weather", "get_time"], "chat required");
  }
  for (let seed = 1; seed <= 2; seed++) {
    const s = await oai.chat.completions.create({
      model: "q3", messages: user("Time?"), temperature: 1, seed, max_tokens: MAX, stream: true,
      tools: chatTools, tool_choice: { type: "function", function: { name: "get_time" } },
    });
    const { calls, finish } = await streamedCalls(s);
    assert.equal(finish, "tool_calls");
    assert.equal(calls.length, 1);
    checkCall(calls[0].name, calls[0].args, ["get_time"], "chat named stream");
  }
});

test("forced tool calls, responses: required and a named function (streaming)", async () => {
  const r = await oai.responses.create({
    model: "q3", input: "Weather?", temperature: 1, max_output_tokens: MAX, tools: respTools, tool_choice: "required",
  });
  assert.equal(r.tool_choice, "required");
  const calls = r.output.filter((o) => o.type === "function_call");
  assert.equal(calls.length, 1);
  checkCall(calls[0].name, calls[0].arguments, ["get_weather", "get_time"], "responses required");
  const s = await oai.responses.create({
    model: "q3", input: "Weather?", temperature: 1, max_output_tokens: MAX, stream: true, tools: respTools,
    tool_choice: { type: "function", name: "get_weather" },
  });
  let item = null;
  for await (const ev of s) if (ev.type === "response.output_item.done" && ev.item.type === "function_call") item = ev.item;
  assert.ok(item, "a function_call item");
  checkCall(item.name, item.arguments, ["get_weather"], "responses named stream");
});

test("forced tool calls, messages: {type: any} and {type: tool} (streaming)", async () => {
  const m = await ant.messages.create({
    model: "q3", max_tokens: MAX, temperature: 1, messages: user("Weather?"), tools: antTools, tool_choice: { type: "any" },
  });
  assert.equal(m.stop_reason, "tool_use");
  const uses = m.content.filter((b) => b.type === "tool_use");
  assert.equal(uses.length, 1);
  checkCall(uses[0].name, uses[0].input, ["get_weather", "get_time"], "messages any");
  const s = ant.messages.stream({
    model: "q3", max_tokens: MAX, temperature: 1, messages: user("Time?"), tools: antTools,
    tool_choice: { type: "tool", name: "get_time" },
  });
  const fin = await s.finalMessage();
  assert.equal(fin.stop_reason, "tool_use");
  const u = fin.content.find((b) => b.type === "tool_use");
  checkCall(u.name, u.input, ["get_time"], "messages tool stream");
});

test("tool_choice none never gives a call (chat, responses, messages)", async () => {
  const r = await oai.chat.completions.create({
    model: "q3", messages: user("x"), temperature: 1, seed: 9, n: 4, max_tokens: 40, tools: chatTools, tool_choice: "none",
  });
  for (const c of r.choices) assert.ok(!c.message.tool_calls?.length && c.finish_reason !== "tool_calls");
  const p = await oai.responses.create({ model: "q3", input: "x", max_output_tokens: 40, tools: respTools, tool_choice: "none" });
  assert.ok(!p.output.some((o) => o.type === "function_call"));
  const m = await ant.messages.create({
    model: "q3", max_tokens: 40, messages: user("x"), tools: antTools, tool_choice: { type: "none" },
  });
  assert.ok(!m.content.some((b) => b.type === "tool_use"));
});

test("the budget ending inside a document is finish_reason length", async () => {
  const r = await oai.chat.completions.create({
    model: "q3", messages: user("x"), max_tokens: 3, response_format: { type: "json_schema", json_schema: { name: "o", schema: order } },
  });
  assert.equal(r.choices[0].finish_reason, "length");
  const p = await oai.responses.create({
    model: "q3", input: "x", max_output_tokens: 3, text: { format: { type: "json_schema", name: "o", schema: order } },
  });
  assert.equal(p.status, "incomplete");
});

test("bad formats are a 400 in the vendor's shape naming the problem", async () => {
  const bad = (p) => (e) => e.status === 400 && e.type === "invalid_request_error";
  await assert.rejects(oai.chat.completions.create({
    model: "q3", messages: user("x"), response_format: { type: "json_schema", json_schema: { name: "b", schema: { type: "object", not: {} } } },
  }), (e) => bad()(e) && /not/.test(e.message) && e.param === "response_format.json_schema.schema");
  await assert.rejects(oai.chat.completions.create({ model: "q3", messages: user("x"), guided_regex: "(ab" }),
    (e) => bad()(e) && e.param === "guided_regex");
  await assert.rejects(oai.chat.completions.create({ model: "q3", messages: user("x"), guided_grammar: "root ::= undefined-rule" }),
    (e) => bad()(e) && e.param === "guided_grammar");
  await assert.rejects(oai.chat.completions.create({ model: "q3", messages: user("x"), guided_grammar: "root ::= <[999999]>" }),
    (e) => bad()(e) && e.param === "guided_grammar" && /999999/.test(e.message));
  await assert.rejects(oai.chat.completions.create({ model: "q3", messages: user("x"), response_format: { type: "xml" } }),
    (e) => bad()(e) && e.param === "response_format.type");
  await assert.rejects(oai.chat.completions.create({
    model: "q3", messages: user("x"), tools: chatTools, tool_choice: { type: "function", function: { name: "nope" } },
  }), (e) => bad()(e) && /nope/.test(e.message));
  await assert.rejects(oai.chat.completions.create({ model: "q3", messages: user("x"), tool_choice: "required" }),
    (e) => bad()(e) && e.param === "tool_choice");
  await assert.rejects(oai.responses.create({
    model: "q3", input: "x", text: { format: { type: "json_schema", name: "b", schema: { type: "object", patternProperties: { a: {} } } } },
  }), (e) => bad()(e) && /patternProperties/.test(e.message) && e.param === "text.format.schema");
  await assert.rejects(ant.messages.create({
    model: "q3", max_tokens: 10, messages: user("x"), tool_choice: { type: "any" },
    tools: [{ name: "t", input_schema: { type: "object", properties: { a: { type: "string" } }, dependencies: { a: ["b"] } } }],
  }), (e) => e.status === 400 && e.error?.type === "error" && e.error?.error?.type === "invalid_request_error" &&
    /dependencies/.test(e.error.error.message));
});

test("Llama 3 (no marker token): forced calls are its JSON call and validate", async () => {
  const vocab = path.join(tmp, "vocab-l3.gguf"), model = path.join(tmp, "l3.gguf");
  augment("llama31", vocab);
  execFileSync(bin, ["mkmodel", "--arch", "llama", "--preset", "tiny", "--vocab", vocab, "--type", "q8_0", "--seed", "6",
    "-o", model], { stdio: "pipe" });
  const L = await startServer(model, ["--ctx", "4096", "--template", "llama3", "--model-name", "l3"]);
  const o = new OpenAI({ baseURL: `${L.url}/v1`, apiKey: "x", maxRetries: 0, timeout: 600000 });
  const r = await o.chat.completions.create({
    model: "l3", messages: user("Weather?"), temperature: 1, seed: 2, n: 3, max_tokens: MAX, tools: chatTools, tool_choice: "required",
  });
  for (const c of r.choices) {
    assert.equal(c.finish_reason, "tool_calls", JSON.stringify(c.message));
    checkCall(c.message.tool_calls[0].function.name, c.message.tool_calls[0].function.arguments, ["get_weather", "get_time"], "llama3");
  }
});

test("reasoning stays free: DeepSeek-R1's open think block, then a valid answer", async () => {
  const vocab = path.join(tmp, "vocab-ds.gguf"), model = path.join(tmp, "ds.gguf");
  augment("deepseek3", vocab);
  execFileSync(bin, ["mkmodel", "--arch", "llama", "--preset", "tiny", "--vocab", vocab, "--type", "q8_0", "--seed", "5",
    "-o", model], { stdio: "pipe" });
  const D = await startServer(model, ["--ctx", "4096", "--template", "deepseek-r1", "--model-name", "ds"]);
  const o = new OpenAI({ baseURL: `${D.url}/v1`, apiKey: "x", maxRetries: 0, timeout: 600000 });
  const r = await o.chat.completions.create({
    model: "ds", messages: user("A person."), temperature: 1, seed: 1, max_tokens: MAX,
    thinking: { type: "enabled", budget_tokens: 12 },
    response_format: { type: "json_schema", json_schema: { name: "person", schema: person } },
  });
  const c = r.choices[0];
  assert.equal(r.usage.completion_tokens_details.reasoning_tokens > 0, true);
  assert.ok(c.message.reasoning_content.length > 0, "free reasoning");
  assert.equal(c.finish_reason, "stop");
  valid(person, JSON.parse(c.message.content), "after reasoning");
  // without a budget: the model closes the block itself (a strong bias on </think> makes a
  // random model do it at once), and the format applies from there (the scheduler follows
  // think blocks for a grammar, not only for a budget)
  const THINK_END = 100018;  // </think> in the augmented vocabulary
  for (const seed of [1, 2]) {
    const f = await o.chat.completions.create({
      model: "ds", messages: user("A person."), temperature: 1, seed, max_tokens: MAX, thinking: { type: "enabled" },
      logit_bias: { [THINK_END]: 40 }, response_format: { type: "json_schema", json_schema: { name: "person", schema: person } },
    });
    assert.equal(f.choices[0].finish_reason, "stop", JSON.stringify(f.choices[0].message));
    valid(person, JSON.parse(f.choices[0].message.content), "after free reasoning");
  }
});

// Token ids of a marker text in a model's vocabulary.
const tokenId = (model, text) => {
  const ids = JSON.parse(execFileSync(bin, ["tokenize", "-m", model, "--special", "--no-bos", text], { encoding: "utf8" }));
  assert.equal(ids.length, 1, `${text} is one token`);
  return ids[0];
};

// Calls of a non-streamed chat choice: all validate but a last one cut by the budget.
function checkCalls(c, allowed, what) {
  const calls = c.message.tool_calls ?? [];
  const n = Math.max(0, c.finish_reason === "length" ? calls.length - 1 : calls.length);
  for (let i = 0; i < n; i++) {
    checkCall(calls[i].function.name, calls[i].function.arguments, allowed, `${what} #${i}`);
    // the pushed marker token is never text inside a bound call (added tokens match by id only)
    assert.ok(!/<tool_call>|tool▁calls▁begin/.test(calls[i].function.arguments), calls[i].function.arguments);
  }
  return n;
}

test("strict tools under auto (Qwen3): free until <tool_call>, then every call is bound (chat n + stream, responses, messages)", async () => {
  const model = path.join(tmp, "q3.gguf"), TC = tokenId(model, "<tool_call>");
  const bias = { [TC]: 100 };  // a random model opens calls only when pushed; it is free otherwise
  const r = await oai.chat.completions.create({
    model: "q3", messages: user("Weather?"), temperature: 1, seed: 11, n: 2, max_tokens: 150, tools: chatTools,
    tool_choice: "auto", logit_bias: bias,
  });
  let n = 0;
  for (const c of r.choices) n += checkCalls(c, ["get_weather", "get_time"], "chat auto strict");
  assert.ok(n >= 3, `${n} complete calls`);
  const s = await oai.chat.completions.create({
    model: "q3", messages: user("Time?"), temperature: 1, seed: 12, max_tokens: 100, stream: true, tools: chatTools,
    tool_choice: "auto", logit_bias: bias,
  });
  const { calls, finish } = await streamedCalls(s);
  const done = finish === "length" ? calls.slice(0, -1) : calls;
  assert.ok(done.length >= 1, `${done.length} complete streamed calls`);
  for (const c of done) checkCall(c.name, c.args, ["get_weather", "get_time"], "chat auto strict stream");
  // responses and messages read strict too (logit_bias as the extension both accept)
  const p = await oai.responses.create({
    model: "q3", input: "Weather?", temperature: 1, max_output_tokens: 120, tools: respTools, tool_choice: "auto", logit_bias: bias,
  });
  const pc = p.output.filter((o) => o.type === "function_call");
  assert.ok(pc.length >= 2, `${pc.length} responses calls`);
  for (const c of pc.slice(0, p.status === "incomplete" ? -1 : undefined)) checkCall(c.name, c.arguments, ["get_weather", "get_time"], "responses auto strict");
  const m = await ant.messages.create({
    model: "q3", max_tokens: 120, temperature: 1, messages: user("Weather?"), logit_bias: bias, tool_choice: { type: "auto" },
    tools: antTools.map((t) => ({ ...t, strict: true })),
  });
  const mu = m.content.filter((b) => b.type === "tool_use");
  assert.ok(mu.length >= 2, `${mu.length} messages calls`);
  for (const u of mu.slice(0, m.stop_reason === "max_tokens" ? -1 : undefined)) checkCall(u.name, u.input, ["get_weather", "get_time"], "messages auto strict");
  // without the push the model answers in text: the format does not bind the answer itself
  const f = await oai.chat.completions.create({
    model: "q3", messages: user("Hi"), temperature: 1, seed: 3, max_tokens: 24, tools: chatTools, tool_choice: "auto",
  });
  assert.ok(f.choices[0].message.content.length > 0 && !f.choices[0].message.tool_calls?.length);
  assert.ok(!/^\s*\{/.test(f.choices[0].message.content), f.choices[0].message.content);
});

// parallel_tool_calls false / disable_parallel_tool_use: after the first call the grammar stays
// bound to free text in which <tool_call> is masked, so even pushed the model calls once.
test("parallel tool calls off (Qwen3, strict tools under auto): one call, pushed or not", async () => {
  const TC = tokenId(path.join(tmp, "q3.gguf"), "<tool_call>");
  const body = { model: "q3", messages: user("Weather?"), temperature: 1, seed: 11, max_tokens: 80, tools: chatTools,
    tool_choice: "auto", logit_bias: { [TC]: 100 }, return_token_ids: true };
  const many = await oai.chat.completions.create(body);
  assert.ok(many.choices[0].token_ids.filter((id) => id === TC).length >= 2, "pushed, the model opens several calls");
  const one = await oai.chat.completions.create({ ...body, parallel_tool_calls: false });
  assert.deepEqual(one.choices[0].token_ids.filter((id) => id === TC), [TC]);
  assert.equal(one.choices[0].message.tool_calls.length, 1);
  checkCall(one.choices[0].message.tool_calls[0].function.name, one.choices[0].message.tool_calls[0].function.arguments,
    ["get_weather", "get_time"], "one call");
  const m = await ant.messages.create({ model: "q3", max_tokens: 80, temperature: 1, messages: user("Weather?"), logit_bias: { [TC]: 100 },
    tool_choice: { type: "auto", disable_parallel_tool_use: true }, tools: antTools.map((t) => ({ ...t, strict: true })) });
  assert.equal(m.content.filter((b) => b.type === "tool_use").length, 1);
});

test("a response format with tools under auto: a document of the format, or (from <tool_call>) a valid call", async () => {
  const model = path.join(tmp, "q3.gguf"), TC = tokenId(model, "<tool_call>");
  const rf = { type: "json_schema", json_schema: { name: "person", schema: person, strict: true } };
  const doc = await oai.chat.completions.create({
    model: "q3", messages: user("Who?"), temperature: 1, seed: 21, n: 2, max_tokens: MAX, tools: chatTools,
    tool_choice: "auto", response_format: rf, logit_bias: { [TC]: -100 },  // this random model favours <tool_call>
  });
  for (const c of doc.choices) {
    assert.equal(c.finish_reason, "stop", JSON.stringify(c.message));
    valid(person, JSON.parse(c.message.content), "format with tools");
  }
  const call = await oai.chat.completions.create({
    model: "q3", messages: user("Weather?"), temperature: 1, seed: 22, n: 2, max_tokens: MAX, tools: chatTools,
    tool_choice: "auto", response_format: rf, logit_bias: { [TC]: 100 },
  });
  for (const c of call.choices) {
    assert.equal(c.finish_reason, "tool_calls", JSON.stringify(c.message));
    assert.equal(c.message.tool_calls.length, 1);
    checkCall(c.message.tool_calls[0].function.name, c.message.tool_calls[0].function.arguments, ["get_weather", "get_time"], "format or call");
  }
});

test("DeepSeek V3.1: forced calls in its control-token syntax in every API (streaming and not); strict tools under auto", async () => {
  const vocab = path.join(tmp, "vocab-ds3.gguf"), model = path.join(tmp, "ds3.gguf");
  augment("deepseek3", vocab);
  execFileSync(bin, ["mkmodel", "--arch", "llama", "--preset", "tiny", "--vocab", vocab, "--type", "q8_0", "--seed", "7",
    "-o", model], { stdio: "pipe" });
  const D = await startServer(model, ["--ctx", "4096", "--template", "deepseek3", "--model-name", "ds3"]);
  const o = new OpenAI({ baseURL: `${D.url}/v1`, apiKey: "x", maxRetries: 0, timeout: 600000 });
  const a = new Anthropic({ baseURL: D.url, apiKey: "x", maxRetries: 0, timeout: 600000 });
  const r = await o.chat.completions.create({
    model: "ds3", messages: user("Weather or time?"), temperature: 1, seed: 3, n: 3, max_tokens: MAX, tools: chatTools,
    tool_choice: "required", return_token_ids: true,
  });
  const BEGIN = tokenId(model, "<｜tool▁calls▁begin｜>"), SEP = tokenId(model, "<｜tool▁sep｜>");
  for (const c of r.choices) {
    assert.equal(c.finish_reason, "tool_calls", JSON.stringify(c.message));
    assert.equal(c.message.tool_calls.length, 1);
    checkCall(c.message.tool_calls[0].function.name, c.message.tool_calls[0].function.arguments, ["get_weather", "get_time"], "ds chat");
    // the markers are the family's own tokens
    assert.equal(c.token_ids[0], BEGIN);
    assert.ok(c.token_ids.includes(SEP));
  }
  const s = await o.chat.completions.create({
    model: "ds3", messages: user("Time?"), temperature: 1, seed: 4, max_tokens: MAX, stream: true, tools: chatTools,
    tool_choice: { type: "function", function: { name: "get_time" } },
  });
  const { calls, finish } = await streamedCalls(s);
  assert.equal(finish, "tool_calls");
  assert.equal(calls.length, 1);
  checkCall(calls[0].name, calls[0].args, ["get_time"], "ds chat named stream");
  const p = await o.responses.create({ model: "ds3", input: "Weather?", temperature: 1, max_output_tokens: MAX, tools: respTools, tool_choice: "required" });
  const pc = p.output.filter((x) => x.type === "function_call");
  assert.equal(pc.length, 1);
  checkCall(pc[0].name, pc[0].arguments, ["get_weather", "get_time"], "ds responses");
  const ms = a.messages.stream({
    model: "ds3", max_tokens: MAX, temperature: 1, messages: user("Weather?"), tools: antTools, tool_choice: { type: "tool", name: "get_weather" },
  });
  const fin = await ms.finalMessage();
  assert.equal(fin.stop_reason, "tool_use");
  const u = fin.content.find((b) => b.type === "tool_use");
  checkCall(u.name, u.input, ["get_weather"], "ds messages stream");
  // strict tools under auto: bound from <｜tool▁calls▁begin｜> on
  const auto = await o.chat.completions.create({
    model: "ds3", messages: user("Weather?"), temperature: 1, seed: 5, n: 2, max_tokens: 150, tools: chatTools,
    tool_choice: "auto", logit_bias: { [BEGIN]: 100 },
  });
  let n = 0;
  for (const c of auto.choices) n += checkCalls(c, ["get_weather", "get_time"], "ds auto strict");
  assert.ok(n >= 2, `${n} complete calls`);
});
