// server: starting and stopping real `tokenmill serve` processes for the e2e tests. Each
// server listens on a free port (--port 0, read back from its "listening on" line) and, unless
// the caller names a block store (--cache / --cache-dir), gets a fresh empty one in a temporary
// directory, so that every run starts cold and nothing leaks into the user's cache directory.
// stopServers() sends SIGTERM (a clean shutdown is part of what is tested), SIGKILL if a server
// hangs, and removes the temporary stores. startCluster does the same for a gateway and its
// workers. assertSameStores checks that two runs wrote the same blocks.
import assert from "node:assert/strict";
import { execFileSync, spawn } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";

export const root = path.resolve(import.meta.dirname, "../..");
export const bin = process.env.TM_BIN || path.join(root, "build/tokenmill");
const procs = [];
const dirs = [];

// Resolves once the server said "ready" (its weights resident), or with { ready: false } as
// soon as it listens (env: extra environment variables).
export async function startServer(model, args = [], { timeoutMs = 30000, ready = true, env } = {}) {
  const extra = [];
  if (!args.includes("--cache") && !args.includes("--cache-dir")) {
    const d = fs.mkdtempSync(path.join(os.tmpdir(), "tm-store-"));
    dirs.push(d);
    extra.push("--cache-dir", d);
  }
  const proc = spawn(bin, ["serve", "-m", model, "--port", "0", "--threads", "1", ...extra, ...args],
    { stdio: ["ignore", "ignore", "pipe"], env: env ? { ...process.env, ...env } : process.env });
  procs.push(proc);
  let log = "";
  const port = await new Promise((resolve, reject) => {
    const t = setTimeout(() => reject(new Error("server did not start: " + log)), timeoutMs);
    proc.stderr.on("data", (d) => {
      log += d;
      const m = /listening on http:\/\/[^:]+:(\d+)/.exec(log);
      if (m && (!ready || /: ready\n/.test(log))) { clearTimeout(t); resolve(Number(m[1])); }
    });
    proc.on("exit", (code) => { clearTimeout(t); reject(new Error(`server exited ${code}: ${log}`)); });
  });
  proc.removeAllListeners("exit");
  if (process.env.TM_SERVE_LOG) proc.stderr.on("data", (d) => fs.appendFileSync(process.env.TM_SERVE_LOG, d));
  else proc.stderr.resume();
  return { proc, port, url: `http://127.0.0.1:${port}`, log };
}

export async function stopServers() {
  await Promise.all(procs.filter((p) => p.exitCode === null && p.signalCode === null).map((p) => new Promise((resolve) => {
    const t = setTimeout(() => p.kill("SIGKILL"), 5000);
    p.on("exit", () => { clearTimeout(t); resolve(); });
    p.kill("SIGTERM");
  })));
  for (const d of dirs.splice(0)) fs.rmSync(d, { recursive: true, force: true });
}

// The blocks a block store directory holds, as { "KEY.EXT": base64 of the file } (for tests
// that compare the stores of two runs).
export function storeBlocks(d) {
  const out = {};
  const walk = (p) => {
    for (const e of fs.readdirSync(p, { withFileTypes: true })) {
      const f = path.join(p, e.name);
      if (e.isDirectory()) walk(f);
      else if (/^[0-9a-f]{64}\./.test(e.name)) out[e.name] = fs.readFileSync(f).toString("base64");
    }
  };
  walk(d);
  return out;
}

