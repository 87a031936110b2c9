// cluster: the real disaggregated server on loopback: `tokenmill gateway` + 2 prefill + 2 decode
// `tokenmill worker` processes (they register with --gateway; a second gateway reaches two of
// them by its static --prefill/--decode addresses), all sharing one temporary dir: block store,
// on models/stories260K.gguf (f32: greedy results are reproducible). The reference texts come
// from one `tokenmill serve` on the same model. Shown, with the `openai` npm client:
//   - 32 concurrent greedy streams == `tokenmill serve`;
//   - kill -9 of a decode worker mid-stream and of a prefill worker mid-prefill: every stream
//     completes with the same text (no gap, no duplicate, no error);
//   - drain of a decode worker under load (POST /admin/drain; and SIGTERM): nothing lost;
//   - a prefix prefilled on one prefill worker is a cache hit on the other;
//   - malformed frames to a worker's port and to the gateway's registration port are refused,
//     the processes stay up and keep serving;
//   - strangers on the registration port without the cluster key (a replayed HELLO of the
//     protocol before the handshake, a HELLO without it, a wrong key) are refused, never listed,
//     never sent a request; the handshake and frame tags are spoken here from docs/protocol.md;
//   - a decode worker stopped (SIGSTOP) mid-stream: its streams move; SIGINT drains a worker
//     like SIGTERM, and a second signal ends it at once;
//   - no worker of a role: the request waits, then a 503 in the API's shape;
//   - thinking.budget_tokens through a gateway (its own DeepSeek-R1-templated generated model and
//     workers) == `tokenmill serve`, also when the decode worker dies inside the think block;
//   - a worker that refuses a request's grammar (ERROR ARG) makes it a 400 in the client's shape.
//   - worker names are unique (two without --name differ; a taken one is refused, and a refused
//     worker logs only its refusal); /admin/drain drains the one named, /admin/undrain undoes it;
//   - SIGTERM drains a gateway: 503 to new requests, a running stream ends normally, or, past a
//     short --drain-timeout, as incomplete.
// "Mid-stream" is made certain, not left to timing: the decode workers are stopped (SIGSTOP)
// the moment the clients have 60% of the tokens, then the busier one is killed or drained; a
// prefill worker is stopped before the requests come and killed once it holds jobs. Every
// process is killed at the end, also on failure (and if node itself exits); each step is
// bounded in time.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync, spawn } from "node:child_process";
import crypto from "node:crypto";
import fs from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import OpenAI from "openai";
import { root, bin, startServer, stopServers } from "./server.mjs";
import { augment } from "../oracle/vocab_augment.mjs";

const model = path.join(root, "models/stories260K.gguf");
const procs = [];
let gw, regPort, store, client;
// XDG_CACHE_HOME of every process started here: their cluster key (none is given with
// --cluster-key-file, so they share the one generated there) stays out of the user's cache dir
let cacheHome;
const workers = {};   // name -> { proc, port, addr }

const killAll = () => { for (const p of procs) if (p.exitCode === null && p.signalCode === null) { try { p.kill("SIGKILL"); } catch {} } };
process.on("exit", killAll);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function waitLine(proc, re, what, ms = 20000) {
  let log = "";
  return new Promise((resolve, reject) => {
    const t = setTimeout(() => reject(new Error(`${what} did not start: ${log}`)), ms);
    const on = (d) => { log += d; const m = re instanceof RegExp ? re.exec(log) : re(log); if (m) { clearTimeout(t); proc.removeListener("exit", ex); resolve(m); } };
    const ex = (c) => { clearTimeout(t); reject(new Error(`${what} exited ${c}: ${log}`)); };
    proc.stderr?.on("data", on);
    proc.on("exit", ex);
  });
}

function spawnLogged(args, tag) {
  const p = spawn(bin, args, { stdio: ["ignore", "ignore", "pipe"], env: { ...process.env, XDG_CACHE_HOME: cacheHome } });
  procs.push(p);
  if (process.env.TM_CLUSTER_LOG) p.stderr.on("data", (d) => fs.appendFileSync(process.env.TM_CLUSTER_LOG, `[${tag}] ${d}`));
  return p;
}

async function startGateway(extra, tag) {
  const p = spawnLogged(["gateway", "-m", model, "--listen", "127.0.0.1:0", "--cache", `dir:${store}`, "--wait-timeout", "2", ...extra], tag);
  const m = await waitLine(p, /listening on http:\/\/[^:]+:(\d+)/, tag);
  p.stderr.resume();
  return { proc: p, url: `http://127.0.0.1:${m[1]}`, log: m.input };
}

async function admin(url = gw) { return (await fetch(url + "/admin/workers")).json(); }
const findW = (a, name) => a.workers.find((w) => w.addr === workers[name].addr);

async function until(pred, what, ms = 10000, url = gw) {
  const end = Date.now() + ms;
  for (;;) {
    const a = await admin(url);
    if (pred(a)) return a;
    if (Date.now() > end) throw new Error(`${what}: ` + JSON.stringify(a.workers));
    await sleep(5);
  }
}
const live = (a) => a.workers.filter((w) => w.up && !w.draining);
const nLive = (a, role) => live(a).filter((w) => w.role === role).length;

async function startWorker(role, name) {
  const p = spawnLogged(["worker", "--role", role, "-m", model, "--listen", "127.0.0.1:0", "--gateway", `127.0.0.1:${regPort}`,
    "--cache", `dir:${store}`, "--threads", "1", "--name", name, "--drain-timeout", "1"], name);
  // the two lines come from different threads, in either order
  const m = await waitLine(p, (log) => /registered with the gateway/.test(log) && /listening on port (\d+)/.exec(log), `worker ${name}`);
  const port = Number(m[1]);
  workers[name] = { proc: p, port, addr: `127.0.0.1:${port}`, log: m.input };
  p.stderr.on("data", (d) => { workers[name].log += d; });
  await until((a) => { const w = findW(a, name); return w && w.up && !w.draining; }, `worker ${name} in`);
  return workers[name];
}

const exited = (p) => p.exitCode !== null || p.signalCode !== null;
// after a process exited: the rest of its stderr (its last lines may come after the exit event)
const stderrEnd = (p) => new Promise((r) => (p.stderr.readableEnded ? r() : p.stderr.once("end", r)));
const waitExit = (p, ms = 5000) => exited(p) ? Promise.resolve() : new Promise((resolve, reject) => {
  const t = setTimeout(() => reject(new Error("process did not exit")), ms);
  p.on("exit", () => { clearTimeout(t); resolve(); });
});

const ANIMALS = ["cat", "dog", "bird", "fish"];
// a shared story opening of more than one 128-token KV block: the odd prompts start with it,
// so those requests hand off full blocks through the store and hit each other's
const STORY = "Once upon a time, in a small town near the sea, there lived a girl named Mia. Mia loved to walk on the beach and look for shells. " +
  "Every morning she took her little basket and her dog Spot, and they went down to the water together. One day Mia found a big blue shell " +
  "that was shiny and round. She showed it to her mom, and her mom smiled.";
const PROMPTS = Array.from({ length: 32 }, (_, i) => (i & 1 ? STORY + " " : "") +
  `Once upon a time there was a little ${ANIMALS[(i >> 1) % 4]} named ${["Tim", "Sue", "Max", "Lily"][(i >> 3) % 4]} who ${i & 16 ? "liked" : "did not like"} ${i}`);
const MAX = 160;
// another long prefix, used by nothing else (the cross-worker cache hit)
const LONG = "Once upon a time, in a big green forest, there lived a little rabbit named Ben. Ben liked to hop and play with his friends every day. " +
  "One sunny morning, Ben found a shiny red ball under a tall tree. He was very happy and wanted to share it with his friend, a small bird named Pip. " +
  "They played all day long until the sun went down, and then they went home to sleep.";

