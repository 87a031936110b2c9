// cluster: `tokenmill gateway` in front of stand-in workers (fakeworker.mjs: the cluster
// protocol with a deterministic fake model, so any resume from the streamed tokens continues
// exactly as an undisturbed run) on loopback: 32 concurrent streams, kill -9 of a decode and
// of a prefill worker mid-stream, drain of a decode worker under load, malformed frames to the
// gateway's registration port, no worker -> 503 in the API's shape. Every process is killed at
// the end; each step is bounded in time.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import fs from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { root, bin } from "./server.mjs";

const model = path.join(root, "models/stories260K.gguf");
const procs = [];
let gw, regPort, fp, store;
const workers = {};   // name -> proc

function waitLine(proc, re, what, ms = 20000) {
  let log = "";
  return new Promise((resolve, reject) => {
    const t = setTimeout(() => reject(new Error(`${what} did not start: ${log}`)), ms);
    const on = (d) => { log += d; const m = re.exec(log); if (m) { clearTimeout(t); resolve(m); } };
    proc.stderr?.on("data", on);
    proc.stdout?.on("data", on);
    proc.on("exit", (c) => { clearTimeout(t); reject(new Error(`${what} exited ${c}: ${log}`)); });
  });
}

async function admin() { return (await fetch(gw + "/admin/workers")).json(); }

async function waitWorkers(pred, ms = 10000) {
  const end = Date.now() + ms;
  for (;;) {
    const a = await admin();
    if (pred(a.workers.filter((w) => w.up && !w.draining))) return a;
    if (Date.now() > end) throw new Error("workers: " + JSON.stringify(a.workers));
    await new Promise((r) => setTimeout(r, 50));
  }
}

async function startWorker(role, name, ms) {
  const p = spawn(process.execPath, [path.join(root, "tests/e2e/fakeworker.mjs"), "--gateway", `127.0.0.1:${regPort}`,
    "--role", role, "--fp", fp, "--vocab", "512", "--ms", String(ms)], { stdio: ["ignore", "pipe", "pipe"] });
  procs.push(p);
  await waitLine(p, /registered/, "fake worker");
  p.removeAllListeners("exit");
  p.stdout.resume(); p.stderr.resume();
  workers[name] = p;
  return p;
}

before(async () => {
  store = fs.mkdtempSync(path.join(os.tmpdir(), "tm-cluster-"));
  const p = spawn(bin, ["gateway", "-m", model, "--listen", "127.0.0.1:0", "--register", "127.0.0.1:0", "--cache", `dir:${store}`,
    "--wait-timeout", "2", ...(process.env.TM_GW_V ? ["-v"] : [])], { stdio: ["ignore", "ignore", "pipe"] });
  procs.push(p);
  let log = "";
  p.stderr.on("data", (d) => { log += d; if (process.env.TM_GW_LOG) fs.appendFileSync(process.env.TM_GW_LOG, d); });
  const m = await waitLine(p, /register at [^:]+:(\d+)[\s\S]*listening on http:\/\/[^:]+:(\d+)/, "gateway");
  p.removeAllListeners("exit");
  regPort = Number(m[1]);
  gw = `http://127.0.0.1:${m[2]}`;
  fp = (await admin()).model_fingerprint;
});

after(async () => {
  for (const p of procs) if (p.exitCode === null && p.signalCode === null) p.kill("SIGKILL");
  await new Promise((r) => setTimeout(r, 100));
  fs.rmSync(store, { recursive: true, force: true });
});

const PROMPTS = Array.from({ length: 32 }, (_, i) => `Once upon a time there was a little ${["cat", "dog", "bird", "fish"][i % 4]} number ${i}.`);

async function stream(prompt, maxTokens) {
  const res = await fetch(gw + "/v1/completions", { method: "POST", headers: { "content-type": "application/json" },
    body: JSON.stringify({ prompt, max_tokens: maxTokens, temperature: 0, stream: true, stream_options: { include_usage: true } }) });
  assert.equal(res.status, 200, await res.clone().text());
  const body = await res.text();
  let text = "", finish = null, done = false, usage = null;
  for (const line of body.split("\n")) {
    if (!line.startsWith("data: ")) continue;
    if (line === "data: [DONE]") { done = true; continue; }
    const j = JSON.parse(line.slice(6));
    assert.ok(!j.error, line);
    if (j.usage) usage = j.usage;
    for (const c of j.choices || []) { text += c.text; if (c.finish_reason) finish = c.finish_reason; }
  }
  return { text, finish, done, usage };
}

