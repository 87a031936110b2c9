// clients: the client libraries users reach for, against the real `tokenmill serve`: the
// Vercel AI SDK (ai with @ai-sdk/openai on the Responses API, @ai-sdk/openai-compatible on
// Chat Completions, @ai-sdk/anthropic on Messages), LangChain (@langchain/openai,
// @langchain/anthropic) and the OpenAI Agents SDK (@openai/agents), each pinned in
// package.json. Each does plain text, streaming, a forced tool round trip (the call, the
// tool's result sent back, an answer) and a structured object, on a generated model with
// Qwen3's real vocabulary. Its weights are random, so the text is garbage: what makes the
// round trips deterministic is that forced calls and structured output are bound by a
// grammar, so the call parses and the object validates whatever the model "wants".
// Also here: what those libraries tripped over on the server side (a forced call on a
// template with no call syntax, the Messages tool_use stop, Anthropic structured outputs).
// One server for everything, small token budgets: the file stays quick.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { z } from "zod";
import { generateText, streamText, generateObject, tool as aiTool, stepCountIs } from "ai";
import { createOpenAI } from "@ai-sdk/openai";
import { createOpenAICompatible } from "@ai-sdk/openai-compatible";
import { createAnthropic } from "@ai-sdk/anthropic";
import { ChatOpenAI } from "@langchain/openai";
import { ChatAnthropic } from "@langchain/anthropic";
import { HumanMessage, ToolMessage } from "@langchain/core/messages";
import { tool as lcTool } from "@langchain/core/tools";
import OpenAI from "openai";
import Anthropic from "@anthropic-ai/sdk";
import { startServer, stopServers } from "./server.mjs";
import { genModel, tokenId } from "./structured_cases.mjs";

// no trace leaves the machine (the Agents SDK exports traces to OpenAI unless told not to)
process.env.OPENAI_AGENTS_DISABLE_TRACING = "1";
process.env.LANGCHAIN_TRACING_V2 = "false";
const agents = await import("@openai/agents");
agents.setTracingDisabled(true);

const MAX = 8;                 // free text: a few tokens
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "tm-clients-"));
const Weather = z.object({ city: z.string().max(8), unit: z.enum(["c", "f"]) });
// enums and booleans: Anthropic's SDKs move bounds (maxLength, minimum) into descriptions
// before sending a structured-output schema, and a random model needs them to end a string
const City = z.object({ name: z.enum(["Paris", "Rome", "Oslo"]), size: z.enum(["small", "big"]), capital: z.boolean() });
const weatherOf = ({ city, unit }) => `${city}: 21 ${unit}`;
let url, model, plainUrl;

before(async () => {
  model = await genModel(tmp, "q3", "qwen3", "qwen3", 5);
  const S = await startServer(model, ["--ctx", "2048", "--template", "qwen3", "--model-name", "q3", "--max-seqs", "4"]);
  url = S.url;
});
after(async () => {
  await stopServers();
  fs.rmSync(tmp, { recursive: true, force: true });
});

const isText = (s) => typeof s === "string";
const checkCity = (o, what) => assert.ok(City.safeParse(o).success, `${what}: ${JSON.stringify(o)}`);

// ------------------------------------------------------------------ Vercel AI SDK

const aiProviders = () => ({
  "@ai-sdk/openai (responses)": createOpenAI({ baseURL: `${url}/v1`, apiKey: "x" })("q3"),
  "@ai-sdk/openai-compatible (chat)": createOpenAICompatible({ name: "tokenmill", baseURL: `${url}/v1`, apiKey: "x",
    supportsStructuredOutputs: true })("q3"),
  "@ai-sdk/anthropic (messages)": createAnthropic({ baseURL: `${url}/v1`, apiKey: "x" })("q3"),
});