async function stream(url, prompt, maxTokens, onChunk) {
  const c = url === gw ? client : new OpenAI({ apiKey: "x", baseURL: url + "/v1", maxRetries: 0 });
  const s = await c.completions.create({ model: "stories260K", prompt, max_tokens: maxTokens, temperature: 0, stream: true,
    stream_options: { include_usage: true } });
  let text = "", finish = null, usage = null, chunks = 0;
  for await (const ch of s) {
    if (ch.usage) usage = ch.usage;
    for (const c of ch.choices || []) {
      text += c.text;
      if (c.text) { chunks++; onChunk?.(); }
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  return { text, finish, usage, chunks };
}

const all = (url = gw, prompts = PROMPTS) => Promise.all(prompts.map((p) => stream(url, p, MAX)));
let ref;         // `tokenmill serve`'s results for PROMPTS
let refLong;     // and for LONG
let late;        // streamed tokens (all 32) by which most contexts are past one 128-token block

function sameAsServe(got, what) {
  got.forEach((r, i) => {
    assert.equal(r.text, ref[i].text, `${what}: stream ${i}`);
    assert.equal(r.finish, ref[i].finish, `${what}: stream ${i} finish`);
    assert.equal(r.usage.completion_tokens, ref[i].usage.completion_tokens, `${what}: stream ${i} tokens`);
  });
}

before(async () => {
  // the reference: one `tokenmill serve` on the same model, the same 32 requests, concurrently
  const srv = await startServer(model, []);
  const sc = new OpenAI({ apiKey: "x", baseURL: srv.url + "/v1", maxRetries: 0 });
  const one = async (prompt, n) => {
    const s = await sc.completions.create({ model: "stories260K", prompt, max_tokens: n, temperature: 0, stream: true, stream_options: { include_usage: true } });
    let text = "", finish = null, usage = null;
    for await (const ch of s) { if (ch.usage) usage = ch.usage; for (const c of ch.choices || []) { text += c.text; if (c.finish_reason) finish = c.finish_reason; } }
    return { text, finish, usage };
  };
  ref = await Promise.all(PROMPTS.map((p) => one(p, MAX)));
  refLong = await one(LONG, 24);
  late = Math.floor(0.6 * ref.reduce((n, r) => n + r.usage.completion_tokens, 0));
  await stopServers();
  assert.ok(new Set(ref.map((r) => r.text)).size >= 24, "the reference texts differ");
  assert.ok(ref.every((r) => r.usage.completion_tokens > 20), "reference streams are long enough");

  store = fs.mkdtempSync(path.join(os.tmpdir(), "tm-cluster-"));
  cacheHome = fs.mkdtempSync(path.join(os.tmpdir(), "tm-cluster-home-"));
  const g = await startGateway(["--register", "127.0.0.1:0", ...(process.env.TM_GW_V ? ["-v"] : [])], "gateway");
  regPort = Number(/register at [^:\s]+:(\d+)/.exec(g.log)[1]);
  gw = g.url;
  client = new OpenAI({ apiKey: "x", baseURL: gw + "/v1", maxRetries: 0, timeout: 60000 });
});

after(async () => {
  killAll();
  await sleep(100);
  if (store) fs.rmSync(store, { recursive: true, force: true });
  if (cacheHome) fs.rmSync(cacheHome, { recursive: true, force: true });
});

test("no worker: the request waits, then 503 in the API's shape", async () => {
  const t0 = Date.now();
  const res = await fetch(gw + "/v1/completions", { method: "POST", body: JSON.stringify({ prompt: "Hi", max_tokens: 3 }) });
  assert.equal(res.status, 503);
  const j = await res.json();
  assert.equal(j.error.type, "server_error");
  assert.match(j.error.message, /No worker/);
  assert.ok(Date.now() - t0 >= 1500);
});

test("32 concurrent greedy streams through 2 prefill + 2 decode workers == tokenmill serve", { timeout: 60000 }, async () => {
  await Promise.all([startWorker("prefill", "p1"), startWorker("prefill", "p2"), startWorker("decode", "d1"), startWorker("decode", "d2")]);
  await until((a) => live(a).length === 4, "4 workers");
  sameAsServe(await all(), "undisturbed");
  const a = await admin();
  assert.ok(a.workers.every((w) => w.jobs > 0), JSON.stringify(a.workers)); // both of each role were used
  const metrics = await (await fetch(gw + "/metrics")).text();
  assert.match(metrics, new RegExp(`tokenmill_worker_running\\{worker="${workers.d1.addr}",role="decode"\\}`));
  // the gateway's own share of each request's latency: one observation per request (at least
  // these 32; no value is asserted)
  assert.match(metrics, /^# TYPE tokenmill_gateway_added_seconds histogram$/m);
  const added = Number(/^tokenmill_gateway_added_seconds_count (\S+)$/m.exec(metrics)?.[1]);
  assert.ok(added >= 32, `tokenmill_gateway_added_seconds_count ${added}`);
  assert.match(metrics, /^tokenmill_gateway_added_seconds_bucket\{le="\+Inf"\} \d+$/m);
  // the KV handoff cost reaches the gateway with the heartbeats: both sides populated, and the
  // prefill workers' speed (no timing is asserted, only that the figures are there)
  const sum = (t, re) => [...t.matchAll(re)].reduce((n, m) => n + Number(m[1]), 0);
  const end = Date.now() + 20000;
  for (;;) {
    const t = await (await fetch(gw + "/metrics")).text();
    const send = sum(t, /^tokenmill_worker_handoff_tokens_total\{[^}]*side="send"\} (\S+)$/gm);
    const recv = sum(t, /^tokenmill_worker_handoff_tokens_total\{[^}]*side="receive"\} (\S+)$/gm);
    const n = sum(t, /^tokenmill_worker_handoffs_total\{[^}]*side="send"\} (\S+)$/gm);
    if (n >= 32 && send > 0 && recv > 0) {
      assert.match(t, /^tokenmill_worker_handoff_seconds_total\{[^}]*side="receive"\} \S+$/m);
      assert.match(t, /^tokenmill_worker_prefill_tokens_per_second\{[^}]*role="prefill"\} \S+$/m);
      assert.ok(Number(/^tokenmill_handoff_seconds_per_token (\S+)$/m.exec(t)[1]) > 0);
      assert.ok(Number(/^tokenmill_recompute_seconds_per_token (\S+)$/m.exec(t)[1]) > 0);
      break;
    }
    assert.ok(Date.now() < end, `handoff metrics not populated: ${t}`);
    await sleep(100);
  }
});

// Starts the 32 streams; once `at` tokens have reached the clients, stops (SIGSTOP) both decode
// workers at that instant, so that whatever the machine's speed their streams are half done,
// and returns the one the gateway counts more running streams on (the victim) and the other.
// On a loaded machine the chunk count can be reached while no decode worker holds a stream
// (they are all still in prefill, or already done): then the round is let finish (its streams
// still checked against serve) and tried again, so the caller always gets a busy victim.
async function freezeDecode(at) {
  for (let attempt = 1; ; attempt++) {
    let chunks = 0, frozen;
    const froze = new Promise((r) => { frozen = r; });
    const onChunk = () => {
      if (++chunks !== at) return;
      for (const n of ["d1", "d2"]) workers[n].proc.kill("SIGSTOP");
      frozen();
    };
    const runs = Promise.all(PROMPTS.map((p) => stream(gw, p, MAX, onChunk)));
    await froze;
    // frames the workers sent just before they stopped (a FINISH) reach the gateway first, so
    // that its running counts are those of streams that really are unfinished
    await sleep(300);
    const a = await admin();
    const [victim, other] = findW(a, "d1").running >= findW(a, "d2").running ? ["d1", "d2"] : ["d2", "d1"];
    const busy = findW(a, victim).running;
    if (busy > 0 || attempt === 3) return { runs, victim, other, busy };
    for (const n of ["d1", "d2"]) workers[n].proc.kill("SIGCONT");
    sameAsServe(await runs, `round ${attempt} let finish`);
  }
}

test("kill -9 of a decode worker mid-stream: every stream completes with the same text", { timeout: 60000 }, async () => {
  const before = (await admin()).resumes;
  const { runs, victim, other, busy } = await freezeDecode(late);
  workers[victim].proc.kill("SIGKILL");
  workers[other].proc.kill("SIGCONT");
  await waitExit(workers[victim].proc);
  assert.ok(busy > 0, "the victim had streams running");
  sameAsServe(await runs, "decode killed");
  assert.ok((await admin()).resumes >= before + busy, "every stream of the dead worker resumed");
  await startWorker("decode", victim);
});

