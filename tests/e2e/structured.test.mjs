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
//  - Log-probs under a grammar are those of the masked distribution: the alternatives listed
//    are tokens the grammar allowed, every value finite (a -inf is no JSON number).
//  - A bad schema / regex / grammar / tool is a 400 in the route's vendor shape naming it;
//    an answer cut by max_tokens inside the document ends with "length".
// The schemas, tools, checks and most cases are structured_cases.mjs's, which
// structured_cluster.test.mjs runs through a gateway and its workers.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { startServer, stopServers } from "./server.mjs";
import { person, order, chatTools, respTools, antTools, user, MAX, valid, checkCall, tokenId, streamedCalls, jsonSchemaCase,
  extensionsCase, forcedCallCase, lengthCase, badFormatCase, responsesCase, jsonObjectCase, noneCase, llama3CallCase, reasoningCase,
  strictAutoCase, formatOrCallCase, deepseekCallsCase, logprobsCase, genModel, clients } from "./structured_cases.mjs";

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "tm-structured-"));
// the schemas (realistic, closed: additionalProperties false, so that random output ends),
// tools and checks are structured_cases.mjs's, which the cluster tests share

let oai, ant, ctx;
before(async () => {
  const Q = await startServer(await genModel(tmp, "q3", "qwen3", "qwen3", 5), ["--ctx", "4096", "--template", "qwen3", "--model-name", "q3"]);
  ctx = clients(Q.url, "q3");
  ({ oai, ant } = ctx);
});
after(async () => {
  await stopServers();
  fs.rmSync(tmp, { recursive: true, force: true });
});

test("chat response_format json_schema: every sample ends, parses and validates (n, and streaming)", async () => {
  await jsonSchemaCase(ctx, 3);   // person (n), a streamed order
  const r = await oai.chat.completions.create({
    model: "q3", messages: user("Give me one."), temperature: 1, seed: 3, n: 3, max_tokens: MAX,
    response_format: { type: "json_schema", json_schema: { name: "order", schema: order, strict: true } },
  });
  assert.equal(r.choices.length, 3);
  for (const c of r.choices) {
    assert.equal(c.finish_reason, "stop", c.message.content);
    valid(order, JSON.parse(c.message.content), "order");
  }
});

test("chat json_object, guided_regex, guided_choice, guided_grammar, llama.cpp json_schema", async () => {
  await jsonObjectCase(ctx);
  await extensionsCase(ctx, 4);
  const js = await oai.chat.completions.create({ model: "q3", messages: user("x"), temperature: 1, max_tokens: MAX, seed: 5, n: 2,
    json_schema: person });
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
  await responsesCase(ctx);   // an order, streamed
  // json_object in Responses: jsonObjectCase (in the chat test above)
});

