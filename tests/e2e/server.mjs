// server: starting and stopping real `tokenmill serve` processes for the e2e tests. Each
// server listens on a free port (--port 0, read back from its "listening on" line) and, unless
// the caller names a block store (--cache / --cache-dir), gets a fresh empty one in a temporary
// directory, so that every run starts cold and nothing leaks into the user's cache directory.
// stopServers() sends SIGTERM (a clean shutdown is part of what is tested), SIGKILL if a server
// hangs, and removes the temporary stores.
import { spawn } from "node:child_process";
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