test("kill -9 of a prefill worker mid-prefill: every stream completes with the same text", { timeout: 60000 }, async () => {
  const before = (await admin()).reprefills;
  workers.p1.proc.kill("SIGSTOP");     // a prefill is too quick to catch: its jobs wait on it
  const runs = Promise.all(PROMPTS.map((p) => stream(gw, p, MAX)));
  const a = await until((x) => findW(x, "p1").prefill_jobs > 0, "p1 busy", 20000);
  assert.ok(findW(a, "p1").prefill_jobs > 0);
  workers.p1.proc.kill("SIGKILL");
  await waitExit(workers.p1.proc);
  sameAsServe(await runs, "prefill killed");
  assert.ok((await admin()).reprefills > before);
  await startWorker("prefill", "p1");
});

test("drain of a decode worker under load (admin drain, then SIGTERM) loses nothing", { timeout: 60000 }, async () => {
  await until((a) => nLive(a, "decode") === 2 && nLive(a, "prefill") === 2, "4 workers");
  const before = (await admin()).resumes;
  // frozen with its streams half done, it is drained with a short deadline: the rest moves
  const { runs, victim, other, busy } = await freezeDecode(late);
  // a 1 ms deadline: its streams cannot all end in time, some must move (with 50 ms a fast
  // moment of the machine finished them all and nothing moved)
  const res = await fetch(`${gw}/admin/drain?worker=${encodeURIComponent(workers[victim].addr)}&deadline_ms=1`, { method: "POST" });
  assert.equal(res.status, 200);
  for (const n of [victim, other]) workers[n].proc.kill("SIGCONT");
  assert.ok(busy > 0, "the drained worker had streams running");
  sameAsServe(await runs, "decode drained");
  assert.ok((await admin()).resumes > before, "the drained worker's streams moved");
  // a drained worker takes no new work; SIGTERM ends it cleanly
  sameAsServe(await all(gw, PROMPTS.slice(0, 4)), "after drain");
  assert.equal(findW(await admin(), victim).running, 0);
  workers[victim].proc.kill("SIGTERM");
  await waitExit(workers[victim].proc, 10000);
  assert.equal(workers[victim].proc.exitCode, 0);
  const cap = await (await fetch(gw + "/admin/capacity")).json();
  assert.ok(cap.prefill.recommended >= 1 && cap.decode.recommended >= 1);
  await startWorker("decode", victim);
});

test("SIGTERM of a decode worker under load: it finishes or moves its streams, exits 0, nothing lost", { timeout: 60000 }, async () => {
  await until((a) => nLive(a, "decode") === 2, "2 decode workers");
  const { runs, victim, other, busy } = await freezeDecode(Math.floor(late / 2));
  workers[victim].proc.kill("SIGTERM");   // --drain-timeout 1: what is left after 1 s is moved
  for (const n of [victim, other]) workers[n].proc.kill("SIGCONT");
  assert.ok(busy > 0, "the worker had streams running");
  sameAsServe(await runs, "decode SIGTERM");
  await waitExit(workers[victim].proc, 10000);
  assert.equal(workers[victim].proc.exitCode, 0);
  await startWorker("decode", victim);
});

// A stopped worker neither heartbeats nor makes progress: the gateway moves its streams (with the
// tokens they have) to the other decode worker; once continued, it registers again and serves.
test("a decode worker stopped (SIGSTOP) mid-stream: its streams move, every stream == serve", { timeout: 60000 }, async () => {
  await until((a) => nLive(a, "decode") === 2 && nLive(a, "prefill") === 2, "4 workers");
  const before = (await admin()).resumes;
  const { runs, victim, other, busy } = await freezeDecode(late);
  workers[other].proc.kill("SIGCONT");   // the victim stays stopped
  assert.ok(busy > 0, "the stopped worker had streams running");
  sameAsServe(await runs, "decode stopped");
  assert.ok((await admin()).resumes >= before + busy, "every stream of the stopped worker moved");
  workers[victim].proc.kill("SIGCONT");
  await until((a) => { const w = findW(a, victim); return w && w.up && !w.draining; }, `${victim} back`, 20000);
  sameAsServe(await all(), "after SIGCONT");
});

// SIGINT drains a worker like SIGTERM (it finishes what it can within --drain-timeout, hands the
// rest back, exits 0); a second signal during the drain ends it at once (status 1). Streams
// complete with serve's text either way.
test("SIGINT of a decode worker mid-stream drains it; a second signal exits at once; streams complete", { timeout: 60000 }, async () => {
  await until((a) => nLive(a, "decode") === 2, "2 decode workers");
  const f = await freezeDecode(Math.floor(late / 2));
  workers[f.victim].proc.kill("SIGINT");
  for (const n of [f.victim, f.other]) workers[n].proc.kill("SIGCONT");
  assert.ok(f.busy > 0, "the worker had streams running");
  sameAsServe(await f.runs, "decode SIGINT");
  await waitExit(workers[f.victim].proc, 10000);
  await stderrEnd(workers[f.victim].proc);
  assert.equal(workers[f.victim].proc.exitCode, 0);
  assert.match(workers[f.victim].log, /SIGINT, draining/);
  assert.match(workers[f.victim].log, /drained/);
  await startWorker("decode", f.victim);
  await until((a) => nLive(a, "decode") === 2, "2 decode workers");
  const g = await freezeDecode(Math.floor(late / 2));
  // both pending while it is stopped: the first starts the drain, the second ends it at once
  workers[g.victim].proc.kill("SIGTERM");
  workers[g.victim].proc.kill("SIGINT");
  for (const n of [g.victim, g.other]) workers[n].proc.kill("SIGCONT");
  sameAsServe(await g.runs, "decode second signal");
  await waitExit(workers[g.victim].proc, 10000);
  await stderrEnd(workers[g.victim].proc);
  assert.equal(workers[g.victim].proc.exitCode, 1);
  assert.match(workers[g.victim].log, /second signal/);
  await startWorker("decode", g.victim);
});

test("a prefix prefilled on one prefill worker is a cache hit on the other", { timeout: 60000 }, async () => {
  await until((a) => nLive(a, "prefill") === 2, "2 prefill workers");
  const jobs = (a) => Object.fromEntries(["p1", "p2"].map((n) => [n, findW(a, n).jobs]));
  const j0 = jobs(await admin());
  const first = await stream(gw, LONG, 24);
  assert.equal(first.text, refLong.text);
  assert.equal(first.usage.prompt_tokens_details?.cached_tokens ?? 0, 0, "cold store");
  assert.ok(first.usage.prompt_tokens > 128, `prompt of ${first.usage.prompt_tokens} tokens spans a full block`);
  const j1 = jobs(await admin());
  const [on, other] = j1.p1 > j0.p1 ? ["p1", "p2"] : ["p2", "p1"];
  assert.equal(j1[other], j0[other]);
  // take the first worker away: the second request can only land on the other one
  const res = await fetch(`${gw}/admin/drain?worker=${encodeURIComponent(workers[on].addr)}&deadline_ms=1000`, { method: "POST" });
  assert.equal(res.status, 200);
  await until((a) => nLive(a, "prefill") === 1, "drained");
  const second = await stream(gw, LONG, 24);
  assert.equal(second.text, refLong.text);
  assert.ok(second.usage.prompt_tokens_details.cached_tokens >= 128, JSON.stringify(second.usage));
  const j2 = jobs(await admin());
  assert.equal(j2[other], j1[other] + 1, `the second request ran on ${other}`);
  assert.equal(j2[on], j1[on]);
  workers[on].proc.kill("SIGTERM");
  await waitExit(workers[on].proc, 10000);
  await startWorker("prefill", on);
});

function frame(type, id, payload, version = 3) {
  const h = Buffer.alloc(24);
  h.writeUInt32LE(0x50434d54, 0); h.writeUInt16LE(version, 4); h.writeUInt16LE(type, 6);
  h.writeBigUInt64LE(BigInt(id), 12); h.writeUInt32LE(payload.length, 20);
  return Buffer.concat([h, payload]);
}
const le = (n, v, f) => { const b = Buffer.alloc(n); b[f](v); return b; };
const u8 = (v) => Buffer.from([v]), u32 = (v) => le(4, v >>> 0, "writeUInt32LE"), i32 = (v) => le(4, v, "writeInt32LE");
const f32 = (v) => le(4, v, "writeFloatLE"), u64 = (v) => le(8, BigInt(v), "writeBigUInt64LE");
const str = (t) => Buffer.concat([le(2, t.length, "writeUInt16LE"), Buffer.from(t)]);
const ids = (a) => Buffer.concat([u32(a.length), ...a.map(i32)]);
const params = (pen) => Buffer.concat([f32(0.8), i32(0), f32(1), f32(0), f32(1), f32(0), f32(0), i32(pen), u64(1), i32(4),
  u8(0), u8(0), u8(0), u8(0), i32(0), str("")]);