test("AI SDK: text, streaming, a forced tool round trip and generateObject with each provider", async () => {
  for (const [name, m] of Object.entries(aiProviders())) {
    const t = await generateText({ model: m, prompt: "Say hi.", maxOutputTokens: MAX, temperature: 0, maxRetries: 0 });
    assert.ok(isText(t.text) && t.usage.outputTokens > 0, `${name} text: ${JSON.stringify(t.usage)}`);

    const s = streamText({ model: m, prompt: "Say hi.", maxOutputTokens: MAX, temperature: 0, maxRetries: 0 });
    let streamed = "";
    for await (const d of s.textStream) streamed += d;
    assert.equal(streamed, await s.text, `${name} stream`);
    assert.ok(["length", "stop"].includes(await s.finishReason), `${name} stream finish`);

    // step 1 is forced to the tool, step 2 answers with its result
    let ran = 0;
    const r = await generateText({
      model: m, prompt: "Weather in Paris?", maxOutputTokens: 200, temperature: 0, maxRetries: 0,
      tools: { get_weather: aiTool({ description: "Weather in a city.", inputSchema: Weather,
        execute: async (a) => { ran++; return weatherOf(a); } }) },
      stopWhen: stepCountIs(2),
      prepareStep: ({ stepNumber }) => ({ toolChoice: stepNumber === 0 ? { type: "tool", toolName: "get_weather" } : "none" }),
    });
    assert.equal(r.steps.length, 2, `${name}: ${r.steps.map((x) => x.finishReason)}`);
    assert.equal(r.steps[0].finishReason, "tool-calls", name);
    assert.equal(r.steps[0].toolCalls.length, 1, name);
    assert.ok(Weather.safeParse(r.steps[0].toolCalls[0].input).success, `${name}: ${JSON.stringify(r.steps[0].toolCalls[0].input)}`);
    assert.equal(ran, 1, name);
    assert.equal(r.steps[1].toolCalls.length, 0, name);
    assert.ok(isText(r.text), name);

    const o = await generateObject({ model: m, schema: City, prompt: "A city.", maxOutputTokens: 200, temperature: 0, maxRetries: 0 });
    checkCity(o.object, `${name} generateObject`);
  }
});

// ------------------------------------------------------------------ LangChain

const lcModels = () => ({
  "@langchain/openai": (opts = {}) => new ChatOpenAI({ model: "q3", apiKey: "x", configuration: { baseURL: `${url}/v1` },
    maxRetries: 0, temperature: 0, maxTokens: MAX, ...opts }),
  "@langchain/anthropic": (opts = {}) => new ChatAnthropic({ model: "q3", apiKey: "x", anthropicApiUrl: url,
    maxRetries: 0, temperature: 0, maxTokens: MAX, ...opts }),
});

test("LangChain: invoke, stream, a forced tool round trip and withStructuredOutput with each chat model", async () => {
  const weather = lcTool(async (a) => weatherOf(a), { name: "get_weather", description: "Weather in a city.", schema: Weather });
  for (const [name, mk] of Object.entries(lcModels())) {
    const t = await mk().invoke("Say hi.");
    assert.ok(isText(t.text), `${name} invoke`);

    let streamed = "";
    for await (const ch of await mk().stream("Say hi.")) streamed += ch.text;
    assert.ok(isText(streamed), `${name} stream`);

    const withTool = mk({ maxTokens: 200 }).bindTools([weather], { tool_choice: "get_weather" });
    const q = new HumanMessage("Weather in Paris?");
    const ai = await withTool.invoke([q]);
    assert.equal(ai.tool_calls?.length, 1, `${name}: ${JSON.stringify(ai.content)}`);
    const call = ai.tool_calls[0];
    assert.equal(call.name, "get_weather", name);
    assert.ok(Weather.safeParse(call.args).success, `${name}: ${JSON.stringify(call.args)}`);
    const result = await weather.invoke(call);   // a ToolMessage for this call
    assert.ok(result instanceof ToolMessage && result.tool_call_id === call.id, name);
    const answer = await mk().invoke([q, ai, result]);
    assert.ok(isText(answer.text) && !answer.tool_calls?.length, `${name} answer`);

    const so = mk({ maxTokens: 200 }).withStructuredOutput(City, { name: "city" });
    checkCity(await so.invoke("A city."), `${name} withStructuredOutput`);
  }
});

// ------------------------------------------------------------------ OpenAI Agents SDK

