// structured_cases: structured-output cases that run against any tokenmill front (serve, or a
// gateway with its workers), with the real SDKs: realistic closed schemas (random output
// ends), and checks that every answer parses and validates (ajv), regexes and grammars match,
// forced tool calls name an allowed tool with valid arguments, bad formats are a 400 in the
// vendor's shape, a budget ending inside a document is "length". Each case takes
// { oai, ant, model } (OpenAI and Anthropic clients of the front, the model name).
import assert from "node:assert/strict";
import { execFile, execFileSync } from "node:child_process";
import path from "node:path";
import { promisify } from "node:util";
import AjvModule from "ajv";
import OpenAI from "openai";
import Anthropic from "@anthropic-ai/sdk";
import { bin } from "./server.mjs";
import { augment } from "../oracle/vocab_augment.mjs";

const Ajv = AjvModule.default ?? AjvModule;
const ajv = new Ajv({ strict: false });

export const person = {
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
export const order = {
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
export const schemaOf = { get_weather: weather, get_time: clock };
export const chatTools = Object.entries(schemaOf).map(([name, parameters]) =>
  ({ type: "function", function: { name, description: `tool ${name}`, parameters, strict: true } }));
export const respTools = Object.entries(schemaOf).map(([name, parameters]) =>
  ({ type: "function", name, description: `tool ${name}`, parameters, strict: true }));
export const antTools = Object.entries(schemaOf).map(([name, input_schema]) => ({ name, description: `tool ${name}`, input_schema }));

export const user = (text) => [{ role: "user", content: text }];

// A generated model (mkmodel --preset tiny of arch, seeded) on the augmented vocabulary of
// family (vocab_augment.mjs), written as dir/NAME.gguf: resolves to its path.
export async function genModel(dir, name, arch, family, seed) {
  const vocab = path.join(dir, `vocab-${name}.gguf`), gguf = path.join(dir, `${name}.gguf`);
  augment(family, vocab);
  await promisify(execFile)(bin, ["mkmodel", "--arch", arch, "--preset", "tiny", "--vocab", vocab, "--type", "q8_0",
    "--seed", String(seed), "-o", gguf]);
  return gguf;
}

// The SDK clients of a front (a server or a gateway) at url for model name: a case's ctx.
export const clients = (url, model) => ({
  model,
  oai: new OpenAI({ baseURL: `${url}/v1`, apiKey: "x", maxRetries: 0, timeout: 600000 }),
  ant: new Anthropic({ baseURL: url, apiKey: "x", maxRetries: 0, timeout: 600000 }),
});
export const MAX = 1500;

export function valid(schema, doc, what) {
  const v = ajv.compile(schema);
  assert.ok(v(doc), `${what}: ${JSON.stringify(doc)}: ${ajv.errorsText(v.errors)}`);
}

export function checkCall(name, args, allowed, what) {
  assert.ok(allowed.includes(name), `${what}: tool ${name} not in ${allowed}`);
  valid(schemaOf[name], typeof args === "string" ? JSON.parse(args) : args, `${what} ${name}`);
}

// Token id of a marker text in a model's vocabulary (model: the GGUF's path).
export function tokenId(model, text) {
  const ids = JSON.parse(execFileSync(bin, ["tokenize", "-m", model, "--special", "--no-bos", text], { encoding: "utf8" }));
  assert.equal(ids.length, 1, `${text} is one token`);
  return ids[0];
}

// The tool calls of a streamed chat completion, by index, and its finish reason.
export async function streamedCalls(stream) {
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

// Calls of a non-streamed chat choice: all validate but a last one cut by the budget; returns
// how many were complete.
export function checkCalls(c, allowed, what) {
  const calls = c.message.tool_calls ?? [];
  const n = Math.max(0, c.finish_reason === "length" ? calls.length - 1 : calls.length);
  for (let i = 0; i < n; i++) {
    checkCall(calls[i].function.name, calls[i].function.arguments, allowed, `${what} #${i}`);
    // the pushed marker token is never text inside a bound call (added tokens match by id only)
    assert.ok(!/<tool_call>|tool▁calls▁begin/.test(calls[i].function.arguments), calls[i].function.arguments);
  }
  return n;
}

// chat response_format json_schema at temperature 1: n samples, then one streamed.
export async function jsonSchemaCase({ oai, model }, n = 2) {
  const r = await oai.chat.completions.create({
    model, messages: user("Give me one."), temperature: 1, seed: 3, n, max_tokens: MAX,
    response_format: { type: "json_schema", json_schema: { name: "person", schema: person, strict: true } },
  });
  assert.equal(r.choices.length, n);
  for (const c of r.choices) {
    assert.equal(c.finish_reason, "stop", c.message.content);
    valid(person, JSON.parse(c.message.content), "person");
  }
  const s = await oai.chat.completions.create({
    model, messages: user("One order."), temperature: 1, seed: 4, max_tokens: MAX, stream: true,
    response_format: { type: "json_schema", json_schema: { name: "order", schema: order } },
  });
  let text = "", finish = null;
  for await (const ch of s) {
    text += ch.choices[0]?.delta?.content ?? "";
    finish = ch.choices[0]?.finish_reason ?? finish;
  }
  assert.equal(finish, "stop");
  valid(order, JSON.parse(text), "streamed order");
}

// The llama.cpp / vLLM extensions: a regex, a choice list (n samples each), a GBNF grammar.
export async function extensionsCase({ oai, model }, n = 2) {
  const base = { model, messages: user("x"), temperature: 1, max_tokens: MAX };
  const re = "[a-z]{2,6}@[a-z]{2,6}\\.(com|org)";
  const g = await oai.chat.completions.create({ ...base, seed: 2, n, guided_regex: re });
  for (const c of g.choices) assert.match(c.message.content, new RegExp(`^(?:${re})$`));
  const choices = ["yes", "no", "maybe \"so\""];
  const ch = await oai.chat.completions.create({ ...base, seed: 3, n, guided_choice: choices });
  for (const c of ch.choices) assert.ok(choices.includes(c.message.content), c.message.content);
  const gb = await oai.chat.completions.create({ ...base, seed: 4, n: 2, guided_grammar: 'root ::= "A" [0-9] [0-9]? "!"' });
  for (const c of gb.choices) assert.match(c.message.content, /^A[0-9][0-9]?!$/);
}

// Forced tool calls: chat "required" (n) and Anthropic {type: "tool"} streamed.
export async function forcedCallCase({ oai, ant, model }, n = 2) {
  const r = await oai.chat.completions.create({
    model, messages: user("Weather or time?"), temperature: 1, seed: 7, n, max_tokens: MAX,
    tools: chatTools, tool_choice: "required",
  });
  for (const c of r.choices) {
    assert.equal(c.finish_reason, "tool_calls");
    assert.equal(c.message.tool_calls.length, 1);
    const f = c.message.tool_calls[0].function;
    checkCall(f.name, f.arguments, ["get_weather", "get_time"], "chat required");
  }
  const s = ant.messages.stream({
    model, max_tokens: MAX, temperature: 1, messages: user("Time?"), tools: antTools,
    tool_choice: { type: "tool", name: "get_time" },
  });
  const fin = await s.finalMessage();
  assert.equal(fin.stop_reason, "tool_use");
  const u = fin.content.find((b) => b.type === "tool_use");
  checkCall(u.name, u.input, ["get_time"], "messages tool stream");
}

// A budget ending inside a document is finish_reason "length".
export async function lengthCase({ oai, model }) {
  const r = await oai.chat.completions.create({
    model, messages: user("x"), max_tokens: 3, response_format: { type: "json_schema", json_schema: { name: "o", schema: order } },
  });
  assert.equal(r.choices[0].finish_reason, "length");
}

// Bad formats: a 400 in the vendor's shape naming the problem.
export async function badFormatCase({ oai, ant, model }) {
  const bad = (e) => e.status === 400 && e.type === "invalid_request_error";
  await assert.rejects(oai.chat.completions.create({
    model, messages: user("x"), response_format: { type: "json_schema", json_schema: { name: "b", schema: { type: "object", not: {} } } },
  }), (e) => bad(e) && /not/.test(e.message) && e.param === "response_format.json_schema.schema");
  await assert.rejects(oai.chat.completions.create({ model, messages: user("x"), guided_regex: "(ab" }),
    (e) => bad(e) && e.param === "guided_regex");
  await assert.rejects(ant.messages.create({
    model, max_tokens: 10, messages: user("x"), tool_choice: { type: "any" },
    tools: [{ name: "t", input_schema: { type: "object", properties: { a: { type: "string" } }, dependencies: { a: ["b"] } } }],
  }), (e) => e.status === 400 && e.error?.type === "error" && e.error?.error?.type === "invalid_request_error" &&
    /dependencies/.test(e.error.error.message));
}

// Responses text.format json_schema, streamed.
export async function responsesCase({ oai, model }) {
  const s = await oai.responses.create({
    model, input: "An order.", temperature: 1, max_output_tokens: MAX, stream: true,
    text: { format: { type: "json_schema", name: "order", schema: order } },
  });
  let text = "", done = null;
  for await (const ev of s) {
    if (ev.type === "response.output_text.delta") text += ev.delta;
    if (ev.type === "response.completed") done = ev.response;
  }
  assert.ok(done, "completed");
  valid(order, JSON.parse(text), "streamed responses order");
}

// Reasoning stays free on a DeepSeek-templated model whose prompt opens the think block: with
// a budget, and without one (a strong bias on </think>, id thinkEnd, makes a random model
// close the block itself; one request per seed); the answer after the block validates.
// Returns the answers.
export async function reasoningCase({ oai, model }, thinkEnd, seeds = [2]) {
  const r = await oai.chat.completions.create({
    model, messages: user("A person."), temperature: 1, seed: 1, max_tokens: MAX,
    thinking: { type: "enabled", budget_tokens: 12 },
    response_format: { type: "json_schema", json_schema: { name: "person", schema: person } },
  });
  const c = r.choices[0];
  assert.ok(r.usage.completion_tokens_details.reasoning_tokens > 0 && c.message.reasoning_content.length > 0, "free reasoning");
  assert.equal(c.finish_reason, "stop");
  valid(person, JSON.parse(c.message.content), "after reasoning");
  const out = [answer(r)];
  for (const seed of seeds) {
    const f = await oai.chat.completions.create({
      model, messages: user("A person."), temperature: 1, seed, max_tokens: MAX, thinking: { type: "enabled" },
      logit_bias: { [thinkEnd]: 40 }, response_format: { type: "json_schema", json_schema: { name: "person", schema: person } },
    });
    assert.equal(f.choices[0].finish_reason, "stop", JSON.stringify(f.choices[0].message));
    valid(person, JSON.parse(f.choices[0].message.content), "after free reasoning");
    out.push(answer(f));
  }
  return out;
}

// What two runs of one seeded request must agree on (serve, and a gateway with its workers):
// per choice the text, the calls, how it ended and the token ids when asked for; a streamed
// call list ({ calls, finish }) as it is. Ids and timestamps are left out (fresh per response).
export function answer(x) {
  if (x.object === "chat.completion")
    return x.choices.map((c) => ({ finish: c.finish_reason, text: c.message.content, think: c.message.reasoning_content, ids: c.token_ids,
      calls: (c.message.tool_calls ?? []).map((t) => [t.function.name, t.function.arguments]) }));
  if (x.object === "response")
    return { status: x.status, out: x.output.map((o) => o.type === "function_call" ? [o.name, o.arguments]
      : o.type === "message" ? o.content.map((p) => p.text) : o.type) };
  if (x.type === "message")
    return { stop: x.stop_reason, out: x.content.map((b) => b.type === "text" ? b.text : b.type === "tool_use" ? [b.name, b.input] : b.type) };
  return x;
}

// The first part of strictAutoCase: two seeded chat choices pushed to open calls (tc: the
// call-opening token), every call that closed bound. Returns the answer, for comparisons.
export async function strictAutoChatCase({ oai, model }, tc) {
  const r = await oai.chat.completions.create({
    model, messages: user("Weather?"), temperature: 1, seed: 11, n: 2, max_tokens: 150, tools: chatTools,
    tool_choice: "auto", logit_bias: { [tc]: 100 }, return_token_ids: true,
  });
  let n = 0;
  for (const c of r.choices) n += checkCalls(c, ["get_weather", "get_time"], "chat auto strict");
  assert.ok(n >= 3, `${n} complete calls`);
  return answer(r);
}

// Strict tools under tool_choice auto on a Qwen-templated model: the answer is free until the
// model opens a call (a logit_bias on <tool_call>, id tc, makes a random model do it), then
// every call is bound: chat (n and streamed), responses and messages (logit_bias as the
// extension both accept); without the push the answer is text. Returns the answers.
export async function strictAutoCase({ oai, ant, model }, tc) {
  const bias = { [tc]: 100 };
  const chat = await strictAutoChatCase({ oai, model }, tc);
  const s = await streamedCalls(await oai.chat.completions.create({
    model, messages: user("Time?"), temperature: 1, seed: 12, max_tokens: 100, stream: true, tools: chatTools,
    tool_choice: "auto", logit_bias: bias,
  }));
  const done = s.finish === "length" ? s.calls.slice(0, -1) : s.calls;
  assert.ok(done.length >= 1, `${done.length} complete streamed calls`);
  for (const c of done) checkCall(c.name, c.args, ["get_weather", "get_time"], "chat auto strict stream");
  const p = await oai.responses.create({
    model, input: "Weather?", temperature: 1, seed: 13, max_output_tokens: 120, tools: respTools, tool_choice: "auto", logit_bias: bias,
  });
  const pc = p.output.filter((o) => o.type === "function_call");
  assert.ok(pc.length >= 2, `${pc.length} responses calls`);
  for (const c of pc.slice(0, p.status === "incomplete" ? -1 : undefined)) checkCall(c.name, c.arguments, ["get_weather", "get_time"], "responses auto strict");
  const m = await ant.messages.create({
    model, max_tokens: 120, temperature: 1, seed: 14, messages: user("Weather?"), logit_bias: bias, tool_choice: { type: "auto" },
    tools: antTools.map((t) => ({ ...t, strict: true })),
  });
  const mu = m.content.filter((b) => b.type === "tool_use");
  assert.ok(mu.length >= 2, `${mu.length} messages calls`);
  for (const u of mu.slice(0, m.stop_reason === "max_tokens" ? -1 : undefined)) checkCall(u.name, u.input, ["get_weather", "get_time"], "messages auto strict");
  // without the push the model answers in text: the call grammar does not bind the answer itself
  const f = await oai.chat.completions.create({
    model, messages: user("Hi"), temperature: 1, seed: 3, max_tokens: 24, tools: chatTools, tool_choice: "auto", return_token_ids: true,
  });
  assert.ok(f.choices[0].message.content.length > 0 && !f.choices[0].message.tool_calls?.length);
  assert.ok(!/^\s*\{/.test(f.choices[0].message.content), f.choices[0].message.content);
  return [chat, s, answer(p), answer(m), answer(f)];
}

// A response format with tools under auto (Qwen): a document of the format (the call-opening
// token tc pushed down, this random model favours it), or from tc one valid call. Returns the
// answers.
export async function formatOrCallCase({ oai, model }, tc) {
  const rf = { type: "json_schema", json_schema: { name: "person", schema: person, strict: true } };
  const doc = await oai.chat.completions.create({
    model, messages: user("Who?"), temperature: 1, seed: 21, n: 2, max_tokens: MAX, tools: chatTools,
    tool_choice: "auto", response_format: rf, logit_bias: { [tc]: -100 },
  });
  for (const c of doc.choices) {
    assert.equal(c.finish_reason, "stop", JSON.stringify(c.message));
    valid(person, JSON.parse(c.message.content), "format with tools");
  }
  const call = await oai.chat.completions.create({
    model, messages: user("Weather?"), temperature: 1, seed: 22, n: 2, max_tokens: MAX, tools: chatTools,
    tool_choice: "auto", response_format: rf, logit_bias: { [tc]: 100 },
  });
  for (const c of call.choices) {
    assert.equal(c.finish_reason, "tool_calls", JSON.stringify(c.message));
    assert.equal(c.message.tool_calls.length, 1);
    checkCall(c.message.tool_calls[0].function.name, c.message.tool_calls[0].function.arguments, ["get_weather", "get_time"], "format or call");
  }
  return [answer(doc), answer(call)];
}

// tool_choice none never gives a call (chat n, responses, messages). Returns the answers.
export async function noneCase({ oai, ant, model }) {
  const r = await oai.chat.completions.create({
    model, messages: user("x"), temperature: 1, seed: 9, n: 4, max_tokens: 40, tools: chatTools, tool_choice: "none",
  });
  for (const c of r.choices) assert.ok(!c.message.tool_calls?.length && c.finish_reason !== "tool_calls");
  const p = await oai.responses.create({ model, input: "x", seed: 1, max_output_tokens: 40, tools: respTools, tool_choice: "none" });
  assert.ok(!p.output.some((o) => o.type === "function_call"));
  const m = await ant.messages.create({
    model, max_tokens: 40, seed: 1, messages: user("x"), tools: antTools, tool_choice: { type: "none" },
  });
  assert.ok(!m.content.some((b) => b.type === "tool_use"));
  return [answer(r), answer(p), answer(m)];
}

// json_object (chat n, responses): an open object never has to end (random keys), so an answer
// that ended is an object and one cut by the budget (max tokens) is the start of one. Returns
// the answers.
export async function jsonObjectCase({ oai, model }, max = 200) {
  const o = await oai.chat.completions.create({
    model, messages: user("x"), temperature: 1, max_tokens: max, seed: 1, n: 2, response_format: { type: "json_object" },
  });
  for (const c of o.choices) {
    assert.match(c.message.content, /^\s*\{/);
    if (c.finish_reason !== "stop") continue;
    const v = JSON.parse(c.message.content);
    assert.ok(v && typeof v === "object" && !Array.isArray(v), c.message.content);
  }
  const p = await oai.responses.create({ model, input: "x", seed: 2, max_output_tokens: max, text: { format: { type: "json_object" } } });
  assert.match(p.output_text, /^\s*\{/);
  if (p.status === "completed") assert.equal(typeof JSON.parse(p.output_text), "object");
  return [answer(o), answer(p)];
}

// The chat parts of deepseekCallsCase, for comparisons: three seeded forced calls whose
// markers are the family's own tokens (gguf: the model's file), and strict tools under auto,
// two seeded choices pushed to open calls. Each returns the answer.
export async function deepseekForcedChatCase({ oai, model }, gguf) {
  const BEGIN = tokenId(gguf, "<｜tool▁calls▁begin｜>"), SEP = tokenId(gguf, "<｜tool▁sep｜>");
  const r = await oai.chat.completions.create({
    model, messages: user("Weather or time?"), temperature: 1, seed: 3, n: 3, max_tokens: MAX, tools: chatTools,
    tool_choice: "required", return_token_ids: true,
  });
  for (const c of r.choices) {
    assert.equal(c.finish_reason, "tool_calls", JSON.stringify(c.message));
    assert.equal(c.message.tool_calls.length, 1);
    checkCall(c.message.tool_calls[0].function.name, c.message.tool_calls[0].function.arguments, ["get_weather", "get_time"], "ds chat");
    assert.equal(c.token_ids[0], BEGIN);
    assert.ok(c.token_ids.includes(SEP));
  }
  return answer(r);
}
export async function deepseekAutoChatCase({ oai, model }, gguf) {
  const auto = await oai.chat.completions.create({
    model, messages: user("Weather?"), temperature: 1, seed: 5, n: 2, max_tokens: 150, tools: chatTools,
    tool_choice: "auto", logit_bias: { [tokenId(gguf, "<｜tool▁calls▁begin｜>")]: 100 }, return_token_ids: true,
  });
  let n = 0;
  for (const c of auto.choices) n += checkCalls(c, ["get_weather", "get_time"], "ds auto strict");
  assert.ok(n >= 2, `${n} complete calls`);
  return answer(auto);
}

// DeepSeek V3.1's forced calls, its control tokens around the name and the arguments (token
// terminals), in every API, streaming and not; then strict tools under auto, bound from
// <｜tool▁calls▁begin｜> on (pushed by a logit_bias). gguf: the model's file (its marker ids).
// Returns the answers.
export async function deepseekCallsCase({ oai, ant, model }, gguf) {
  const forced = await deepseekForcedChatCase({ oai, model }, gguf);
  const s = await streamedCalls(await oai.chat.completions.create({
    model, messages: user("Time?"), temperature: 1, seed: 4, max_tokens: MAX, stream: true, tools: chatTools,
    tool_choice: { type: "function", function: { name: "get_time" } },
  }));
  assert.equal(s.finish, "tool_calls");
  assert.equal(s.calls.length, 1);
  checkCall(s.calls[0].name, s.calls[0].args, ["get_time"], "ds chat named stream");
  const p = await oai.responses.create({
    model, input: "Weather?", temperature: 1, seed: 5, max_output_tokens: MAX, tools: respTools, tool_choice: "required",
  });
  const pc = p.output.filter((x) => x.type === "function_call");
  assert.equal(pc.length, 1);
  checkCall(pc[0].name, pc[0].arguments, ["get_weather", "get_time"], "ds responses");
  const fin = await ant.messages.stream({
    model, max_tokens: MAX, temperature: 1, seed: 6, messages: user("Weather?"), tools: antTools,
    tool_choice: { type: "tool", name: "get_weather" },
  }).finalMessage();
  assert.equal(fin.stop_reason, "tool_use");
  const u = fin.content.find((b) => b.type === "tool_use");
  checkCall(u.name, u.input, ["get_weather"], "ds messages stream");
  const auto = await deepseekAutoChatCase({ oai, model }, gguf);
  return [forced, s, answer(p), answer(fin), auto];
}

// Llama 3 (no marker token): forced calls are its JSON call ({"name", "parameters"}) and
// validate. Returns the answer.
export async function llama3CallCase({ oai, model }) {
  const r = await oai.chat.completions.create({
    model, messages: user("Weather?"), temperature: 1, seed: 2, n: 3, max_tokens: MAX, tools: chatTools, tool_choice: "required",
    return_token_ids: true,
  });
  for (const c of r.choices) {
    assert.equal(c.finish_reason, "tool_calls", JSON.stringify(c.message));
    checkCall(c.message.tool_calls[0].function.name, c.message.tool_calls[0].function.arguments, ["get_weather", "get_time"], "llama3");
  }
  return answer(r);
}

// Log-probs under a grammar are those of the masked distribution: the alternatives listed are
// tokens the grammar allowed (never a -inf, which is no JSON number), every value finite and
// at most 0; a strict call under auto (free, then bound from tc) and a forced one. Returns the
// log-probs, for comparisons.
export async function logprobsCase({ oai, model }, tc) {
  const out = [];
  for (const extra of [{ tool_choice: "auto", logit_bias: { [tc]: 100 } }, { tool_choice: "required" }]) {
    const r = await oai.chat.completions.create({
      model, messages: user("Weather?"), temperature: 1, seed: 8, max_tokens: 30, tools: chatTools, logprobs: true, top_logprobs: 3,
      ...extra,
    });
    const lps = r.choices[0].logprobs.content;
    assert.ok(lps.length > 0);
    let one = 0;  // tokens the grammar left alone: the answer's only possible token
    for (const t of lps) {
      for (const x of [t, ...t.top_logprobs]) assert.ok(Number.isFinite(x.logprob) && x.logprob <= 0, JSON.stringify(t));
      if (t.top_logprobs.length === 1) one++, assert.equal(t.top_logprobs[0].token, t.token);
    }
    assert.ok(one > 0, "the grammar left only one token somewhere");  // e.g. after <tool_call>: "\n"
    out.push(lps);
  }
  return out;
}