// KV type 1 (F16): the real workers', which a model's workers must all share
const helloPayload = (role, fp, name) => Buffer.concat([u8(role), u8(1), fp, u32(16), u32(64), u32(256), u32(512), u32(512),
  str("127.0.0.1:1"), str(name), str("")]);   // model_id "": matched by the fingerprint

// ---- the cluster handshake and frame tags, written from docs/protocol.md (not from the C) ----
const hmac = (key, ...parts) => crypto.createHmac("sha256", key).update(Buffer.concat(parts)).digest();
const clusterKey = () => Buffer.from(fs.readFileSync(path.join(cacheHome, "tokenmill/cluster.key"), "utf8").replace(/\s+$/, ""));

// A connection to a gateway's registration port or a worker's port playing `side` ("W" a worker,
// "G" a gateway): handshake() proves key (false when refused), send() frames (tagged once
// sealed), frames: what came in (tags checked), closed: a promise.
function peer(port, key, side) {
  const s = net.connect(port, "127.0.0.1");
  const other = side === "W" ? "G" : "W";
  const p = { frames: [], sealed: false, txSealed: false, badTag: false, txSeq: 0n, rxSeq: 0n, raw: Buffer.alloc(0) };
  const nonce = crypto.randomBytes(32);
  let buf = Buffer.alloc(0), waiters = [];
  const wake = () => { for (const w of waiters.splice(0)) w(); };
  p.closed = new Promise((r) => { s.on("close", () => { p.isClosed = true; wake(); r(); }); s.on("error", () => {}); });
  s.on("data", (d) => {
    p.raw = Buffer.concat([p.raw, d]);
    buf = Buffer.concat([buf, d]);
    for (;;) {
      if (buf.length < 24) break;
      const len = buf.readUInt32LE(20), tagged = p.sealed, n = 24 + len + (tagged ? 16 : 0);
      if (buf.length < n) break;
      const f = { type: buf.readUInt16LE(6), id: Number(buf.readBigUInt64LE(12)), payload: buf.subarray(24, 24 + len) };
      if (tagged) {
        const seq = Buffer.alloc(8); seq.writeBigUInt64LE(p.rxSeq++);
        if (!hmac(p.rxKey, seq, buf.subarray(0, 24 + len)).subarray(0, 16).equals(buf.subarray(24 + len, n))) p.badTag = true;
      }
      buf = buf.subarray(n);
      p.frames.push(f);
      // the peer seals after its PROOF when ours was right
      if (f.type === 12 && p.ng && f.payload.equals(hmac(key, Buffer.from("TMCP-PROOF"), Buffer.from(other), p.ng, nonce))) {
        p.peerProved = true;
        p.sealed = true;
      }
      if (f.type === 11) p.ng = Buffer.from(f.payload);
    }
    wake();
  });
  p.next = async (pred, ms = 10000) => {
    const end = Date.now() + ms;
    for (;;) {
      const f = p.frames.find(pred);
      if (f) { p.frames.splice(p.frames.indexOf(f), 1); return f; }
      if (p.isClosed || Date.now() > end) return null;
      await new Promise((r) => { waiters.push(r); setTimeout(r, 100); });
    }
  };
  p.sendRaw = (b) => s.write(b);
  p.send = (type, id, payload, flags = 0) => {
    const f = frame(type, id, payload);
    f.writeUInt32LE(flags, 8);
    if (!p.txSealed) return s.write(f);
    const seq = Buffer.alloc(8); seq.writeBigUInt64LE(p.txSeq++);
    s.write(Buffer.concat([f, hmac(p.txKey, seq, f).subarray(0, 16)]));
  };
  p.handshake = async () => {
    await new Promise((r) => s.once("connect", r));
    p.send(11, 0, nonce);
    const ch = await p.next((f) => f.type === 11 || f.type === 10);
    if (!ch || ch.type !== 11) return false;
    // the session keys before the peer's PROOF arrives: the frames right after it are tagged
    p.txKey = hmac(key, Buffer.from("TMCP-KEY"), Buffer.from(side), nonce, p.ng);
    p.rxKey = hmac(key, Buffer.from("TMCP-KEY"), Buffer.from(other), p.ng, nonce);
    p.send(12, 0, hmac(key, Buffer.from("TMCP-PROOF"), Buffer.from(side), nonce, p.ng));
    p.txSealed = true;   // what we send from now on is tagged (the peer's frames once its PROOF is right)
    const pr = await p.next((f) => f.type === 12 || f.type === 10);
    if (!pr || pr.type !== 12 || !p.peerProved) return false;
    // the peer's verdict on our proof: an ERROR (untagged, it did not seal) or its tagged frames
    const more = await p.next((f) => f.type !== 2, 3000);
    if (more) p.frames.unshift(more);
    return !p.isClosed && !p.badTag && !(more && more.type === 10 && more.payload.readUInt32LE(0) === 11);
  };
  p.end = () => s.destroy();
  return p;
}

// Sends junk, returns whether the peer closed the connection (within 5 s) and what it sent.
async function sendJunk(port, junk) {
  return new Promise((resolve) => {
    let data = Buffer.alloc(0), done = false;
    const end = (closed) => { if (!done) { done = true; s.destroy(); resolve({ closed, data }); } };
    const s = net.connect(port, "127.0.0.1", () => s.write(junk));
    s.on("data", (d) => { data = Buffer.concat([data, d]); });
    s.on("close", () => end(true));
    s.on("error", () => end(true));
    setTimeout(() => end(false), 5000);
  });
}
const JUNK = [
  Buffer.from("GET / HTTP/1.1\r\nHost: x\r\n\r\n" + "x".repeat(40)),
  Buffer.alloc(64, 0xff),
  (() => { const h = Buffer.alloc(24); h.writeUInt32LE(0x50434d54, 0); h.writeUInt16LE(3, 4); h.writeUInt16LE(1, 6); h.writeUInt32LE(0xfffffff0, 20); return h; })(), // oversized
  (() => { const h = Buffer.alloc(32); h.writeUInt32LE(0x50434d54, 0); h.writeUInt16LE(3, 4); h.writeUInt16LE(3, 6); h.writeUInt32LE(8, 20); return h; })(),          // truncated PREFILL
];
// well-formed frames (after the handshake and a valid HELLO) whose values are out of range
// (docs/protocol.md): a penalty window of INT_MAX (an allocation of INT_MAX + 1 entries crashed
// the worker) and a DECODE replaying 2^31 sampler draws (it spun for minutes)
const WORKER_JUNK = [
  [3, 1, Buffer.concat([params(0x7fffffff), u32(0), ids([1, 200, 300])])],
  [5, 2, Buffer.concat([params(64), ids([1, 200, 300]), ids([301]), u32(0), u32(0x7fffffff)])],
];

