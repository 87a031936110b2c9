// bounds: hostile request bodies against the real `tokenmill serve` and `tokenmill gateway`
// (the gateway runs the same API code with remote workers; none is needed here, because bodies
// are refused before anything is submitted). JSON nested one level past the limit, and far
// past it, in every field of every generating API that holds client-shaped JSON, is answered
// 400 in the route's vendor shape naming the limit; at the limit the depth is not what a
// refusal is about; after all of it the processes are up, /health answers and a real request
// is served.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync, spawn } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";

import { root, bin, startServer, stopServers } from "./server.mjs";

const vocab = path.join(root, "tests/data/llama.cpp/models/ggml-vocab-qwen2.gguf");
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "tm-bounds-"));
const model = path.join(tmp, "q3.gguf");
const LIMIT = 128;
let S, G, gwProc;

before(async () => {
  execFileSync(bin, ["mkmodel", "--arch", "qwen3", "--preset", "tiny", "--vocab", vocab, "--type", "q8_0",
    "--seed", "5", "-o", model], { stdio: "pipe" });
  S = await startServer(model, ["--ctx", "256", "--max-seqs", "2"]);
  gwProc = spawn(bin, ["gateway", "-m", model, "--listen", "127.0.0.1:0", "--cache", "off", "--wait-timeout", "1"],
    { stdio: ["ignore", "ignore", "pipe"] });
  let log = "";
  const port = await new Promise((resolve, reject) => {
    const t = setTimeout(() => reject(new Error("gateway did not start: " + log)), 30000);
    gwProc.stderr.on("data", (d) => {
      log += d;
      const m = /listening on http:\/\/[^:]+:(\d+)/.exec(log);
      if (m) { clearTimeout(t); resolve(Number(m[1])); }
    });
    gwProc.on("exit", (c) => { clearTimeout(t); reject(new Error(`gateway exited ${c}: ${log}`)); });
  });
  gwProc.removeAllListeners("exit");
  gwProc.stderr.resume();
  G = { url: `http://127.0.0.1:${port}` };
});

after(async () => {
  if (gwProc && gwProc.exitCode === null) gwProc.kill("SIGKILL");
  await stopServers();
  fs.rmSync(tmp, { recursive: true, force: true });
});

// tpl with "@" replaced by arrays nested so that the whole body nests `depth` levels.
function nested(tpl, depth) {
  const at = tpl.indexOf("@");
  let open = 0;
  for (const ch of tpl.slice(0, at)) open += (ch === "[" || ch === "{") - (ch === "]" || ch === "}");
  const k = depth - open;
  return tpl.slice(0, at) + "[".repeat(k) + "]".repeat(k) + tpl.slice(at + 1);
}

const U = '"messages":[{"role":"user","content":"hi"}]';
const CASES = [
  ["/v1/chat/completions", `{${U},"max_tokens":1,"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","x":@}}}]}`],
  ["/v1/chat/completions", `{"max_tokens":1,"messages":[{"role":"user","content":"hi"},{"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":{"x":@}}}]}]}`],
  ["/v1/chat/completions", `{${U},"max_tokens":1,"metadata":{"x":@}}`],
  ["/v1/chat/completions", `{${U},"max_tokens":1,"response_format":{"type":"text","x":@}}`],
  ["/v1/chat/completions", `{${U},"max_tokens":1,"tool_choice":{"type":"function","x":@}}`],
  ["/v1/chat/completions", `{${U},"max_tokens":1,"user":@}`],
  ["/v1/chat/completions", `{"max_tokens":1,"messages":[{"role":"user","content":[{"type":"text","text":"hi","x":@}]}]}`],
  ["/v1/completions", `{"prompt":"hi","max_tokens":1,"user":@}`],
  ["/v1/completions", `{"prompt":"hi","max_tokens":1,"logit_bias":{"x":@}}`],
  ["/v1/completions", `{"prompt":["hi",@],"max_tokens":1}`],
  ["/v1/responses", `{"input":"hi","max_output_tokens":1,"metadata":{"x":@}}`],
  ["/v1/responses", `{"input":"hi","max_output_tokens":1,"tools":[{"type":"function","name":"f","parameters":{"x":@}}]}`],
  ["/v1/responses", `{"input":[{"type":"function_call","call_id":"c","name":"f","arguments":"{}","x":@}],"max_output_tokens":1}`],
  ["/v1/responses", `{"input":"hi","max_output_tokens":1,"text":{"format":{"type":"text","x":@}}}`],
  ["/v1/messages", `{"max_tokens":1,${U},"tools":[{"name":"f","input_schema":{"type":"object","x":@}}]}`],
  ["/v1/messages", `{"max_tokens":1,"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"f","input":{"x":@}}]}]}`],
  ["/v1/messages", `{"max_tokens":1,${U},"metadata":{"x":@}}`],
  ["/v1/messages", `{"max_tokens":1,${U},"system":[{"type":"text","text":"s","x":@}]}`],
  ["/v1/messages/count_tokens", `{${U},"tools":[{"name":"f","input_schema":{"x":@}}]}`],
];