test("forced tool calls: chat required (n) and a named function (streaming), messages {type: tool} (streaming)", async () => {
  await forcedCallCase(ctx, 4);   // chat required, n; messages {type: tool}, streamed
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

test("forced tool calls, messages: {type: any}", async () => {
  const m = await ant.messages.create({
    model: "q3", max_tokens: MAX, temperature: 1, messages: user("Weather?"), tools: antTools, tool_choice: { type: "any" },
  });
  assert.equal(m.stop_reason, "tool_use");
  const uses = m.content.filter((b) => b.type === "tool_use");
  assert.equal(uses.length, 1);
  checkCall(uses[0].name, uses[0].input, ["get_weather", "get_time"], "messages any");
});

test("tool_choice none never gives a call (chat, responses, messages)", async () => {
  await noneCase(ctx);
});

test("the budget ending inside a document is finish_reason length", async () => {
  await lengthCase(ctx);
  const p = await oai.responses.create({
    model: "q3", input: "x", max_output_tokens: 3, text: { format: { type: "json_schema", name: "o", schema: order } },
  });
  assert.equal(p.status, "incomplete");
});

test("bad formats are a 400 in the vendor's shape naming the problem", async () => {
  await badFormatCase(ctx);   // a schema keyword, a regex, an Anthropic tool's schema
  const bad = (e) => e.status === 400 && e.type === "invalid_request_error";
  await assert.rejects(oai.chat.completions.create({ model: "q3", messages: user("x"), guided_grammar: "root ::= undefined-rule" }),
    (e) => bad(e) && e.param === "guided_grammar");
  await assert.rejects(oai.chat.completions.create({ model: "q3", messages: user("x"), guided_grammar: "root ::= <[999999]>" }),
    (e) => bad(e) && e.param === "guided_grammar" && /999999/.test(e.message));
  await assert.rejects(oai.chat.completions.create({ model: "q3", messages: user("x"), response_format: { type: "xml" } }),
    (e) => bad(e) && e.param === "response_format.type");
  await assert.rejects(oai.chat.completions.create({
    model: "q3", messages: user("x"), tools: chatTools, tool_choice: { type: "function", function: { name: "nope" } },
  }), (e) => bad(e) && /nope/.test(e.message));
  await assert.rejects(oai.chat.completions.create({ model: "q3", messages: user("x"), tool_choice: "required" }),
    (e) => bad(e) && e.param === "tool_choice");
  await assert.rejects(oai.responses.create({
    model: "q3", input: "x", text: { format: { type: "json_schema", name: "b", schema: { type: "object", patternProperties: { a: {} } } } },
  }), (e) => bad(e) && /patternProperties/.test(e.message) && e.param === "text.format.schema");
});

test("hostile grammars are a 400 naming the limit, the server still answers; zod's int() bounds compile", async () => {
  const bad = (e) => e.status === 400 && e.type === "invalid_request_error";
  const limit = (e, param) => bad(e) && e.param === param && /--grammar-max-/.test(e.message);
  // a nullable repetition of 50,000 (its expansion recursed on the C stack), nested counted
  // repetitions (their stacks blow up), a schema pattern of 10,000 nullable copies
  await assert.rejects(oai.chat.completions.create({ model: "q3", messages: user("x"), max_tokens: 4,
    guided_grammar: 'root ::= ("a"?){0,50000}' }), (e) => limit(e, "guided_grammar"));
  await assert.rejects(oai.chat.completions.create({ model: "q3", messages: user("x"), max_tokens: 4,
    guided_regex: "(((a?){0,20}){0,20}){0,20}" }), (e) => limit(e, "guided_regex"));
  await assert.rejects(oai.chat.completions.create({ model: "q3", messages: user("x"), max_tokens: 4,
    response_format: { type: "json_schema", json_schema: { name: "p", schema: { type: "string", pattern: "^(a?){0,10000}$" } } } }),
    (e) => limit(e, "response_format.json_schema.schema"));
  await assert.rejects(ant.messages.create({
    model: "q3", max_tokens: 4, messages: user("x"), tool_choice: { type: "any" },
    tools: [{ name: "t", input_schema: { type: "object", properties: { a: { type: "string", pattern: "^(a?){0,10000}$" } } } }],
  }), (e) => e.status === 400 && e.error?.error?.type === "invalid_request_error" && /--grammar-max-stacks/.test(e.error.error.message));
  // the regex of 1,000 compiles, and the answer is in it
  const re = await oai.chat.completions.create({ model: "q3", messages: user("x"), max_tokens: 8, temperature: 1,
    guided_regex: "(a?){0,1000}" });
  assert.match(re.choices[0].message.content, /^a*$/);
  // a long string compiles without unrolling; zod's z.number().int() bounds are the safe integers
  const zod = { type: "object", properties: { n: { type: "integer", minimum: -9007199254740991, maximum: 9007199254740991 },
    s: { type: "string", maxLength: 99999 } }, required: ["n", "s"], additionalProperties: false };
  const z = await oai.chat.completions.create({ model: "q3", messages: user("x"), max_tokens: MAX, temperature: 1, seed: 2,
    response_format: { type: "json_schema", json_schema: { name: "z", schema: zod } } });
  if (z.choices[0].finish_reason === "stop") valid(zod, JSON.parse(z.choices[0].message.content), "zod int");
  // and the server still answers
  const ok = await oai.chat.completions.create({ model: "q3", messages: user("Hello"), max_tokens: 4 });
  assert.equal(ok.choices.length, 1);
});

test("Llama 3 (no marker token): forced calls are its JSON call and validate", async () => {
  const L = await startServer(await genModel(tmp, "l3", "llama", "llama31", 6), ["--ctx", "4096", "--template", "llama3", "--model-name", "l3"]);
  await llama3CallCase(clients(L.url, "l3"));
});

test("reasoning stays free: DeepSeek-R1's open think block, then a valid answer", async () => {
  const model = await genModel(tmp, "ds", "llama", "deepseek3", 5);
  const D = await startServer(model, ["--ctx", "4096", "--template", "deepseek-r1", "--model-name", "ds"]);
  // without a budget the model closes the block itself (the scheduler follows think blocks
  // for a grammar, not only for a budget)
  await reasoningCase(clients(D.url, "ds"), tokenId(model, "</think>"), [1, 2]);
});

test("strict tools under auto (Qwen3): free until <tool_call>, then every call is bound (chat n + stream, responses, messages)", async () => {
  await strictAutoCase(ctx, tokenId(path.join(tmp, "q3.gguf"), "<tool_call>"));
});

test("log-probs under a grammar are the masked distribution's: allowed alternatives only, all finite", async () => {
  await logprobsCase(ctx, tokenId(path.join(tmp, "q3.gguf"), "<tool_call>"));
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
  await formatOrCallCase(ctx, tokenId(path.join(tmp, "q3.gguf"), "<tool_call>"));
});

test("DeepSeek V3.1: forced calls in its control-token syntax in every API (streaming and not); strict tools under auto", async () => {
  const model = await genModel(tmp, "ds3", "llama", "deepseek3", 7);
  const D = await startServer(model, ["--ctx", "4096", "--template", "deepseek3", "--model-name", "ds3"]);
  await deepseekCallsCase(clients(D.url, "ds3"), model);
});