test("malformed frames to the workers and to the gateway are refused; everything stays up and serves", { timeout: 60000 }, async () => {
  await until((a) => nLive(a, "prefill") === 2 && nLive(a, "decode") === 2, "4 workers");
  const before = (await admin()).refused_connections;
  for (const junk of JUNK) assert.ok((await sendJunk(regPort, junk)).closed, "the gateway closed the connection");
  const a = await admin();
  assert.ok(a.refused_connections >= before + JUNK.length, JSON.stringify(a));
  // a worker with the key that registers, then sends a broken frame: the gateway drops it, only it
  const imp = peer(regPort, clusterKey(), "W");
  assert.ok(await imp.handshake(), "the impostor holds the key");
  imp.send(1, 0, helloPayload(2, Buffer.from(a.model_fingerprint, "hex"), "impostor"), 1);   // REGISTER
  await until((x) => x.workers.some((w) => w.name === "impostor" && w.up), "impostor in");
  imp.send(6, 0, Buffer.concat([u32(3), u32(1)]));   // TOKENS short of its count (tagged right)
  await imp.closed;
  await until((x) => !x.workers.some((w) => w.name === "impostor" && w.up), "impostor out");
  for (const n of ["p2", "d2"]) {
    for (const junk of JUNK) assert.ok((await sendJunk(workers[n].port, junk)).closed, `${n} closed the connection`);
    for (const [type, id, payload] of WORKER_JUNK) {
      const g = peer(workers[n].port, clusterKey(), "G");
      assert.ok(await g.handshake(), `${n}: handshake`);
      g.send(1, 0, helloPayload(4, Buffer.alloc(32), "junk"));
      g.send(type, id, payload);
      const e = await g.next((f) => f.type === 10);
      await g.closed;
      assert.ok(e && /malformed/.test(e.payload.subarray(6).toString()), `${n} answered ERROR MALFORMED`);
      assert.ok(!g.badTag);
    }
  }
  for (const n of ["p1", "p2", "d1", "d2"]) assert.ok(!exited(workers[n].proc), `${n} is up`);
  sameAsServe(await all(), "after junk");
  // a second gateway reaches p2 and d2 by their static addresses: they still serve
  const g2 = await startGateway(["--prefill", workers.p2.addr, "--decode", workers.d2.addr], "gateway2");
  await until((x) => live(x).length === 2, "static workers", 10000, g2.url);
  const got = await all(g2.url, PROMPTS.slice(0, 8));
  sameAsServe(got, "static gateway");
  assert.ok((await admin(g2.url)).workers.every((w) => w.jobs > 0));
  g2.proc.kill("SIGTERM");
  await waitExit(g2.proc, 10000);
});

// Strangers on the cluster port: one replays the frames a worker of the protocol before the
// handshake sent (HELLO REGISTER, heartbeats), one sends a HELLO of this version with no
// handshake, one does the handshake with a wrong key. None is listed as a worker or sent a
// request (the 32 streams meanwhile all complete on the real workers); each is refused, counted
// and logged. Then a worker with the key, on the same port, is listed.
test("a stranger on the cluster port without the key is not a worker and gets no request", { timeout: 60000 }, async () => {
  await until((a) => nLive(a, "prefill") === 2 && nLive(a, "decode") === 2, "4 workers");
  const a0 = await admin();
  const fp = Buffer.from(a0.model_fingerprint, "hex");
  const hb = Buffer.concat([u32(0), u32(0), u64(0), u64(0), u32(64), u32(64), u8(0), ...Array(9).fill(u64(0))]);
  const rogues = [];
  for (const [i, version] of [[0, 1], [1, 3]]) {
    const r = peer(regPort, Buffer.from("no key"), "W");
    await new Promise((ok) => setTimeout(ok, 50));
    const hello = frame(1, 0, helloPayload(2, fp, `rogue${i}`), version);
    hello.writeUInt32LE(1, 8);   // REGISTER
    r.sendRaw(Buffer.concat([hello, frame(2, 0, hb, version), frame(2, 0, hb, version)]));
    rogues.push(r);
  }
  const wrong = peer(regPort, crypto.randomBytes(32), "W");
  assert.equal(await wrong.handshake(), false, "a wrong key is refused");
  wrong.send(1, 0, helloPayload(2, fp, "rogue2"), 1);
  rogues.push(wrong);
  const runs = all();
  for (const r of rogues) await r.closed;
  sameAsServe(await runs, "with strangers around");
  const a = await admin();
  assert.ok(!a.workers.some((w) => /^rogue/.test(w.name)), JSON.stringify(a.workers));
  assert.ok(a.refused_handshakes >= a0.refused_handshakes + 3, JSON.stringify(a));
  for (const r of rogues) assert.ok(!r.frames.some((f) => f.type === 3 || f.type === 5), "a stranger got a job");
  // the key on the same port: listed
  const ok = peer(regPort, clusterKey(), "W");
  assert.ok(await ok.handshake());
  ok.send(1, 0, helloPayload(2, fp, "friend"), 1);
  await until((x) => x.workers.some((w) => w.name === "friend" && w.up), "friend in");
  ok.end();
  await until((x) => !x.workers.some((w) => w.name === "friend" && w.up), "friend out");
});

