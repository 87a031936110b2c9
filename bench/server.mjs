// server: a `tokenmill serve` process for the benchmarks that start their own, and its
// unlabelled /metrics lines (the server's own figures: time to first token, store counters).
//
//   const p = await startServe(bin, args)   args after "serve"; resolves once it listens,
//                                           with p.port (run it with --port 0)
//   await stopServe(p)                      SIGTERM, resolves on exit
//   await serverMetrics(port)               { name: number }, e.g.
//                                           .tokenmill_time_to_first_token_seconds_sum
//   storeRunOptions(prompt, promptHelp)     bench/args entries of the benchmarks that prefill
//                                           a prompt into a store, then restart servers on it
import { spawn } from "node:child_process";
import http from "node:http";
import path from "node:path";

export function startServe(bin, args) {
  return new Promise((resolve, reject) => {
    const p = spawn(bin, ["serve", ...args], { stdio: ["ignore", "ignore", "pipe"] });
    let err = "";
    p.stderr.on("data", (d) => {
      err += d;
      const m = err.match(/listening on http:\/\/[^:]+:(\d+)/);
      if (m && !p.port) { p.port = Number(m[1]); resolve(p); }
    });
    p.on("exit", (c) => { if (!p.port) reject(new Error(`serve exited ${c}: ${err}`)); });
  });
}

export const stopServe = (p) => new Promise((r) => { p.on("exit", r); p.kill("SIGTERM"); });

export function serverMetrics(port) {
  return new Promise((resolve, reject) => {
    http.get({ port, path: "/metrics" }, (res) => {
      let t = "";
      res.on("data", (d) => (t += d));
      res.on("end", () => {
        const m = {};
        for (const l of t.split("\n")) {
          const x = l.match(/^(tokenmill_\w+) (\S+)$/);
          if (x) m[x[1]] = Number(x[2]);
        }
        resolve(m);
      });
    }).on("error", reject);
  });
}

// The options bench/cache_load and bench/restart share: the model, the builds alternated run by
// run, the reps, the prompt's length (default `prompt`), the server's KV pool and threads, and
// the block store's directory.
export function storeRunOptions(prompt, promptHelp) {
  return [
    { name: "-m", key: "model", arg: "MODEL", required: true, help: "the GGUF file" },
    { name: "--bin", key: "bins", kind: "list", default: [path.resolve(import.meta.dirname, "../build/tokenmill")],
      help: "builds to alternate run by run" },
    { name: "--reps", kind: "number", default: 5, help: "runs of each build" },
    { name: "--prompt", kind: "number", default: prompt, help: promptHelp },
    { name: "--kv-mib", kind: "number", default: 512, help: "KV pool, MiB" },
    { name: "--threads", kind: "number", default: 2, help: "threads" },
    { name: "--store", arg: "DIR", help: "the block store's directory (default: a fresh temporary one)" },
  ];
}