// Stops the servers with SIGTERM (a clean stop writes what is queued), then asserts that the
// block store directories dirs[0] and dirs[1] hold the same blocks, key for key and byte for
// byte, and at least minBlocks of them: for tests whose two runs differ only in how they
// compute (speculation, overlap) and so must store alike.
export async function assertSameStores(servers, dirs, minBlocks = 1) {
  await Promise.all(servers.map((S) => new Promise((resolve) => {
    if (S.proc.exitCode !== null || S.proc.signalCode !== null) return resolve();
    S.proc.on("exit", resolve);
    S.proc.kill("SIGTERM");
  })));
  const [a, b] = dirs.map(storeBlocks);
  assert.ok(Object.keys(a).length >= minBlocks, `${Object.keys(a).length} blocks stored, ${minBlocks} expected`);
  assert.deepEqual(Object.keys(b).sort(), Object.keys(a).sort(), "block keys differ");
  for (const k of Object.keys(a)) assert.equal(b[k], a[k], `block ${k} differs`);
}

// POSTs body to url's /v1/completions and returns the answer's JSON, asserting a 200 (with the
// answer as the message when it is not).
export async function postCompletion(url, body) {
  const res = await fetch(`${url}/v1/completions`, { method: "POST", headers: { "content-type": "application/json" },
    body: JSON.stringify(body) });
  const j = await res.json();
  assert.equal(res.status, 200, JSON.stringify(j));
  return j;
}

// A greedy 8-token completion of prompt (token ids) by model on srv: { text, cached } (the
// prompt tokens served from cache), asserting that the whole prompt was read.
export async function completeCached(srv, model, prompt) {
  const j = await postCompletion(srv.url, { model, prompt, max_tokens: 8, temperature: 0 });
  assert.equal(j.usage.prompt_tokens, prompt.length);
  return { text: j.choices[0].text, cached: j.usage.prompt_tokens_details.cached_tokens };
}

// The prefix cache end to end: a greedy completion of prompt computed cold, again with its
// full blocks attached from RAM, then, after a restart (start() again), from the block store,
// the same text each time. start() starts the server (its store kept across the restart);
// complete(srv) is completeCached's { text, cached }. Returns the cold answer; the servers are
// stopped.
export async function assertCachedAndRestored(start, complete, minCached = 256) {
  let srv = await start();
  const first = await complete(srv);
  assert.equal(first.cached, 0);
  const again = await complete(srv);
  assert.ok(again.cached >= minCached, `two full blocks attached (${again.cached} cached)`);
  assert.equal(again.text, first.text);
  await stopServers();
  srv = await start();
  const restarted = await complete(srv);
  assert.ok(restarted.cached >= minCached, `the blocks come back from the store (${restarted.cached} cached)`);
  assert.equal(restarted.text, first.text);
  await stopServers();
  return first;
}

// Two tiny random models of different families and vocabularies in dir, as the multi-model
// tests serve them: a.gguf (qwen3 on Qwen2's vocabulary, seed 5) and b.gguf (llama on Llama
// 3's, seed 6, its own width and heads). Returns [A, B], their paths.
export function twoTinyModels(dir) {
  const V = path.join(root, "tests/data/llama.cpp/models");
  const A = path.join(dir, "a.gguf"), B = path.join(dir, "b.gguf");
  execFileSync(bin, ["mkmodel", "--arch", "qwen3", "--preset", "tiny", "--vocab", path.join(V, "ggml-vocab-qwen2.gguf"),
    "--type", "q8_0", "--seed", "5", "-o", A], { stdio: "pipe" });
  execFileSync(bin, ["mkmodel", "--arch", "llama", "--preset", "tiny", "--vocab", path.join(V, "ggml-vocab-llama-bpe.gguf"),
    "--type", "q8_0", "--seed", "6", "--dim", "96", "--heads", "3", "--kv-heads", "1", "-o", B], { stdio: "pipe" });
  return [A, B];
}

// /metrics as { "name{labels}": value } (key: the API key, when the server has keys).
export async function fetchMetrics(url, key) {
  const headers = key ? { authorization: `Bearer ${key}` } : {};
  const text = await (await fetch(`${url}/metrics`, { headers })).text();
  const m = {};
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const i = line.lastIndexOf(" ");
    m[line.slice(0, i)] = Number(line.slice(i + 1));
  }
  return m;
}