const all = (n) => Promise.all(PROMPTS.map((p) => stream(p, n)));
let baseline;

test("no worker: the request waits, then 503 in the API's shape", async () => {
  const t0 = Date.now();
  const res = await fetch(gw + "/v1/completions", { method: "POST", body: JSON.stringify({ prompt: "Hi", max_tokens: 3 }) });
  assert.equal(res.status, 503);
  const j = await res.json();
  assert.equal(j.error.type, "server_error");
  assert.match(j.error.message, /No worker/);
  assert.ok(Date.now() - t0 >= 1500);
});

test("32 concurrent greedy streams through 2 prefill + 2 decode workers", { timeout: 60000 }, async () => {
  await startWorker("prefill", "p1", 150);
  await startWorker("prefill", "p2", 150);
  await startWorker("decode", "d1", 15);
  await startWorker("decode", "d2", 15);
  await waitWorkers((w) => w.length === 4);
  baseline = await all(48);
  for (const r of baseline) {
    assert.equal(r.finish, "length");
    assert.ok(r.done);
    assert.equal(r.usage.completion_tokens, 48);
    assert.ok(r.text.length > 0);
  }
  assert.equal(new Set(baseline.map((r) => r.text)).size, 32);
  const a = await admin();
  assert.ok(a.workers.every((w) => w.jobs > 0), JSON.stringify(a.workers)); // both of each role were used
  const metrics = await (await fetch(gw + "/metrics")).text();
  assert.match(metrics, /tokenmill_worker_running\{worker="fake-decode-\d+",role="decode"\}/);
});

test("kill -9 of a decode worker mid-stream: every stream completes with the same text", { timeout: 60000 }, async () => {
  const before = (await admin()).resumes;
  const runs = all(48);
  await new Promise((r) => setTimeout(r, 600));
  workers.d1.kill("SIGKILL");
  const got = await runs;
  got.forEach((r, i) => { assert.equal(r.text, baseline[i].text, `stream ${i}`); assert.equal(r.finish, "length"); assert.equal(r.usage.completion_tokens, 48); });
  assert.ok((await admin()).resumes > before);
  await startWorker("decode", "d1", 15);
  await waitWorkers((w) => w.filter((x) => x.role === "decode").length === 2);
});

test("kill -9 of a prefill worker mid-prefill: every stream completes with the same text", { timeout: 60000 }, async () => {
  const before = (await admin()).reprefills;
  const runs = all(48);
  await new Promise((r) => setTimeout(r, 60));
  workers.p1.kill("SIGKILL");
  const got = await runs;
  got.forEach((r, i) => { assert.equal(r.text, baseline[i].text, `stream ${i}`); assert.equal(r.finish, "length"); });
  assert.ok((await admin()).reprefills > before);
  await startWorker("prefill", "p1", 150);
});

test("drain of a decode worker under load loses nothing", { timeout: 60000 }, async () => {
  await waitWorkers((w) => w.length === 4);
  const runs = all(48);
  await new Promise((r) => setTimeout(r, 500));
  const name = (await admin()).workers.find((w) => w.up && w.role === "decode" && w.running > 0).addr;
  const res = await fetch(`${gw}/admin/drain?worker=${encodeURIComponent(name)}&deadline_ms=200`, { method: "POST" });
  assert.equal(res.status, 200);
  const got = await runs;
  got.forEach((r, i) => { assert.equal(r.text, baseline[i].text, `stream ${i}`); assert.equal(r.finish, "length"); });
  const cap = await (await fetch(gw + "/admin/capacity")).json();
  assert.ok(cap.prefill.recommended >= 1 && cap.decode.recommended >= 1);
});

test("malformed frames to the gateway are refused and it stays up", { timeout: 30000 }, async () => {
  const before = (await admin()).refused_connections;
  for (const junk of [Buffer.from("GET / HTTP/1.1\r\nHost: x\r\n\r\n" + "x".repeat(40)), Buffer.alloc(64, 0xff)]) {
    await new Promise((resolve) => {
      const s = net.connect(regPort, "127.0.0.1", () => s.write(junk));
      s.on("data", () => {});
      s.on("close", resolve);
      s.on("error", resolve);
      setTimeout(() => { s.destroy(); resolve(); }, 5000);
    });
  }
  const a = await admin();
  assert.ok(a.refused_connections >= before + 2, JSON.stringify(a));
  const r = await stream(PROMPTS[0], 48);
  assert.equal(r.text, baseline[0].text);
});
