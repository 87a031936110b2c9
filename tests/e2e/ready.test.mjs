// ready: `tokenmill serve` faults its weights in after it starts listening and only then
// says ready: until then /health answers 503 {"status":"loading"} with Retry-After, so that a
// load balancer sends nothing yet. The test holds the residency step back with its gate
// file (TOKENMILL_TEST_RESIDENT_GATE), sees "loading" (several times: it stays so while the
// gate is shut), opens the gate, waits for 200 (polls bounded by count) and checks that the
// first request works and that the start-up log names the resident bytes.
import { test, after } from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { root, postCompletion, startServer, stopServers } from "./server.mjs";

after(stopServers);

test("serve: /health is 503 loading until the weights are resident; the first request then works", { timeout: 60000 }, async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "tm-ready-"));
  try {
    const gate = path.join(dir, "gate");
    const stories = path.join(root, "models/stories260K.gguf");
    const S = await startServer(stories, [], { ready: false, env: { TOKENMILL_TEST_RESIDENT_GATE: gate } });
    let log = S.log;
    S.proc.stderr.on("data", (d) => { log += d; });
    for (let i = 0; i < 3; i++) {
      const h = await fetch(`${S.url}/health`);
      assert.equal(h.status, 503);
      assert.ok(h.headers.get("retry-after"));
      assert.equal((await h.json()).status, "loading");
      await new Promise((r) => setTimeout(r, 20));
    }
    assert.doesNotMatch(log, /: ready\n/);
    fs.writeFileSync(gate, "");
    let status = 0;
    for (let i = 0; i < 1000 && status !== 200; i++) {
      status = (await fetch(`${S.url}/health`)).status;
      if (status !== 200) await new Promise((r) => setTimeout(r, 20));
    }
    assert.equal(status, 200);
    assert.equal((await (await fetch(`${S.url}/health`)).json()).status, "ok");
    assert.match(log, /weights resident: [\d.]+ MiB mapped.*in [\d.]+ s/);
    assert.match(log, /: ready\n/);
    const body = await postCompletion(S.url, { model: "stories260K", prompt: "Once upon a time", max_tokens: 4, temperature: 0 });
    assert.equal(body.usage.completion_tokens, 4);
  } finally {
    await stopServers();
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
