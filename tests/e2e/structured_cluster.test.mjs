// structured_cluster: structured output through `tokenmill gateway` with a prefill and a decode
// worker (the cases of structured_cases.mjs, which also hold on `serve`). The grammar travels
// with each job as its source (PREFILL and DECODE with flag GRAMMAR) and each worker compiles
// it: the prefill worker samples the first token under it, the decode worker replays that
// token through the automaton and goes on, so on a random-weight model at temperature 1 every
// answer still parses and validates, forced tool calls are valid calls in the chat and
// Anthropic shapes, and a budget ending inside a document is "length". The gateway compiles
// each grammar first: a bad one is a 400 in the route's shape before any worker sees it.
// Reasoning stays free on a DeepSeek-R1-templated cluster, with a budget and without one (the
// think markers then travel as a budget that never forces, so the worker knows where the
// format starts).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import OpenAI from "openai";
import Anthropic from "@anthropic-ai/sdk";
import { startCluster, stopServers, fetchMetrics, bin } from "./server.mjs";
import { augment } from "../oracle/vocab_augment.mjs";
import { jsonSchemaCase, extensionsCase, forcedCallCase, lengthCase, badFormatCase, responsesCase, reasoningCase }
  from "./structured_cases.mjs";

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "tm-structured-cluster-"));
let ctx, url;

before(async () => {
  const vocab = path.join(tmp, "vocab-q3.gguf"), model = path.join(tmp, "q3.gguf");
  augment("qwen3", vocab);
  execFileSync(bin, ["mkmodel", "--arch", "qwen3", "--preset", "tiny", "--vocab", vocab, "--type", "q8_0", "--seed", "5",
    "-o", model], { stdio: "pipe" });
  ({ url } = await startCluster(model, ["prefill", "decode"], {
    gatewayArgs: ["--ctx", "4096", "--template", "qwen3", "--model-name", "q3"], workerArgs: ["--ctx", "4096"],
  }));
  ctx = {
    model: "q3",
    oai: new OpenAI({ baseURL: `${url}/v1`, apiKey: "x", maxRetries: 0, timeout: 600000 }),
    ant: new Anthropic({ baseURL: url, apiKey: "x", maxRetries: 0, timeout: 600000 }),
  };
});
after(async () => {
  await stopServers();
  fs.rmSync(tmp, { recursive: true, force: true });
});

test("json_schema through gateway + workers: every sample (n, streamed) ends, parses and validates", async () => {
  await jsonSchemaCase(ctx);
  // the requests were split: prefilled on one worker, handed off to the other (the count comes
  // with the prefill worker's next heartbeat)
  let handoffs = 0;
  for (let k = 0; k < 200 && handoffs < 3; k++) {
    const m = await fetchMetrics(url);
    handoffs = Object.entries(m).filter(([key]) => key.startsWith("tokenmill_worker_handoffs_total") && key.includes('side="send"'))
      .reduce((sum, [, v]) => sum + v, 0);
    if (handoffs < 3) await new Promise((r) => setTimeout(r, 50));
  }
  assert.ok(handoffs >= 3, `handoffs ${handoffs}`);
});

test("regex, choice and GBNF extensions, and a Responses json_schema stream, through gateway + workers", async () => {
  await extensionsCase(ctx);
  await responsesCase(ctx);
});

test("forced tool calls through gateway + workers (chat required, Anthropic tool streamed)", async () => {
  await forcedCallCase(ctx);
});

test("through gateway + workers: the budget ending inside a document is length; bad formats are a 400 in the route's shape", async () => {
  await lengthCase(ctx);
  await badFormatCase(ctx);
});

test("reasoning stays free through gateway + workers (DeepSeek-R1 template, with and without a budget)", async () => {
  const vocab = path.join(tmp, "vocab-ds.gguf"), model = path.join(tmp, "ds.gguf");
  augment("deepseek3", vocab);
  execFileSync(bin, ["mkmodel", "--arch", "llama", "--preset", "tiny", "--vocab", vocab, "--type", "q8_0", "--seed", "5",
    "-o", model], { stdio: "pipe" });
  const D = await startCluster(model, ["prefill", "decode"], {
    gatewayArgs: ["--ctx", "4096", "--template", "deepseek-r1", "--model-name", "ds"], workerArgs: ["--ctx", "4096"],
  });
  const THINK_END = 100018;  // </think> in the augmented vocabulary
  await reasoningCase({ model: "ds", oai: new OpenAI({ baseURL: `${D.url}/v1`, apiKey: "x", maxRetries: 0, timeout: 600000 }) },
    THINK_END);
});
