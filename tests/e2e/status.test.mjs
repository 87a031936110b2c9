// status: the operator's page (GET /) of a real `tokenmill serve` (a generated qwen3 model)
// in headless Chromium, while the real `openai` client sends agents' requests that share a
// prefix: every chart has drawn, the page made no request but its own, the figures it shows
// equal /metrics read at the same moment (the load finished: the counters stand still), the
// cache-hit answer equals the cached tokens the responses reported, and a screenshot goes to
// build/test-output/status-page.png. Behind the API key like /metrics.
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import OpenAI from "openai";
import { root, bin, startServer, stopServers, fetchMetrics } from "./server.mjs";
import { haveChromium, launch } from "./browser.mjs";

after(stopServers);

const KEY = "sk-status-test", KEY2 = "sk-status-other";

const metrics = (url) => fetchMetrics(url, KEY);

// What the page shows, read in the browser (the page itself runs no script).
const READ = `JSON.stringify({
  charts: [...document.querySelectorAll("svg.chart")].map((s) => {
    const r = s.getBoundingClientRect();
    const marks = [...s.querySelectorAll("rect")].filter((e) => { const b = e.getBBox(); return b.width > 0 && b.height > 0; });
    return { id: s.dataset.chart, w: r.width, h: r.height, marks: marks.length };
  }),
  metrics: [...document.querySelectorAll("[data-metric]")].map((e) => [e.dataset.metric, Number(e.textContent)]),
  hits5: (() => { const c = document.querySelector('td[data-window="5"][data-class="*"]'); return { cached: Number(c.dataset.cached), prompt: Number(c.dataset.prompt) }; })(),
  ttftN5: [...document.querySelectorAll('td[data-window="5"][data-len]')].reduce((a, e) => a + Number(e.dataset.n), 0),
  sections: [...document.querySelectorAll("section")].map((s) => s.id),
})`;

