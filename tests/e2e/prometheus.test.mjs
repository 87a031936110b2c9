// prometheus: a real Prometheus (Debian's `prometheus`) scrapes a running `tokenmill serve`
// every second with deploy/prometheus/tokenmill.rules.yml loaded; requests are sent once it
// scrapes (so its first samples are the counters' zeros); the test reads back from
// Prometheus' own HTTP API the counters (equal to /metrics, the load being over) and the
// recorded cache-hit ratio of the six answers (equal to the counters' ratio), and
// checks that the Grafana dashboard only plots series the rules record. Everything on 127.0.0.1.
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { spawn, execFileSync } from "node:child_process";
import fs from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import OpenAI from "openai";
import { root, bin, startServer, stopServers, fetchMetrics } from "./server.mjs";

after(stopServers);
const promBin = process.env.TM_PROMETHEUS || "/usr/bin/prometheus";
const rules = path.join(root, "deploy/prometheus/tokenmill.rules.yml");
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function freePort() {
  const s = net.createServer();
  await new Promise((r) => s.listen(0, "127.0.0.1", r));
  const { port } = s.address();
  await new Promise((r) => s.close(r));
  return port;
}

const metrics = (url) => fetchMetrics(url);

test("the dashboard plots only recorded series", () => {
  const recorded = new Set([...fs.readFileSync(rules, "utf8").matchAll(/- record: (\S+)/g)].map((m) => m[1]));
  const dash = JSON.parse(fs.readFileSync(path.join(root, "deploy/grafana/tokenmill.json"), "utf8"));
  assert.ok(dash.panels.length >= 6);
  for (const p of dash.panels)
    for (const t of p.targets)
      for (const name of t.expr.split(/\s+or\s+/)) assert.ok(recorded.has(name.trim()), `${p.title}: ${name}`);
});

test("Prometheus scrapes serve with the six answers' rules and answers from its API", { skip: !fs.existsSync(promBin) && "no prometheus (scripts/deps.sh installs it)" }, async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "tm-prom-"));
  const model = path.join(dir, "q3.gguf");
  execFileSync(bin, ["mkmodel", "--arch", "qwen3", "--preset", "tiny", "--type", "f16", "--seed", "5", "-o", model], { stdio: "pipe" });
  const S = await startServer(model, ["--model-name", "q3", "--ctx", "2048"]);
  const port = await freePort();
  fs.writeFileSync(path.join(dir, "prometheus.yml"), [
    "global:", "  scrape_interval: 1s", "  evaluation_interval: 1s",
    `rule_files: ["${rules}"]`,
    "scrape_configs:", "  - job_name: tokenmill", "    static_configs:", `      - targets: ["127.0.0.1:${S.port}"]`, ""].join("\n"));
  let log = "";
  const prom = spawn(promBin, [`--config.file=${path.join(dir, "prometheus.yml")}`, `--storage.tsdb.path=${path.join(dir, "data")}`,
                               `--web.listen-address=127.0.0.1:${port}`], { stdio: ["ignore", "ignore", "pipe"] });
  prom.stderr.on("data", (d) => { log += d; });
  const query = async (q) => {
    try {
      const r = await (await fetch(`http://127.0.0.1:${port}/api/v1/query?query=${encodeURIComponent(q)}`)).json();
      return r.status === "success" && r.data.result.length ? Number(r.data.result[0].value[1]) : null;
    } catch { return null; }
  };
  // polls bounded by count (generous: Prometheus needs a few scrapes and rule evaluations)
  const until = async (pred, what) => {
    for (let i = 0; i < 120; i++) {
      assert.ok(prom.exitCode === null, `prometheus exited: ${log}`);
      if (await pred()) return;
      await sleep(500);
    }
    assert.fail(`${what}: ${log.slice(-2000)}`);
  };
  try {
    await until(async () => (await query('tokenmill_requests_total{job="tokenmill"}')) === 0, "a first scrape");
    const client = new OpenAI({ baseURL: `${S.url}/v1`, apiKey: "x", maxRetries: 0 });
    const prefix = Array.from({ length: 300 }, (_, i) => (i * 13 + 1) % 1000);
    for (let k = 0; k < 4; k++)
      await client.completions.create({ model: "q3", prompt: [...prefix, k + 1, k + 2], max_tokens: 4, temperature: 0, ignore_eos: true });
    const m = await metrics(S.url);
    assert.ok(m.tokenmill_cached_prompt_tokens_total >= 3 * 256, "the prefix was a hit");
    await until(async () => (await query("tokenmill_requests_total")) === 4 &&
                            (await query("tokenmill_cached_prompt_tokens_total")) === m.tokenmill_cached_prompt_tokens_total &&
                            (await query("tokenmill:cache_hit_ratio:rate5m")) !== null, "the load's counters and ratio");
    assert.equal(await query("tokenmill_prompt_tokens_total"), m.tokenmill_prompt_tokens_total);
    const ratio = await query("tokenmill:cache_hit_ratio:rate5m");
    const want = m.tokenmill_cached_prompt_tokens_total / m.tokenmill_prompt_tokens_total;
    assert.ok(Math.abs(ratio - want) < 1e-6, `recorded ratio ${ratio}, counters' ${want}`);
    assert.equal(await query('up{job="tokenmill"}'), 1);
    assert.ok((await query("tokenmill:ttft_seconds:p99_5m")) > 0);
  } finally {
    prom.kill("SIGTERM");
    await new Promise((r) => (prom.exitCode !== null ? r() : prom.on("exit", r)));
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
