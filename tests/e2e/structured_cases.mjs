// structured_cases: structured-output cases that run against any tokenmill front (serve, or a
// gateway with its workers), with the real SDKs: realistic closed schemas (random output
// ends), and checks that every answer parses and validates (ajv), regexes and grammars match,
// forced tool calls name an allowed tool with valid arguments, bad formats are a 400 in the
// vendor's shape, a budget ending inside a document is "length". Each case takes
// { oai, ant, model } (OpenAI and Anthropic clients of the front, the model name).
import assert from "node:assert/strict";
import AjvModule from "ajv";

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
export const antTools = Object.entries(schemaOf).map(([name, input_schema]) => ({ name, description: `tool ${name}`, input_schema }));

export const user = (text) => [{ role: "user", content: text }];
export const MAX = 1500;

export function valid(schema, doc, what) {
  const v = ajv.compile(schema);
  assert.ok(v(doc), `${what}: ${JSON.stringify(doc)}: ${ajv.errorsText(v.errors)}`);
}

export function checkCall(name, args, allowed, what) {
  assert.ok(allowed.includes(name), `${what}: tool ${name} not in ${allowed}`);
  valid(schemaOf[name], typeof args === "string" ? JSON.parse(args) : args, `${what} ${name}`);
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

// The llama.cpp / vLLM extensions: a regex, a choice list, a GBNF grammar.
export async function extensionsCase({ oai, model }) {
  const base = { model, messages: user("x"), temperature: 1, max_tokens: MAX };
  const re = "[a-z]{2,6}@[a-z]{2,6}\\.(com|org)";
  const g = await oai.chat.completions.create({ ...base, seed: 2, n: 2, guided_regex: re });
  for (const c of g.choices) assert.match(c.message.content, new RegExp(`^(?:${re})$`));
  const choices = ["yes", "no", "maybe \"so\""];
  const ch = await oai.chat.completions.create({ ...base, seed: 3, n: 2, guided_choice: choices });
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

// Reasoning stays free on a DeepSeek-R1-templated model (the prompt opens the think block):
// with a budget, and without one (a strong bias on </think>, id thinkEnd, makes a random
// model close the block itself); the answer after the block validates.
export async function reasoningCase({ oai, model }, thinkEnd) {
  const r = await oai.chat.completions.create({
    model, messages: user("A person."), temperature: 1, seed: 1, max_tokens: MAX,
    thinking: { type: "enabled", budget_tokens: 12 },
    response_format: { type: "json_schema", json_schema: { name: "person", schema: person } },
  });
  const c = r.choices[0];
  assert.ok(r.usage.completion_tokens_details.reasoning_tokens > 0 && c.message.reasoning_content.length > 0, "free reasoning");
  assert.equal(c.finish_reason, "stop");
  valid(person, JSON.parse(c.message.content), "after reasoning");
  const f = await oai.chat.completions.create({
    model, messages: user("A person."), temperature: 1, seed: 2, max_tokens: MAX, thinking: { type: "enabled" },
    logit_bias: { [thinkEnd]: 40 }, response_format: { type: "json_schema", json_schema: { name: "person", schema: person } },
  });
  assert.equal(f.choices[0].finish_reason, "stop", JSON.stringify(f.choices[0].message));
  valid(person, JSON.parse(f.choices[0].message.content), "after free reasoning");
}