test("Agents SDK: a run, a streamed run, a forced tool round trip and an outputType agent", async () => {
  const provider = new agents.OpenAIProvider({ openAIClient: new OpenAI({ baseURL: `${url}/v1`, apiKey: "x", maxRetries: 0 }) });
  const runner = new agents.Runner({ modelProvider: provider, tracingDisabled: true });
  const settings = { maxTokens: MAX, temperature: 0 };
  const plain = new agents.Agent({ name: "plain", instructions: "Be brief.", model: "q3", modelSettings: settings });
  const r = await runner.run(plain, "Say hi.");
  assert.ok(isText(r.finalOutput), "run");

  const s = await runner.run(plain, "Say hi.", { stream: true });
  let streamed = "";
  for await (const d of s.toTextStream()) streamed += d;
  await s.completed;
  assert.equal(streamed, s.finalOutput, "streamed run");

  // toolChoice required for the first turn; the SDK resets it to auto after the call
  let ran = 0;
  const weather = agents.tool({ name: "get_weather", description: "Weather in a city.", parameters: Weather,
    execute: async (a) => { ran++; return weatherOf(a); } });
  const withTool = new agents.Agent({ name: "weather", instructions: "Use the tool.", model: "q3", tools: [weather],
    modelSettings: { ...settings, toolChoice: "required", maxTokens: 200 } });
  const t = await runner.run(withTool, "Weather in Paris?", { maxTurns: 3 });
  assert.equal(ran, 1, JSON.stringify(t.newItems.map((i) => i.type)));
  const calls = t.newItems.filter((i) => i.type === "tool_call_item");
  assert.ok(Weather.safeParse(JSON.parse(calls[0].rawItem.arguments)).success, calls[0].rawItem.arguments);
  assert.ok(t.newItems.some((i) => i.type === "tool_call_output_item"), "the result went back");
  assert.ok(isText(t.finalOutput), "an answer after the tool");

  const typed = new agents.Agent({ name: "city", instructions: "Name a city.", model: "q3", outputType: City,
    modelSettings: { ...settings, maxTokens: 200 } });
  checkCity((await runner.run(typed, "A city.")).finalOutput, "outputType");
});

// ------------------------------------------------------------------ what the clients tripped over

test("Messages structured outputs: output_config.format and the beta output_format bind the text block", async () => {
  const ant = new Anthropic({ baseURL: url, apiKey: "x", maxRetries: 0 });
  const schema = z.toJSONSchema(City);
  for (const extra of [{ output_config: { format: { type: "json_schema", schema } } },
    { output_format: { type: "json_schema", schema } }]) {
    const m = await ant.messages.create({ model: "q3", max_tokens: 200, temperature: 1, messages: [{ role: "user", content: "A city." }], ...extra });
    assert.equal(m.stop_reason, "end_turn", JSON.stringify(m.content));
    checkCity(JSON.parse(m.content[0].text), Object.keys(extra)[0]);
  }
  // with LangChain's jsonSchema method (output_config.format) too; its Anthropic schema
  // transform moves even enums into descriptions, so what is bound is types: booleans here
  const Flags = z.object({ capital: z.boolean(), coastal: z.boolean() });
  const so = lcModels()["@langchain/anthropic"]({ maxTokens: 200 }).withStructuredOutput(Flags, { method: "jsonSchema" });
  const f = await so.invoke("A city.");
  assert.ok(Flags.safeParse(f).success, JSON.stringify(f));
});

test("Messages tool_choice any / tool: the answer ends right after the call (stop_reason tool_use)", async () => {
  const ant = new Anthropic({ baseURL: url, apiKey: "x", maxRetries: 0 });
  const tools = [{ name: "get_weather", description: "Weather.", input_schema: z.toJSONSchema(Weather) },
    { name: "noop", description: "Nothing.", input_schema: { type: "object", properties: {}, additionalProperties: false } }];
  for (const tool_choice of [{ type: "any" }, { type: "tool", name: "get_weather" }, { type: "tool", name: "noop" }]) {
    for (const stream of [false, true]) {
      const body = { model: "q3", max_tokens: 300, temperature: 1, messages: [{ role: "user", content: "Weather?" }], tools, tool_choice };
      const m = stream ? await ant.messages.stream(body).finalMessage() : await ant.messages.create(body);
      assert.equal(m.stop_reason, "tool_use", JSON.stringify(m));
      assert.deepEqual(m.content.map((b) => b.type), ["tool_use"], JSON.stringify(m.content));
      // the call's own tokens, not the budget: nothing hidden was generated after it
      assert.ok(m.usage.output_tokens < 100, `${JSON.stringify(tool_choice)}: ${m.usage.output_tokens} output tokens`);
    }
  }
});