// Workers are told apart by name: two started without --name get names of their own (their
// host and port), not both "worker"; /admin/drain drains exactly the one it names and
// /admin/undrain gives it work again. A worker refused by the gateway (a wrong key; a name
// another live worker has) logs its refusal only, never "registered".
test("worker names are unique, a drained worker is undrained, a refused worker logs only its refusal", { timeout: 60000 }, async () => {
  await until((a) => nLive(a, "prefill") === 2 && nLive(a, "decode") === 2, "4 workers");
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "tm-cluster-names-"));
  const extra = [];
  try {
    const spawnW = (args, tag) => {
      const p = spawnLogged(["worker", "--role", "decode", "-m", model, "--gateway", `127.0.0.1:${regPort}`,
        "--cache", `dir:${store}`, "--threads", "1", ...args], tag);
      extra.push(p);
      return p;
    };
    // a wrong key: the handshake refuses it; it was never registered
    const wrongKey = path.join(dir, "wrong.key");
    fs.writeFileSync(wrongKey, crypto.randomBytes(32).toString("hex") + "\n", { mode: 0o600 });
    const wk = spawnW(["--listen", "127.0.0.1:0", "--cluster-key-file", wrongKey], "wrong-key");
    const wl = await waitLine(wk, /refused/, "the wrong-key worker's refusal");
    assert.doesNotMatch(wl.input, /registered/, "a refused worker says it registered");
    // d1's name: refused by the gateway with the reason; the d1 listed is still the real one
    const dup = spawnW(["--listen", "127.0.0.1:0", "--name", "d1"], "dup-d1");
    const dl = await waitLine(dup, /refused by the gateway[^\n]*\n/, "the duplicate's refusal");
    assert.match(dl.input, /name "d1" is taken by the worker at 127\.0\.0\.1:\d+/);
    assert.doesNotMatch(dl.input, /registered/, "a refused worker says it registered");
    assert.equal((await admin()).workers.filter((w) => w.name === "d1" && w.up).length, 1);
    assert.equal(findW(await admin(), "d1").addr, workers.d1.addr);
    for (const p of [wk, dup]) p.kill("SIGKILL");
    // two without --name: each its own name, both in
    const unnamed = [spawnW(["--listen", "127.0.0.1:0"], "unnamed-1"), spawnW(["--listen", "127.0.0.1:0"], "unnamed-2")];
    const names = [];
    for (const p of unnamed) names.push((await waitLine(p, (log) => /registered with the gateway/.test(log) && /named (\S+)/.exec(log), "unnamed worker"))[1]);
    assert.notEqual(names[0], names[1]);
    assert.ok(!names.includes("worker"), names.join(", "));
    await until((a) => names.every((n) => a.workers.some((w) => w.name === n && w.up && !w.draining)), "both unnamed in");
    // drain one by name: exactly that one; then undrain it
    const res = await fetch(`${gw}/admin/drain?worker=${encodeURIComponent(names[0])}&deadline_ms=1000`, { method: "POST" });
    assert.equal(res.status, 200);
    await until((a) => a.workers.find((w) => w.name === names[0])?.draining, "drained by name");
    let a = await admin();
    assert.deepEqual(a.workers.filter((w) => w.draining).map((w) => w.name), [names[0]]);
    const un = await fetch(`${gw}/admin/undrain?worker=${encodeURIComponent(names[0])}`, { method: "POST" });
    assert.equal(un.status, 200);
    assert.equal((await un.json()).status, "undraining");
    await until((x) => { const w = x.workers.find((y) => y.name === names[0]); return w && w.up && !w.draining; }, "undrained");
    await sleep(300);   // a heartbeat sent before the undrain reached the worker must not drain it again
    a = await admin();
    assert.ok(!a.workers.find((w) => w.name === names[0]).draining, "still undrained");
    assert.equal((await fetch(`${gw}/admin/undrain?worker=nobody`, { method: "POST" })).status, 404);
    for (const p of unnamed) p.kill("SIGKILL");
    await until((x) => !x.workers.some((w) => names.includes(w.name) && w.up), "unnamed out");
  } finally {
    for (const p of extra) if (!exited(p)) p.kill("SIGKILL");
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

// One drain of a fresh gateway over p2 and d2 (--drain-timeout drainS): a stream starts, its
// decode worker d2 is stopped (SIGSTOP) at its first token, the gateway gets SIGTERM, and once it
// says it drains, the function that prepare(g) returned runs; d2 is continued once the gateway
// exited. prepare runs before the signal, so that a log line its function waits for cannot pass
// unseen. That function's result, with the stream's (`got`; { error } where it failed) and the
// gateway's exit.
async function drainRun(tag, drainS, prepare) {
  const d2 = workers.d2.proc;
  const g = await startGateway(["--prefill", workers.p2.addr, "--decode", workers.d2.addr, "--drain-timeout", String(drainS)],
    `${tag}-${drainS}`);
  await until((x) => live(x).length === 2, "static workers", 10000, g.url);
  const draining = waitLine(g.proc, /draining \(up to/, "the gateway's drain");
  const during = prepare(g);
  const exit = new Promise((r) => g.proc.on("exit", (code, signal) => r({ code, signal })));
  let frozen, chunks = 0;
  const froze = new Promise((r) => { frozen = r; });
  // a failure mid-stream is a result here (the tests assert it), caught as it happens
  const s = stream(g.url, PROMPTS[0], MAX, () => { if (++chunks === 1) { d2.kill("SIGSTOP"); frozen(); } })
    .catch((e) => ({ error: String(e) }));
  await froze;
  g.proc.kill("SIGTERM");
  await draining;
  const res = await during();
  const got = await s, ended = await exit;
  d2.kill("SIGCONT");
  return { ...res, got, exit: ended };
}

// SIGTERM drains a gateway as it drains `serve`: a new request gets a 503 in the API's shape while
// a stream already running goes on to its normal end (the same text as serve's); with a short
// --drain-timeout a stream that cannot end in time is cut as incomplete ("length" with fewer
// tokens than asked), never as a normal "stop". The stream is made to be running at the signal:
// its decode worker is stopped (SIGSTOP) at its first token and continued after.
test("SIGTERM on a gateway drains: 503 to new requests, running streams finish (or end incomplete)", { timeout: 60000 }, async () => {
  await until((a) => nLive(a, "prefill") === 2 && nLive(a, "decode") === 2, "4 workers");
  const d2 = workers.d2.proc;
  // during the drain: a new request and /health; cont: the decode worker is continued once the
  // 503 came (else once the gateway exited)
  const run = (drainS, cont) => drainRun("gateway-drain", drainS, (g) => async () => {
    const res = await fetch(g.url + "/v1/completions", { method: "POST", body: JSON.stringify({ prompt: "Hi", max_tokens: 3 }) });
    const body = await res.json();
    const health = await fetch(g.url + "/health");
    const healthBody = await health.json();
    if (cont) d2.kill("SIGCONT");
    return { res, body, health, healthBody };
  });
  try {
    const a = await run(30, true);
    assert.equal(a.got.error, undefined, "the stream failed");
    assert.equal(a.res.status, 503);
    assert.ok(a.res.headers.get("retry-after"), "Retry-After");
    assert.equal(a.body.error.type, "server_error");
    assert.equal(a.health.status, 503);
    assert.equal(a.healthBody.status, "draining");
    assert.equal(a.got.text, ref[0].text, "the running stream finished");
    assert.equal(a.got.finish, ref[0].finish);
    assert.equal(a.got.usage.completion_tokens, ref[0].usage.completion_tokens);
    assert.deepEqual(a.exit, { code: 0, signal: null });
    const b = await run(1, false);
    assert.equal(b.got.error, undefined, "the stream failed");
    assert.equal(b.res.status, 503);
    assert.equal(b.got.finish, "length", "cut as incomplete");
    assert.ok(b.got.usage.completion_tokens < ref[0].usage.completion_tokens, `${b.got.usage.completion_tokens} tokens`);
    assert.ok(ref[0].text.startsWith(b.got.text), "what was sent is the start of the text");
    assert.deepEqual(b.exit, { code: 0, signal: null });
  } finally {
    d2.kill("SIGCONT");
  }
  await until((x) => nLive(x, "decode") === 2, "d2 back", 20000);
});

// A gateway that drains while the only decode worker of a running stream is stopped past the
// heartbeat timeout declares that worker dead and moves the stream back to waiting for a decode
// worker: the drain's deadline, not --wait-timeout, bounds that wait. So the stream resumes when
// the worker is back within the drain (the same text as serve's), or ends as incomplete at the
// drain's deadline ("length" with fewer tokens) when it is not; never as an engine error (a 500
// mid-stream). The worker is stopped at the stream's first token and kept stopped, with explicit
// waits on the gateway's own log, until the gateway said it is out and a reconnect to it failed
// (its handshake ran out of time): by then --wait-timeout (2 s here) has passed for the stream.
test("a gateway draining while its decode worker is stopped past the heartbeat timeout: the stream resumes, or ends incomplete, never as an engine error", { timeout: 90000 }, async () => {
  await until((a) => nLive(a, "prefill") === 2 && nLive(a, "decode") === 2, "4 workers");
  const d2 = workers.d2.proc;
  // back: the decode worker is continued once the gateway gave up one reconnect to it (else
  // once the gateway exited)
  const run = (drainS, back) => drainRun("gateway-drain-stopped", drainS, (g) => {
    const gaveUp = back && waitLine(g.proc, /is out: missed heartbeats[\s\S]*refused/, "d2 out, a reconnect to it refused", 30000);
    return async () => {
      if (!back) return {};
      await gaveUp;
      await sleep(1000);   // the dispatcher looks at the waiting stream right after that refusal
      d2.kill("SIGCONT");
      return {};
    };
  });
  try {
    const a = await run(30, true);
    assert.equal(a.got.error, undefined, "the stream failed");
    assert.equal(a.got.text, ref[0].text, "the stream resumed on the worker once it was back");
    assert.equal(a.got.finish, ref[0].finish);
    assert.equal(a.got.usage.completion_tokens, ref[0].usage.completion_tokens);
    assert.deepEqual(a.exit, { code: 0, signal: null });
    // 10 s: past the moment the stream's wait for a decode worker passes --wait-timeout
    const b = await run(10, false);
    assert.equal(b.got.error, undefined, "the stream failed");
    assert.equal(b.got.finish, "length", "cut as incomplete");
    assert.ok(b.got.usage.completion_tokens < ref[0].usage.completion_tokens, `${b.got.usage.completion_tokens} tokens`);
    assert.ok(ref[0].text.startsWith(b.got.text), "what was sent is the start of the text");
    assert.deepEqual(b.exit, { code: 0, signal: null });
  } finally {
    d2.kill("SIGCONT");
  }
  await until((x) => nLive(x, "decode") === 2, "d2 back", 20000);
});

// A stream whose only decode worker is stopped past the heartbeat timeout, with no other to
// move to within --wait-timeout, ends with an error event saying no worker was available (a 503
// server_error, code no_worker_available; Anthropic's overloaded_error), not "failed in the
// engine": the OpenAI shape on /v1/completions, the Anthropic one on /v1/messages.
test("a stream left with no worker past --wait-timeout ends with a no-worker error in each API's shape", { timeout: 60000 }, async () => {
  await until((a) => nLive(a, "prefill") === 2 && nLive(a, "decode") === 2, "4 workers");
  const d2 = workers.d2.proc;
  const g = await startGateway(["--prefill", workers.p2.addr, "--decode", workers.d2.addr], "gateway-no-worker");
  await until((x) => live(x).length === 2, "static workers", 10000, g.url);
  // the raw SSE text of a stream; onData at each chunk received
  const sse = async (route, body, onData) => {
    const res = await fetch(g.url + route, { method: "POST", headers: { "content-type": "application/json", "anthropic-version": "2023-06-01" },
      body: JSON.stringify({ ...body, stream: true }) });
    assert.equal(res.status, 200);
    let text = "";
    for await (const c of res.body) { text += Buffer.from(c).toString(); onData?.(text); }
    return text;
  };
  const errorOf = (text) => text.split("\n").filter((l) => l.startsWith("data: ") && l.includes('"error"'))
    .map((l) => JSON.parse(l.slice(6))).find((j) => j.error);
  try {
    let frozen, stopped = false;
    const froze = new Promise((r) => { frozen = r; });
    // d2 is stopped at the stream's first token
    const oa = sse("/v1/completions", { prompt: PROMPTS[0], max_tokens: MAX, temperature: 0 },
      (t) => { if (!stopped && /"text":"[^"]/.test(t)) { stopped = true; d2.kill("SIGSTOP"); frozen(); } });
    await froze;
    const an = sse("/v1/messages", { model: "stories260K", max_tokens: MAX, messages: [{ role: "user", content: PROMPTS[1] }] });
    const [o, a] = await Promise.all([oa, an]);
    const oe = errorOf(o), ae = errorOf(a);
    assert.ok(oe, o);
    assert.equal(oe.error.type, "server_error");
    assert.equal(oe.error.code, "no_worker_available");
    assert.match(oe.error.message, /No worker was available/);
    assert.doesNotMatch(o, /failed in the engine/);
    assert.match(a, /event: error\n/);
    assert.ok(ae, a);
    assert.equal(ae.type, "error");
    assert.equal(ae.error.type, "overloaded_error");
    assert.match(ae.error.message, /No worker was available/);
  } finally {
    d2.kill("SIGCONT");
    g.proc.kill("SIGTERM");
    await waitExit(g.proc, 10000);
  }
  await until((x) => nLive(x, "decode") === 2, "d2 back", 20000);
});

// A key file others can read (or an empty one, or a directory) is not a secret: the gateway and
// the worker say so and refuse to start (status 2); a private one is used (the path is logged).
test("a cluster key file that is not private, or empty, is refused at start", { timeout: 60000 }, async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "tm-cluster-key-"));
  try {
    const key = path.join(dir, "cluster.key"), empty = path.join(dir, "empty.key");
    fs.writeFileSync(key, crypto.randomBytes(32).toString("hex") + "\n", { mode: 0o644 });
    fs.chmodSync(key, 0o644);
    fs.writeFileSync(empty, "\n", { mode: 0o600 });
    const run = (args) => new Promise((resolve) => {
      const p = spawn(bin, args, { stdio: ["ignore", "ignore", "pipe"], env: { ...process.env, XDG_CACHE_HOME: dir } });
      let err = "";
      p.stderr.on("data", (d) => { err += d; });
      const t = setTimeout(() => p.kill("SIGKILL"), 20000);
      p.on("close", (code) => { clearTimeout(t); resolve({ code, err }); });   // stderr read to its end
    });
    const gwArgs = (k) => ["gateway", "-m", model, "--listen", "127.0.0.1:0", "--cluster-key-file", k];
    const wArgs = (k) => ["worker", "--role", "decode", "-m", model, "--listen", "127.0.0.1:0", "--cache", "off", "--cluster-key-file", k];
    for (const args of [gwArgs(key), wArgs(key)]) {
      const r = await run(args);
      assert.equal(r.code, 2, r.err);
      assert.match(r.err, /cluster\.key: readable or writable by other users/);
    }
    for (const args of [gwArgs(empty), wArgs(empty), gwArgs(dir)]) {
      const r = await run(args);
      assert.equal(r.code, 2, r.err);
      assert.match(r.err, /is empty|not a regular file/);
    }
    fs.chmodSync(key, 0o600);
    const p = spawnLogged(gwArgs(key), "keyed-gateway");
    const m = await waitLine(p, /cluster key (\S+)[\s\S]*listening on http/, "keyed gateway");
    assert.equal(m[1], key);
    p.kill("SIGTERM");
    await waitExit(p, 10000);
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

// The reasoning budget travels through the cluster protocol (PREFILL / DECODE flag THINK): on a
// DeepSeek-R1-templated generated model (its prompt opens the think block; random weights think
// until the token limit, see apis.test.mjs), chat's thinking.budget_tokens through a gateway gives
// what `tokenmill serve` gives: the block closed after budget_tokens, then an answer. And a
// stream whose decode worker is killed inside the think block resumes on the other with the
// forced end at the same token (the worker replays the reasoning count from the tokens streamed).
test("thinking.budget_tokens through the gateway == tokenmill serve, also across a dead decode worker", { timeout: 120000 }, async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "tm-cluster-ds-"));
  try {
    const vocabDs = path.join(dir, "vocab-ds.gguf"), modelDs = path.join(dir, "ds.gguf");
    augment("deepseek3", vocabDs);
    execFileSync(bin, ["mkmodel", "--arch", "llama", "--preset", "tiny", "--vocab", vocabDs, "--type", "q8_0",
      "--seed", "5", "-o", modelDs], { stdio: "pipe" });
    const CTX = ["--ctx", "2048"];
    const msgs = [{ role: "user", content: "hi" }];
    const small = { model: "ds", messages: msgs, max_tokens: 30, temperature: 0, thinking: { type: "enabled", budget_tokens: 5 } };
    // long enough that the kill below lands well inside the think block
    const big = { model: "ds", messages: msgs, max_tokens: 260, temperature: 0, thinking: { type: "enabled", budget_tokens: 200 } };
    const streamChat = async (c, body, onChunk) => {
      const s = await c.chat.completions.create({ ...body, stream: true, stream_options: { include_usage: true } });
      let reasoning = "", content = "", finish = null, usage = null;
      for await (const ch of s) {
        if (ch.usage) usage = ch.usage;
        for (const x of ch.choices || []) {
          if (x.delta?.reasoning_content) { reasoning += x.delta.reasoning_content; onChunk?.(); }
          if (x.delta?.content) { content += x.delta.content; onChunk?.(); }
          if (x.finish_reason) finish = x.finish_reason;
        }
      }
      return { reasoning, content, finish, usage };
    };

    const srv = await startServer(modelDs, [...CTX, "--template", "deepseek-r1"]);
    const sc = new OpenAI({ apiKey: "x", baseURL: srv.url + "/v1", maxRetries: 0 });
    const refSmall = await sc.chat.completions.create(small);
    const refBig = await streamChat(sc, big);
    await stopServers();
    assert.equal(refSmall.usage.completion_tokens_details.reasoning_tokens, 6, "serve: 5 reasoning tokens + </think>");
    assert.ok(refSmall.choices[0].message.content.length > 0);
    assert.equal(refBig.usage.completion_tokens_details.reasoning_tokens, 201, "serve: 200 + </think>");
    assert.ok(refBig.content.length > 0);

    const cache = ["--cache", `dir:${path.join(dir, "store")}`];
    const startStatic = async (role, name) => {
      const p = spawnLogged(["worker", "--role", role, "-m", modelDs, "--listen", "127.0.0.1:0", ...cache, ...CTX,
        "--threads", "1", "--name", name], name);
      const m = await waitLine(p, /listening on port (\d+)/, `worker ${name}`);
      p.stderr.resume();
      return { proc: p, addr: `127.0.0.1:${m[1]}` };
    };
    const wp = await startStatic("prefill", "ds-p"), wd = [await startStatic("decode", "ds-d1"), await startStatic("decode", "ds-d2")];
    const p = spawnLogged(["gateway", "-m", modelDs, "--listen", "127.0.0.1:0", ...cache, ...CTX, "--template", "deepseek-r1",
      "--prefill", wp.addr, "--decode", wd.map((w) => w.addr).join(",")], "ds-gateway");
    const url = `http://127.0.0.1:${(await waitLine(p, /listening on http:\/\/[^:]+:(\d+)/, "ds gateway"))[1]}`;
    p.stderr.resume();
    await until((a) => live(a).length === 3, "ds workers", 10000, url);
    const gc = new OpenAI({ apiKey: "x", baseURL: url + "/v1", maxRetries: 0, timeout: 60000 });

    const got = await gc.chat.completions.create(small);
    assert.equal(got.usage.completion_tokens_details.reasoning_tokens, 6, "gateway: 5 reasoning tokens + </think>");
    assert.equal(got.choices[0].message.reasoning_content, refSmall.choices[0].message.reasoning_content);
    assert.equal(got.choices[0].message.content, refSmall.choices[0].message.content);
    assert.equal(got.usage.completion_tokens, refSmall.usage.completion_tokens);

    // kill -9 of the decode worker after 10 streamed tokens (of 200 reasoning ones): both are
    // stopped at that instant, the one running the stream is killed, the other resumes it
    const before = (await admin(url)).resumes;
    let n = 0, frozen;
    const froze = new Promise((r) => { frozen = r; });
    const run = streamChat(gc, big, () => { if (++n === 10) { for (const w of wd) w.proc.kill("SIGSTOP"); frozen(); } });
    await froze;
    await sleep(300);
    const a = await admin(url);
    const running = (w) => a.workers.find((x) => x.addr === w.addr).running;
    const [victim, other] = running(wd[0]) >= running(wd[1]) ? wd : [wd[1], wd[0]];
    assert.equal(running(victim), 1, "the stream runs on the victim");
    victim.proc.kill("SIGKILL");
    other.proc.kill("SIGCONT");
    const res = await run;
    assert.ok((await admin(url)).resumes >= before + 1, "the stream resumed");
    assert.equal(res.usage.completion_tokens_details.reasoning_tokens, 201, "gateway, resumed: 200 + </think>");
    assert.equal(res.reasoning, refBig.reasoning);
    assert.equal(res.content, refBig.content);
    assert.equal(res.finish, refBig.finish);
    assert.equal(res.usage.completion_tokens, refBig.usage.completion_tokens);
    p.kill("SIGTERM");
    await waitExit(p, 10000);
    for (const w of [wp, other]) w.proc.kill("SIGKILL");
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

// A worker that cannot compile a request's grammar (a stand-in speaking the protocol as
// docs/protocol.md writes it, which answers every job ERROR ARG as a worker of another build
// would): the job carried the grammar's source (flag GRAMMAR), and the client gets a 400 in its
// API's shape, not a 500.
test("a worker's refusal of a request's grammar is a 400 in the client's API shape", { timeout: 60000 }, async () => {
  const g = await startGateway(["--register", "127.0.0.1:0"], "gateway-refusal");
  const port = Number(/register at [^:\s]+:(\d+)/.exec(g.log)[1]);
  const fp = Buffer.from((await admin(g.url)).model_fingerprint, "hex");
  const w = peer(port, clusterKey(), "W");
  assert.ok(await w.handshake(), "the stand-in holds the key");
  w.send(1, 0, helloPayload(3, fp, "nocompile"), 1);   // mixed, REGISTER
  const hb = Buffer.concat([u32(0), u32(0), u64(0), u64(0), u32(64), u32(64), u8(0), ...Array(9).fill(u64(0))]);
  const beat = setInterval(() => w.send(2, 0, hb), 300);
  try {
    await until((x) => x.workers.some((v) => v.name === "nocompile" && v.up), "stand-in in", 10000, g.url);
    const re = "[a-c]{2,6}";
    const jobs = [];
    const refuse = (async () => {
      for (let k = 0; k < 4; k++) {
        const f = await w.next((x) => x.type === 3 || x.type === 5, 20000);
        if (!f) return;
        jobs.push(f);
        w.send(10, f.id, Buffer.concat([u32(6), str("grammar: not compiled here")]));   // ERROR ARG
      }
    })();
    const res = await fetch(`${g.url}/v1/chat/completions`, {
      method: "POST", headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: "stories260K", messages: [{ role: "user", content: "x" }], max_tokens: 8, guided_regex: re }),
    });
    const body = await res.json();
    assert.equal(res.status, 400, JSON.stringify(body));
    assert.equal(body.error?.type, "invalid_request_error", JSON.stringify(body));
    assert.match(body.error.message, /refused it \(its format did not compile there/);
    assert.equal(jobs.length, 1, "one PREFILL, not retried elsewhere");
    assert.ok(jobs[0].payload.includes(Buffer.from(re)), "the PREFILL carried the regex");
    w.end();
    await refuse;
  } finally {
    clearInterval(beat);
    g.proc.kill("SIGTERM");
    await waitExit(g.proc, 10000);
  }
});