async function post(base, p, body) {
  const r = await fetch(base + p, { method: "POST", headers: { "content-type": "application/json" }, body });
  return { status: r.status, json: await r.json() };
}

function isDepthError(p, res) {
  if (res.status !== 400) return false;
  const msg = p.startsWith("/v1/messages") ? (res.json.type === "error" && res.json.error.type === "invalid_request_error" && res.json.error.message)
    : (res.json.error && res.json.error.type === "invalid_request_error" && res.json.error.message);
  return typeof msg === "string" && msg.includes(String(LIMIT)) && msg.includes("deep");
}

for (const [name, target] of [["serve", () => S.url], ["gateway", () => G.url]]) {
  test(`${name}: nesting at and past the limit in every nested field of every API`, { timeout: 120000 }, async () => {
    const base = target();
    for (const [p, tpl] of CASES) {
      for (const depth of [LIMIT + 1, LIMIT + 1000, 100000]) {
        const res = await post(base, p, nested(tpl, depth));
        assert.ok(isDepthError(p, res), `${p} depth ${depth}: ${res.status} ${JSON.stringify(res.json).slice(0, 300)}`);
      }
      const res = await post(base, p, nested(tpl, LIMIT));
      assert.ok(!isDepthError(p, res), `${p} at the limit refused for its depth`);
      assert.ok(res.status < 500 || name === "gateway", `${p} at the limit: ${res.status} ${JSON.stringify(res.json)}`);
    }
    const h = await fetch(base + "/health");
    assert.equal(h.status, 200);
  });
}

test("serve: a deep tool schema at the limit is served, and so is the next request", { timeout: 60000 }, async () => {
  const res = await post(S.url, "/v1/chat/completions", nested(CASES[0][1], LIMIT));
  assert.equal(res.status, 200, JSON.stringify(res.json));
  const ok = await post(S.url, "/v1/messages", JSON.stringify({ max_tokens: 2, messages: [{ role: "user", content: "hi" }] }));
  assert.equal(ok.status, 200);
  assert.equal(ok.json.type, "message");
});

test("serve: a body of more JSON values than the limit is refused in the vendor's shape", { timeout: 60000 }, async () => {
  const zeros = "0,".repeat((1 << 20) + 1) + "0";
  const r1 = await post(S.url, "/v1/completions", `{"prompt":"hi","max_tokens":1,"user":[${zeros}]}`);
  assert.equal(r1.status, 400);
  assert.match(r1.json.error.message, /values/);
  const r2 = await post(S.url, "/v1/messages", `{"max_tokens":1,${U},"metadata":{"x":[${zeros}]}}`);
  assert.equal(r2.status, 400);
  assert.equal(r2.json.type, "error");
  assert.match(r2.json.error.message, /values/);
});
