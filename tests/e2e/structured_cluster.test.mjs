// structured_cluster: structured output through `tokenmill gateway` with a prefill and a decode
// worker (the cases of structured_cases.mjs and harmony_cases.mjs, which also hold on `serve`).
// The grammar travels with each job as its source (PREFILL and DECODE with flag GRAMMAR) and
// each worker compiles it: the prefill worker samples the first token under it, the decode
// worker replays that token through the automaton and goes on, so on a random-weight model at
// temperature 1 every answer still parses and validates, forced tool calls are valid calls in
// every API shape, and a budget ending inside a document is "length". The gateway compiles
// each grammar first: a bad one is a 400 in the route's shape before any worker sees it.
// Per family (each its own cluster, the template being the gateway's):
//  - Qwen3: strict tools under tool_choice auto (a lazy grammar with its trigger token: the
//    answer is free until <tool_call>, then each call is bound) give the answer `serve` gives
//    for the same seed, with the same log-probs (those of the masked distribution);
//    tool_choice none; json_object.
//  - DeepSeek V3.1: forced calls in its control-token syntax and strict tools under auto, both
//    as `serve` answers them; reasoning stays free, with a budget and without one (the think
//    markers then travel as a budget that never forces, so the worker knows where the format
//    starts).
//  - Llama 3: the forced call (no marker token).
//  - harmony (gpt-oss's vocabulary): the chat prompt is the template's, the forced call whose
//    header the prompt opens (every API), the reasoning budget's <|end|>.
// The other API shapes of these requests go through the same API layer as on `serve`
// (structured.test.mjs, harmony.test.mjs); here what travels to the workers is what counts.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { startCluster, startServer, stopServers, fetchMetrics } from "./server.mjs";
import { jsonSchemaCase, extensionsCase, forcedCallCase, lengthCase, badFormatCase, responsesCase, reasoningCase, tokenId,
  strictAutoChatCase, noneCase, jsonObjectCase, deepseekForcedChatCase, deepseekAutoChatCase, llama3CallCase, logprobsCase, genModel,
  clients } from "./structured_cases.mjs";
import * as harmony from "./harmony_cases.mjs";

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "tm-structured-cluster-"));
let ctx, sctx, url;

// A generated model (genModel) with its cluster and (serve) a `serve` of the same file and
// arguments, the reference for answers: { gguf, url, ctx, sctx }.
async function pair(name, arch, family, seed, args, serve = true) {
  const gguf = await genModel(tmp, name, arch, family, seed);
  const all = ["--ctx", "4096", "--model-name", name, ...args];
  const [c, s] = await Promise.all([
    startCluster(gguf, ["prefill", "decode"], { gatewayArgs: all, workerArgs: ["--ctx", "4096"] }),
    serve ? startServer(gguf, all) : null,
  ]);
  return { gguf, url: c.url, ctx: clients(c.url, name), sctx: s && clients(s.url, name) };
}

// gpt-oss's vocabulary (harmony template, detected from it) on a cluster: harmony_cases' ctx.
async function harmonyCluster() {
  const gguf = path.join(tmp, "goss.gguf");
  harmony.makeModel(gguf);
  const { url } = await startCluster(gguf, ["prefill", "decode"], {
    gatewayArgs: ["--ctx", "2048", "--model-name", "goss"], workerArgs: ["--ctx", "2048"],
  });
  return { ...clients(url, "goss"), url, gguf };
}

// The fronts start together (each mostly waits on its own processes); the tests of a family
// wait for theirs.
let Q, D, L, H;
before(async () => {
  D = pair("ds3", "llama", "deepseek3", 7, ["--template", "deepseek3"]);
  L = pair("l3", "llama", "llama31", 6, ["--template", "llama3"], false);
  H = harmony.have ? harmonyCluster() : null;
  for (const p of [D, L, H]) p?.catch(() => {});   // awaited (and reported) by their tests
  Q = await pair("q3", "qwen3", "qwen3", 5, ["--template", "qwen3"]);
  ({ url, ctx, sctx } = Q);
});
after(async () => {
  await Promise.allSettled([D, L, H]);
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

test("strict tools under auto (Qwen3) through gateway + workers: every call bound, the answer and log-probs serve gives", async () => {
  const tc = tokenId(Q.gguf, "<tool_call>");
  assert.deepEqual(await strictAutoChatCase(ctx, tc), await strictAutoChatCase(sctx, tc));
  // log-probs under the grammar: the masked distribution's (workers send no -inf), as serve's
  assert.deepEqual(await logprobsCase(ctx, tc), await logprobsCase(sctx, tc));
});

test("tool_choice none and json_object through gateway + workers", async () => {
  await noneCase(ctx);
  await jsonObjectCase(ctx, 60);
});

test("DeepSeek V3.1 through gateway + workers: forced calls and strict tools under auto (the answers serve gives), free reasoning", async () => {
  const d = await D;
  assert.deepEqual(await deepseekForcedChatCase(d.ctx, d.gguf), await deepseekForcedChatCase(d.sctx, d.gguf));
  assert.deepEqual(await deepseekAutoChatCase(d.ctx, d.gguf), await deepseekAutoChatCase(d.sctx, d.gguf));
  await reasoningCase(d.ctx, tokenId(d.gguf, "</think>"));
});

test("Llama 3 forced calls through gateway + workers", async () => {
  await llama3CallCase((await L).ctx);
});

test("harmony (gpt-oss) through gateway + workers: the chat prompt is the template's, a forced call in every API, the budget's <|end|>",
  { skip: !harmony.have && "npm package missing" }, async () => {
    const h = await H;
    await harmony.chatPromptCase(h);
    await harmony.forcedCallCase(h);
    await harmony.thinkingCase(h);
  });