// latent attention (deepseek2) through the cluster: the KV of a position is one latent row
// (V is K). A prompt's full 128-token blocks reach the decode worker through the shared store,
// the rest as the handoff's latent tail (KV_LATENT frames); the decode worker installs both, so
// it brings in every prompt position (its handoff counters on the gateway's /metrics say so:
// a tail it could not use would be recomputed and not counted), and the greedy text equals
// `tokenmill serve`'s.
test("a deepseek2 (latent KV) model through gateway + prefill + decode workers == tokenmill serve", { timeout: 120000 }, async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "tm-cluster-mla-"));
  try {
    const modelMla = path.join(dir, "mla.gguf");
    execFileSync(bin, ["mkmodel", "--arch", "deepseek2", "--preset", "tiny", "--q-lora", "0", "--kv-lora", "64",
      "--nope-dim", "16", "--rope-dim", "16", "--v-dim", "16", "--experts", "4", "--experts-used", "2", "--expert-ffn", "64",
      "--shared-experts", "1", "--dense-layers", "1", "--type", "q8_0", "--seed", "9", "-o", modelMla], { stdio: "pipe" });
    const CTX = ["--ctx", "1024"];
    const long = "the quick brown fox jumps over the lazy dog and runs away ".repeat(14);
    const prompts = [long + "once", long + "twice", "a short prompt", "another short one here"];
    const ask = async (c) => Promise.all(prompts.map((prompt) =>
      c.completions.create({ model: "mla", prompt, max_tokens: 12, temperature: 0 })));

    const srv = await startServer(modelMla, [...CTX, "--model-name", "mla", "--cache", "off"]);
    const ref = await ask(new OpenAI({ apiKey: "x", baseURL: srv.url + "/v1", maxRetries: 0 }));
    await stopServers();
    assert.ok(ref[0].usage.prompt_tokens > 128 && ref[0].usage.prompt_tokens % 128 !== 0, `${ref[0].usage.prompt_tokens} tokens`);

    const cache = ["--cache", `dir:${path.join(dir, "store")}`];
    const startStatic = async (role, name) => {
      const p = spawnLogged(["worker", "--role", role, "-m", modelMla, "--listen", "127.0.0.1:0", ...cache, ...CTX,
        "--threads", "1", "--name", name], name);
      const m = await waitLine(p, /listening on port (\d+)/, `worker ${name}`);
      p.stderr.resume();
      return { proc: p, addr: `127.0.0.1:${m[1]}`, log: m.input };
    };
    const wp = await startStatic("prefill", "mla-p"), wd = await startStatic("decode", "mla-d");
    assert.match(wd.log, /KV f16, \d+ blocks of 40\.0 KiB per 128 tokens, latent: V is K/, "2 layers x (64 + 16) x f16 x 128");
    const p = spawnLogged(["gateway", "-m", modelMla, "--listen", "127.0.0.1:0", ...cache, ...CTX, "--model-name", "mla",
      "--prefill", wp.addr, "--decode", wd.addr], "mla-gateway");
    const url = `http://127.0.0.1:${(await waitLine(p, /listening on http:\/\/[^:]+:(\d+)/, "mla gateway"))[1]}`;
    p.stderr.resume();
    await until((a) => live(a).length === 2, "mla workers", 10000, url);

    const got = await ask(new OpenAI({ apiKey: "x", baseURL: url + "/v1", maxRetries: 0, timeout: 60000 }));
    got.forEach((r, i) => {
      assert.equal(r.choices[0].text, ref[i].choices[0].text, `prompt ${i}`);
      assert.equal(r.usage.completion_tokens, ref[i].usage.completion_tokens, `prompt ${i} tokens`);
    });
    // every prompt position came in: full blocks from the store, the rest as the latent tail
    const want = ref.reduce((n, r) => n + r.usage.prompt_tokens, 0);
    const inTokens = async () => {
      const m = /^tokenmill_worker_handoff_tokens_total\{worker="[^"]+",role="decode",side="receive"\} (\d+)$/m
        .exec(await (await fetch(url + "/metrics")).text());
      return m ? Number(m[1]) : -1;
    };
    const end = Date.now() + 10000;
    let n;
    while ((n = await inTokens()) !== want && Date.now() < end) await sleep(50);
    assert.equal(n, want, "positions brought in by the decode worker");
    p.kill("SIGTERM");
    await waitExit(p, 10000);
    for (const w of [wp, wd]) w.proc.kill("SIGKILL");
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