test("a forced call on a template with no call syntax is a 400 naming why, in each API's shape", async () => {
  const P = await startServer(model, ["--ctx", "512", "--template", "plain", "--model-name", "q3"]);
  const oai = new OpenAI({ baseURL: `${P.url}/v1`, apiKey: "x", maxRetries: 0 });
  const ant = new Anthropic({ baseURL: P.url, apiKey: "x", maxRetries: 0 });
  const fn = { name: "get_weather", parameters: z.toJSONSchema(Weather) };
  const msg = /tool_choice.*no tool-call syntax/;
  for (const tool_choice of ["required", { type: "function", function: { name: "get_weather" } }]) {
    await assert.rejects(oai.chat.completions.create({ model: "q3", max_tokens: 4, messages: [{ role: "user", content: "x" }],
      tools: [{ type: "function", function: fn }], tool_choice }), (e) => e.status === 400 && msg.test(e.message) && e.param === "tool_choice");
  }
  await assert.rejects(oai.responses.create({ model: "q3", max_output_tokens: 4, input: "x", tools: [{ type: "function", ...fn }],
    tool_choice: "required" }), (e) => e.status === 400 && msg.test(e.message));
  await assert.rejects(ant.messages.create({ model: "q3", max_tokens: 4, messages: [{ role: "user", content: "x" }],
    tools: [{ name: "get_weather", input_schema: fn.parameters }], tool_choice: { type: "any" } }),
  (e) => e.status === 400 && e.error?.type === "error" && msg.test(e.message));
  // auto stays allowed (the tools are then plain text in the prompt, no call is read)
  const r = await oai.chat.completions.create({ model: "q3", max_tokens: 4, messages: [{ role: "user", content: "x" }],
    tools: [{ type: "function", function: fn }] });
  assert.equal(r.choices[0].message.tool_calls, undefined);
});

test("smaller: completions' context error names prompt; the budget_tokens 400 says what is wrong", async () => {
  const oai = new OpenAI({ baseURL: `${url}/v1`, apiKey: "x", maxRetries: 0 });
  await assert.rejects(oai.completions.create({ model: "q3", prompt: "tok ".repeat(3000), max_tokens: 4 }),
    (e) => e.status === 400 && e.param === "prompt" && e.code === "context_length_exceeded");
  const ant = new Anthropic({ baseURL: url, apiKey: "x", maxRetries: 0 });
  await assert.rejects(ant.messages.create({ model: "q3", max_tokens: 2000, messages: [{ role: "user", content: "x" }],
    thinking: { type: "enabled", budget_tokens: 10 } }),
  (e) => e.status === 400 && /thinking\.budget_tokens: Input should be greater than or equal to 1024/.test(e.message));
  // a Responses answer cut by its budget: the response and its message item are incomplete
  const r = await oai.responses.create({ model: "q3", input: "x", max_output_tokens: 2, temperature: 0 });
  assert.equal(r.status, "incomplete");
  assert.equal(r.output.at(-1).status, "incomplete", JSON.stringify(r.output));
  const fc = await oai.responses.create({ model: "q3", input: "x", max_output_tokens: 20, temperature: 0, tool_choice: "required",
    tools: [{ type: "function", name: "get_weather", parameters: z.toJSONSchema(Weather) }] });
  assert.equal(fc.status, "incomplete");
  assert.deepEqual(fc.output.map((i) => [i.type, i.status]), [["function_call", "incomplete"]], JSON.stringify(fc.output));
  // no tools offered: a call marker the model writes is text, never a tool call
  const c = await oai.chat.completions.create({ model: "q3", max_tokens: 6, temperature: 0, messages: [{ role: "user", content: "x" }],
    logit_bias: { [tokenId(model, "<tool_call>")]: 100 } });
  assert.equal(c.choices[0].message.tool_calls, undefined, JSON.stringify(c.choices[0].message));
  assert.match(c.choices[0].message.content, /<tool_call>/);
});