// Spawns `tokenmill args...` (tracked: stopServers stops it) and waits for a stderr line
// matching re; resolves to the match.
function spawnUntil(args, re, env, what, timeoutMs) {
  const proc = spawn(bin, args, { stdio: ["ignore", "ignore", "pipe"], env });
  procs.push(proc);
  let log = "";
  return new Promise((resolve, reject) => {
    const t = setTimeout(() => reject(new Error(`${what} did not start: ${log}`)), timeoutMs);
    const on = (d) => {
      log += d;
      const m = re.exec(log);
      if (!m) return;
      clearTimeout(t);
      proc.removeAllListeners("exit");
      proc.stderr.removeListener("data", on);
      if (process.env.TM_SERVE_LOG) proc.stderr.on("data", (x) => fs.appendFileSync(process.env.TM_SERVE_LOG, `[${what}] ${x}`));
      else proc.stderr.resume();
      resolve(m);
    };
    proc.stderr.on("data", on);
    proc.on("exit", (code) => { clearTimeout(t); reject(new Error(`${what} exited ${code}: ${log}`)); });
  });
}

// A cluster on loopback: one `tokenmill worker` per entry of roles ("prefill", "decode",
// "mixed"), then a `tokenmill gateway` that connects to them (--prefill / --decode; a mixed
// worker is named as a prefill one and says its role in HELLO), all on one fresh block store
// and one cluster key (a temporary XDG_CACHE_HOME, so nothing reaches the user's cache dir).
// Resolves once the gateway lists every worker up, to { url, register (the --register address
// when given), env (the cluster's, its key) }; stopServers stops them all. Several models:
// model is then the gateway's list of -m values (["a=A.gguf", "b=B.gguf"]) and workerModels
// the -m of each worker, in the order of roles; perWorkerArgs, options of each worker after
// workerArgs, in that order too.
export async function startCluster(model, roles = ["prefill", "decode"], { gatewayArgs = [], workerArgs = [], workerModels, perWorkerArgs = [], timeoutMs = 30000 } = {}) {
  const d = fs.mkdtempSync(path.join(os.tmpdir(), "tm-cluster-"));
  dirs.push(d);
  const env = { ...process.env, XDG_CACHE_HOME: path.join(d, "xdg") };
  const cache = `dir:${path.join(d, "store")}`;
  const addrs = { prefill: [], decode: [] };
  for (const [i, role] of roles.entries()) {   // one after another: the first makes the key
    const m = await spawnUntil(["worker", "--role", role, "-m", workerModels ? workerModels[i] : model, "--listen", "127.0.0.1:0", "--cache", cache,
      "--threads", "1", "--name", `${role}${i}`, ...workerArgs, ...(perWorkerArgs[i] ?? [])], /listening on port (\d+)/, env, `worker ${role}${i}`, timeoutMs);
    addrs[role === "decode" ? "decode" : "prefill"].push(`127.0.0.1:${m[1]}`);
  }
  const lists = [];
  for (const r of ["prefill", "decode"]) if (addrs[r].length) lists.push(`--${r}`, addrs[r].join(","));
  const ms = (Array.isArray(model) ? model : [model]).flatMap((x) => ["-m", x]);
  const m = await spawnUntil(["gateway", ...ms, "--listen", "127.0.0.1:0", "--cache", cache, ...lists, ...gatewayArgs],
    /(?:workers register at ([\d.]+:\d+)\n[^]*)?listening on http:\/\/[^:]+:(\d+)/, env, "gateway", timeoutMs);
  const url = `http://127.0.0.1:${m[2]}`;
  for (let k = 0; k < timeoutMs / 20; k++) {
    const a = await (await fetch(`${url}/admin/workers`)).json();
    if (a.workers.filter((w) => w.up).length === roles.length) return { url, register: m[1], env };
    await new Promise((r) => setTimeout(r, 20));
  }
  throw new Error(`the gateway ${url} did not list ${roles.length} workers up`);
}