test("the status page in a real browser shows /metrics' figures, draws every chart, loads nothing else", { skip: !haveChromium && "no chromium (scripts/deps.sh installs it)" }, async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "tm-status-"));
  const model = path.join(dir, "q3.gguf");
  execFileSync(bin, ["mkmodel", "--arch", "qwen3", "--preset", "tiny", "--type", "f16", "--seed", "5", "-o", model], { stdio: "pipe" });
  const S = await startServer(model, ["--model-name", "q3", "--ctx", "2048", "--api-key", KEY, "--api-key", KEY2, "--cost-per-hour", "2.5",
                                      "--retention", "agent=72h"]);
  // behind the key, in OpenAI's error shape
  const denied = await fetch(`${S.url}/`);
  assert.equal(denied.status, 401);
  assert.equal((await denied.json()).error.type, "invalid_request_error");

  // a little load: agents sharing a 300-token prefix (two full blocks), in two waves
  const client = new OpenAI({ baseURL: `${S.url}/v1`, apiKey: KEY, maxRetries: 0 });
  const prefix = Array.from({ length: 300 }, (_, i) => (i * 11 + 5) % 1000);
  const ask = (k) => client.completions.create({ model: "q3", prompt: [...prefix, ...Array.from({ length: 20 }, (_, i) => (k * 31 + i * 7) % 1000)],
                                                 max_tokens: 12, temperature: 0, ignore_eos: true, cache_class: "agent" });
  const reported = [];
  const first = await ask(0);
  reported.push(first);
  const wave = Promise.all(Array.from({ length: 6 }, (_, k) => ask(k + 1))).then((rs) => reported.push(...rs));

  const browser = await launch();
  try {
    await browser.open();
    await browser.send("Network.setExtraHTTPHeaders", { headers: { authorization: `Bearer ${KEY}` } });
    // under load
    let from = browser.eventCount();
    await browser.send("Page.navigate", { url: `${S.url}/` });
    await browser.waitFor("Page.loadEventFired", from);
    await wave;
    // the load is over: the counters stand still, so the page and /metrics read the same moment
    from = browser.eventCount();
    await browser.send("Page.reload", {});
    await browser.waitFor("Page.loadEventFired", from);
    const { result } = await browser.send("Runtime.evaluate", { expression: READ, returnByValue: true });
    const shown = JSON.parse(result.value);
    const m = await metrics(S.url);

    // every answer, and every chart drawn with its marks
    for (const id of ["totals", "cache", "retention", "hits", "labour", "speed", "capacity", "cost"])
      assert.ok(shown.sections.includes(id), `section ${id}`);
    assert.deepEqual(shown.charts.map((c) => c.id).sort(), ["gen_per_minute", "hits", "store_fill", "ttft", "utilisation"]);
    for (const c of shown.charts) {
      assert.ok(c.w > 100 && c.h > 20, `chart ${c.id} has a size: ${JSON.stringify(c)}`);
      assert.ok(c.marks >= 1, `chart ${c.id} has drawn marks`);
    }
    // the figures equal /metrics
    assert.ok(shown.metrics.length >= 8);
    for (const [name, v] of shown.metrics) assert.equal(v, m[name], name);
    assert.equal(m.tokenmill_requests_total, 7);
    // the hit answer: the sums of what the responses reported
    const cachedReported = reported.reduce((a, r) => a + r.usage.prompt_tokens_details.cached_tokens, 0);
    const promptReported = reported.reduce((a, r) => a + r.usage.prompt_tokens, 0);
    assert.ok(cachedReported >= 6 * 256, `the wave hit the prefix: ${cachedReported}`);
    assert.deepEqual(shown.hits5, { cached: cachedReported, prompt: promptReported });
    assert.equal(shown.hits5.cached, m.tokenmill_cached_prompt_tokens_total);
    assert.equal(shown.ttftN5, m.tokenmill_time_to_first_token_seconds_count);
    // each key sees its own share only: all the load came with KEY, none with KEY2
    const own = async (key) => {
      const page = await (await fetch(`${S.url}/`, { headers: { authorization: `Bearer ${key}` } })).text();
      return [...page.matchAll(/data-window="5" data-key-cached="(\d+)" data-key-prompt="(\d+)"/g)].map((x) => [Number(x[1]), Number(x[2])]);
    };
    assert.deepEqual(await own(KEY), [[cachedReported, promptReported]]);
    assert.deepEqual(await own(KEY2), [[0, 0]]);

    // nothing but the page itself was requested
    const urls = browser.events().filter((e) => e.method === "Network.requestWillBeSent").map((e) => e.params.request.url);
    assert.ok(urls.length >= 2);
    for (const u of urls) assert.ok(u === `${S.url}/`, `no other request: ${u}`);

    const shot = await browser.send("Page.captureScreenshot", { format: "png", captureBeyondViewport: true });
    const out = path.join(root, "build/test-output");
    fs.mkdirSync(out, { recursive: true });
    fs.writeFileSync(path.join(out, "status-page.png"), Buffer.from(shot.data, "base64"));
  } finally {
    await browser.close();
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

// The gateway's page: workers up by role, the cluster's counters equal to its /metrics, the
// hit answer from the requests it ran.
test("the gateway's status page shows its workers by role and the cluster's figures", async () => {
  const { spawn } = await import("node:child_process");
  const model = path.join(root, "models/stories260K.gguf");
  const cacheHome = fs.mkdtempSync(path.join(os.tmpdir(), "tm-status-gw-"));
  const store = path.join(cacheHome, "store");
  fs.mkdirSync(store);
  const procs = [];
  const run = (args) => {
    const p = spawn(bin, args, { stdio: ["ignore", "ignore", "pipe"], env: { ...process.env, XDG_CACHE_HOME: cacheHome } });
    procs.push(p);
    let log = "";
    p.stderr.on("data", (d) => { log += d; });
    return { p, line: (re) => new Promise((resolve, reject) => {
      const give = setTimeout(() => { clearInterval(t); reject(new Error(`no ${re} in: ${log}`)); }, 30000);
      const t = setInterval(() => { const m = re.exec(log); if (m) { clearInterval(t); clearTimeout(give); resolve(m); } }, 50);
    }) };
  };
  try {
    const gw = run(["gateway", "-m", model, "--listen", "127.0.0.1:0", "--register", "127.0.0.1:0", "--cache", `dir:${store}`,
                    "--api-key", KEY, "--cost-per-hour", "10"]);
    const url = `http://127.0.0.1:${(await gw.line(/listening on http:\/\/[^:]+:(\d+)/))[1]}`;
    const reg = (await gw.line(/workers register at [^:]+:(\d+)/))[1];
    for (const role of ["prefill", "decode"]) {
      const w = run(["worker", "--role", role, "-m", model, "--listen", "127.0.0.1:0", "--gateway", `127.0.0.1:${reg}`,
                     "--cache", `dir:${store}`, "--threads", "1"]);
      await w.line(/registered with the gateway/);
    }
    const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: KEY, maxRetries: 0 });
    for (let k = 0; k < 3; k++)
      await client.completions.create({ model: "stories260K", prompt: `Once upon a time there was a cat number ${k}`, max_tokens: 8, temperature: 0 });
    assert.equal((await fetch(`${url}/status`)).status, 401);
    const page = await (await fetch(`${url}/status`, { headers: { authorization: `Bearer ${KEY}` } })).text();
    const m = await metrics(url);
    assert.match(page, /data-role="prefill" data-up="1"/);
    assert.match(page, /data-role="decode" data-up="1"/);
    assert.match(page, /data-advice="decode"/);
    // the same advice for an autoscaler, through Prometheus
    const adv = /data-advice="decode">(\d+)</.exec(page);
    assert.equal(m['tokenmill_capacity_recommended_workers{role="decode"}'], Number(adv[1]));
    const shown = [...page.matchAll(/data-metric="([a-z_]+)">([0-9.e+-]+)</g)].map((x) => [x[1], Number(x[2])]);
    assert.ok(shown.some(([n]) => n === "tokenmill_gateway_requests_total"));
    for (const [n, v] of shown) assert.equal(v, m[n], n);
    assert.equal(m.tokenmill_gateway_requests_total, 3);
    const all5 = /data-window="5" data-class="\*" data-cached="(\d+)" data-prompt="(\d+)"/.exec(page);
    assert.equal(Number(all5[2]), m.tokenmill_prompt_tokens_total);
    assert.match(page, /id="cost"/);
  } finally {
    for (const p of procs) if (p.exitCode === null && p.signalCode === null) p.kill("SIGKILL");
    fs.rmSync(cacheHome, { recursive: true, force: true });
  }
});
