// ep: expert parallelism through real processes. A `tokenmill serve` leads a group of
// `tokenmill expert` members (--ep-member) over authenticated links; its completions must equal
// one process's (tokens and log-probabilities), while members are killed, stopped (a silent
// member is detected by --ep-timeout) and restarted (it rejoins), with redundant experts placed
// by EPLB and rebalanced from the live load, with two micro-batches per member and layer (the
// default) and one (--ep-overlap off); /metrics and the status page show the group. Gateway
// workers (prefill, decode) leading groups of their own answer as one process. Then
// the same across network namespaces (one per member, veth links, netem latency and loss where
// the kernel has it), set up and torn down here; skipped with the reason where `ip netns`
// cannot run. And the refusals: a dense model, another key, another model, bad options.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync, spawn, spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";

import { root, bin, startServer, stopServers, startCluster } from "./server.mjs";

const vocab = path.join(root, "tests/data/llama.cpp/models/ggml-vocab-qwen2.gguf");
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "tm-ep-"));
const model = path.join(tmp, "moe.gguf");
const ds = path.join(tmp, "ds.gguf");
const key = path.join(tmp, "cluster.key");
const skip = !fs.existsSync(bin) ? "build/tokenmill not built"
  : !fs.existsSync(vocab) ? "no tests/data/llama.cpp (scripts/fetch-testdata.sh)" : false;
const members = [];

// A member: `tokenmill expert` (prefix: e.g. ["ip", "netns", "exec", NS]); resolves with its port.
function startMember(m, listen = "127.0.0.1:0", prefix = [], k = key) {
  const argv = [...prefix, bin, "expert", "-m", m, "--listen", listen, "--threads", "1", "--cluster-key-file", k];
  const proc = spawn(argv[0], argv.slice(1), { stdio: ["ignore", "ignore", "pipe"] });
  members.push(proc);
  let log = "";
  return new Promise((resolve, reject) => {
    const t = setTimeout(() => reject(new Error("member did not start: " + log)), 20000);
    proc.stderr.on("data", (d) => {
      log += d;
      const p = /listening on port (\d+)/.exec(log);
      if (p) { clearTimeout(t); resolve({ proc, port: Number(p[1]), log: () => log }); }
    });
    proc.on("exit", (code) => { clearTimeout(t); reject(new Error(`member exited ${code}: ${log}`)); });
  }).then((r) => { proc.removeAllListeners("exit"); return r; });
}

const exited = (proc) => new Promise((resolve) => {
  if (proc.exitCode !== null || proc.signalCode !== null) resolve();
  else proc.on("exit", resolve);
});

async function complete(url, prompt, extra = {}) {
  const r = await fetch(`${url}/v1/completions`, { method: "POST", headers: { "content-type": "application/json" },
    body: JSON.stringify({ prompt, max_tokens: 24, temperature: 0, logprobs: 3, ...extra }) });
  assert.equal(r.status, 200);
  const j = await r.json();
  return { text: j.choices[0].text, logprobs: j.choices[0].logprobs, finish: j.choices[0].finish_reason };
}

// Streamed text; onChunk(i) runs after the i-th chunk.
async function stream(url, prompt, max_tokens, onChunk) {
  const r = await fetch(`${url}/v1/completions`, { method: "POST", headers: { "content-type": "application/json" },
    body: JSON.stringify({ prompt, max_tokens, temperature: 0, stream: true }) });
  assert.equal(r.status, 200);
  let text = "", buf = "", i = 0, done = false;
  const dec = new TextDecoder();
  for await (const part of r.body) {
    buf += dec.decode(part, { stream: true });
    let k;
    while ((k = buf.indexOf("\n\n")) >= 0) {
      const ev = buf.slice(0, k);
      buf = buf.slice(k + 2);
      if (!ev.startsWith("data: ")) continue;
      if (ev === "data: [DONE]") { done = true; continue; }
      text += JSON.parse(ev.slice(6)).choices[0].text ?? "";
      await onChunk?.(++i);
    }
  }
  assert.ok(done, "the stream ended with [DONE]");
  return text;
}

const metric = (text, re) => Number(re.exec(text)?.[1]);
const PROMPTS = ["Hello there, experts", "Mixtures of experts route each token", "A third prompt, a little longer than the others",
  "Four"];

let ref, refDs;
before(async () => {
  if (skip) return;
  fs.writeFileSync(key, "ep-test-key-0123456789abcdef\n", { mode: 0o600 });
  execFileSync(bin, ["mkmodel", "--arch", "qwen3moe", "--preset", "tiny", "--experts", "16", "--experts-used", "4",
    "--expert-ffn", "256", "--vocab", vocab, "--type", "q8_0", "--seed", "7", "-o", model], { stdio: "pipe" });
  // DeepSeek V3's router: 8 groups of which 4 kept
  execFileSync(bin, ["mkmodel", "--arch", "deepseek2", "--preset", "tiny", "--q-lora", "64", "--kv-lora", "128",
    "--nope-dim", "32", "--rope-dim", "32", "--v-dim", "32", "--experts", "16", "--experts-used", "4", "--expert-ffn", "128",
    "--shared-experts", "1", "--dense-layers", "1", "--router", "sigmoid", "--expert-groups", "8", "--groups-used", "4",
    "--vocab", vocab, "--type", "q8_0", "--seed", "3", "-o", ds], { stdio: "pipe" });
  ref = await startServer(model, ["--ctx", "512", "--max-seqs", "8"]);
  refDs = await startServer(ds, ["--ctx", "512", "--max-seqs", "8"]);
});

after(async () => {
  for (const p of members) if (p.exitCode === null && p.signalCode === null) p.kill("SIGKILL");
  await Promise.all(members.map(exited));
  await stopServers();
  fs.rmSync(tmp, { recursive: true, force: true });
});

test("loopback group: one process's completions, through a killed, a silent and a restarted member", { skip }, async () => {
  const [m1, m2] = await Promise.all([startMember(model), startMember(model)]);
  const S = await startServer(model, ["--ctx", "512", "--max-seqs", "8", "--cluster-key-file", key,
    "--ep-member", `127.0.0.1:${m1.port},127.0.0.1:${m2.port}`, "--ep-timeout", "1"]);
  assert.match(S.log, /expert group of 3 processes \(this one and 2 members\), 16 experts per layer, .* two micro-batches per member and layer/);
  // concurrently: the steps carry several sequences and prefill chunks at once
  const want = await Promise.all(PROMPTS.map((p) => complete(ref.url, p)));
  assert.deepEqual(await Promise.all(PROMPTS.map((p) => complete(S.url, p))), want);
  let text = await (await fetch(`${S.url}/metrics`)).text();
  const rows = (p) => metric(text, new RegExp(`^tokenmill_ep_rows_total\\{process="${p}",[^}]*\\} (\\d+)$`, "m"));
  assert.ok(rows(0) > 0 && rows(1) > 0 && rows(2) > 0, "every process computed experts");
  assert.equal(metric(text, /^tokenmill_ep_processes\{state="up"\} (\d+)$/m), 3);
  assert.ok(metric(text, /^tokenmill_ep_exchange_seconds_total (\S+)$/m) > 0);
  const hidden = metric(text, /^tokenmill_ep_hidden_ratio (\S+)$/m);
  assert.ok(hidden >= 0 && hidden <= 1, `hidden ${hidden}`);
  assert.equal(metric(text, /^tokenmill_ep_micro_batches (\d+)$/m), 2);   // --ep-overlap on, the default
  assert.ok(metric(text, /^tokenmill_ep_split_exchanges_total (\d+)$/m) > 0);
  const im = metric(text, /^tokenmill_ep_imbalance\{placement="contiguous"\} (\S+)$/m);
  assert.ok(im >= 1 && im <= 3, `imbalance ${im}`);

  // a member killed in the middle of a stream: the stream goes on, the same text
  const long = "Tell me everything about mixtures of experts";
  const wantLong = (await complete(ref.url, long, { max_tokens: 64, logprobs: undefined })).text;
  const got = await stream(S.url, long, 64, (i) => { if (i === 3) m1.proc.kill("SIGKILL"); });
  assert.equal(got, wantLong);
  await exited(m1.proc);
  assert.deepEqual(await complete(S.url, PROMPTS[1]), want[1]);
  // a silent member (stopped): detected after --ep-timeout, its experts computed here
  m2.proc.kill("SIGSTOP");
  assert.deepEqual(await complete(S.url, PROMPTS[2]), want[2]);
  text = await (await fetch(`${S.url}/metrics`)).text();
  assert.equal(metric(text, /^tokenmill_ep_processes\{state="up"\} (\d+)$/m), 1);
  assert.equal(metric(text, new RegExp(`^tokenmill_ep_member_failures_total\\{member="127.0.0.1:${m1.port}"\\} (\\d+)$`, "m")), 1);
  assert.equal(metric(text, new RegExp(`^tokenmill_ep_member_failures_total\\{member="127.0.0.1:${m2.port}"\\} (\\d+)$`, "m")), 1);
  m2.proc.kill("SIGKILL");
  // a member started again on its address rejoins between steps
  const back = await startMember(model, `127.0.0.1:${m1.port}`);
  const before1 = rows(1);
  for (let i = 0; i < 50 && !/up"\} 2$/m.test(text); i++) {
    await new Promise((r) => setTimeout(r, 100));
    text = await (await fetch(`${S.url}/metrics`)).text();
  }
  assert.equal(metric(text, /^tokenmill_ep_processes\{state="up"\} (\d+)$/m), 2);
  assert.deepEqual(await complete(S.url, PROMPTS[3]), want[3]);
  text = await (await fetch(`${S.url}/metrics`)).text();
  assert.ok(rows(1) > before1, "the restarted member computes again");
  back.proc.kill("SIGTERM");
  await exited(back.proc);
});

test("gateway workers leading groups: a gateway's answers equal one process's; a member killed mid-stream loses nothing", { skip }, async () => {
  // the prefill worker leads a group of one member, the decode worker one of two (it shares
  // the first: a member serves several leaders); the whole cluster on the members' key
  const [m1, m2] = await Promise.all([startMember(model), startMember(model)]);
  const ep = (...ms) => ["--cluster-key-file", key, "--ep-timeout", "1", "--ep-member", ms.map((m) => `127.0.0.1:${m.port}`).join(",")];
  const gw = await startCluster(model, ["prefill", "decode"], { gatewayArgs: ["--cluster-key-file", key],
    workerArgs: ["--ctx", "512", "--max-seqs", "8"], perWorkerArgs: [ep(m1), ep(m1, m2)] });
  const want = await Promise.all(PROMPTS.map((p) => complete(ref.url, p)));
  const got = await Promise.all(PROMPTS.map((p) => complete(gw.url, p)));
  assert.deepEqual(got, want);   // text, log-probabilities and finish reason
  const leaders = (m) => (m.log().match(/ep member: leader \S+ is in/g) || []).length;
  assert.equal(leaders(m1), 2, "both workers lead a group with the first member");
  assert.equal(leaders(m2), 1);
  // a member killed in the middle of a decode worker's stream: the stream goes on, the same text
  const long = "Tell me everything about mixtures of experts";
  const wantLong = (await complete(ref.url, long, { max_tokens: 48, logprobs: undefined })).text;
  const text = await stream(gw.url, long, 48, (i) => { if (i === 3) m2.proc.kill("SIGKILL"); });
  assert.equal(text, wantLong);
  await exited(m2.proc);
  assert.deepEqual((await complete(gw.url, PROMPTS[0])).text, want[0].text);
});

test("redundant experts: EPLB placements from the live load, switched between steps, same completions; the status page", { skip }, async () => {
  const [m1, m2, m3] = await Promise.all([startMember(ds), startMember(ds), startMember(ds)]);
  // 16 experts + 4 copies on 4 processes (EPLB's global policy)
  const S = await startServer(ds, ["--ctx", "512", "--max-seqs", "8", "--cluster-key-file", key,
    "--ep-member", `127.0.0.1:${m1.port}`, "--ep-member", `127.0.0.1:${m2.port}`, "--ep-member", `127.0.0.1:${m3.port}`,
    "--redundant-experts", "4", "--ep-rebalance", "0.05", "--ep-overlap", "off"]);
  assert.match(S.log, /expert group of 4 processes .* 4 redundant, one micro-batch per member and layer/);
  for (const p of PROMPTS) assert.deepEqual(await complete(S.url, p), await complete(refDs.url, p));
  const text = await (await fetch(`${S.url}/metrics`)).text();
  assert.ok(metric(text, /^tokenmill_ep_rebalances_total (\d+)$/m) >= 1, "placed again from the load");
  assert.equal(metric(text, /^tokenmill_ep_split_exchanges_total (\d+)$/m), 0);   // --ep-overlap off
  const ic = metric(text, /^tokenmill_ep_imbalance\{placement="contiguous"\} (\S+)$/m);
  const ip = metric(text, /^tokenmill_ep_imbalance\{placement="current"\} (\S+)$/m);
  assert.ok(ic >= 1 && ip >= 1, `imbalance ${ic} / ${ip}`);
  const page = await (await fetch(`${S.url}/status`)).text();
  assert.match(page, /expert group: 4 processes, 4 up; imbalance [\d.]+ with experts in ranges, [\d.]+ as placed/);
});

test("refused: a dense model, a member without the key, another model, bad options", { skip }, async () => {
  const dense = path.join(tmp, "dense.gguf");
  execFileSync(bin, ["mkmodel", "--arch", "llama", "--preset", "tiny", "--vocab", vocab, "--type", "q8_0", "--seed", "1",
    "-o", dense], { stdio: "pipe" });
  let r = spawnSync(bin, ["expert", "-m", dense, "--listen", "127.0.0.1:0", "--cluster-key-file", key], { encoding: "utf8" });
  assert.equal(r.status, 2);
  assert.match(r.stderr, /needs a mixture-of-experts model/);
  r = spawnSync(bin, ["serve", "-m", model, "--port", "0", "--redundant-experts", "2"], { encoding: "utf8" });
  assert.notEqual(r.status, 0);
  assert.match(r.stderr, /--redundant-experts needs --ep-member/);
  const other = path.join(tmp, "other.key");
  fs.writeFileSync(other, "another-cluster-key-0123456789\n", { mode: 0o600 });
  const m = await startMember(model, "127.0.0.1:0", [], other);
  const serveTo = (mm, ...extra) => spawnSync(bin, ["serve", "-m", mm, "--port", "0", "--threads", "1", "--ctx", "256",
    "--cluster-key-file", key, "--ep-member", `127.0.0.1:${m.port}`, ...extra], { encoding: "utf8", timeout: 30000 });
  r = serveTo(model);
  assert.equal(r.status, 1);
  assert.match(r.stderr, /expert member 127\.0\.0\.1:\d+: handshake/);
  m.proc.kill("SIGTERM");
  await exited(m.proc);
  const m2 = await startMember(ds);
  r = spawnSync(bin, ["serve", "-m", model, "--port", "0", "--threads", "1", "--ctx", "256", "--cluster-key-file", key,
    "--ep-member", `127.0.0.1:${m2.port}`], { encoding: "utf8", timeout: 30000 });
  assert.equal(r.status, 1);
  assert.match(r.stderr, /another model: the leader.s fingerprint differs/);
  r = spawnSync(bin, ["serve", "-m", model, "--port", "0", "--threads", "1", "--ctx", "256", "--cluster-key-file", key,
    "--ep-member", `127.0.0.1:${m2.port}`, "--redundant-experts", "3"], { encoding: "utf8", timeout: 30000 });
  assert.equal(r.status, 1);
  assert.match(r.stderr, /must be a multiple of the group's 2 processes/);
  m2.proc.kill("SIGTERM");
  await exited(m2.proc);
});

// ---- network namespaces -------------------------------------------------------------------
// Each member in a namespace of its own, linked to this one by a veth pair on a private /24;
// netem adds latency and loss on the leader's side of each link where the kernel has it.
const tag = String(process.pid % 10000);
const subnet = (i) => `10.201.${(process.pid % 120) * 2 + i}`;
const nsName = (i) => `tm-ep-${tag}-${i}`;
const sh = (...a) => spawnSync(a[0], a.slice(1), { encoding: "utf8" });
let nsSkip = skip, netem = false;
function nsSetup() {
  if (nsSkip) return;
  if (process.getuid?.() !== 0) { nsSkip = "not root: ip netns needs CAP_SYS_ADMIN"; return; }
  const probe = sh("ip", "netns", "add", nsName(0));
  if (probe.status !== 0) { nsSkip = `ip netns add failed: ${(probe.stderr || probe.error?.message || "").trim()}`; return; }
  for (let i = 0; i < 2; i++) {
    const ns = nsName(i), a = `tme${tag}a${i}`, b = `tme${tag}b${i}`;
    const steps = [
      i ? ["ip", "netns", "add", ns] : null,
      ["ip", "link", "add", a, "type", "veth", "peer", "name", b],
      ["ip", "link", "set", b, "netns", ns],
      ["ip", "addr", "add", `${subnet(i)}.1/24`, "dev", a],
      ["ip", "link", "set", a, "up"],
      ["ip", "netns", "exec", ns, "ip", "addr", "add", `${subnet(i)}.2/24`, "dev", b],
      ["ip", "netns", "exec", ns, "ip", "link", "set", b, "up"],
      ["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"],
    ].filter(Boolean);
    for (const s of steps) {
      const r = sh(...s);
      if (r.status !== 0) { nsSkip = `${s.join(" ")}: ${r.stderr.trim()}`; return; }
    }
    const q = sh("tc", "qdisc", "add", "dev", a, "root", "netem", "delay", "2ms", "loss", "1%");
    netem = q.status === 0;
    if (!netem) console.log(`# ep: tc netem unavailable (${q.stderr.trim()}): namespaces without latency or loss`);
  }
}
function nsTeardown() {
  for (let i = 0; i < 2; i++) {
    sh("ip", "link", "del", `tme${tag}a${i}`);   // its peer goes with it
    sh("ip", "netns", "del", nsName(i));
  }
}

test("network namespaces: members behind veth links (netem where the kernel has it); one process's completions, a killed member", { skip }, async (t) => {
  nsSetup();
  try {
    if (nsSkip) { t.skip(nsSkip); return; }
    const ms = await Promise.all([0, 1].map((i) => startMember(model, `${subnet(i)}.2:0`, ["ip", "netns", "exec", nsName(i)])));
    const S = await startServer(model, ["--ctx", "512", "--max-seqs", "8", "--cluster-key-file", key, "--ep-timeout", "3",
      "--ep-member", `${subnet(0)}.2:${ms[0].port},${subnet(1)}.2:${ms[1].port}`]);
    const want = await Promise.all(PROMPTS.map((p) => complete(ref.url, p)));
    assert.deepEqual(await Promise.all(PROMPTS.map((p) => complete(S.url, p))), want);
    let text = await (await fetch(`${S.url}/metrics`)).text();
    assert.equal(metric(text, /^tokenmill_ep_processes\{state="up"\} (\d+)$/m), 3);
    assert.ok(metric(text, new RegExp(`^tokenmill_ep_rows_total\\{process="2",[^}]*\\} (\\d+)$`, "m")) > 0);
    ms[0].proc.kill("SIGKILL");
    await exited(ms[0].proc);
    assert.deepEqual(await Promise.all(PROMPTS.map((p) => complete(S.url, p))), want);
    text = await (await fetch(`${S.url}/metrics`)).text();
    assert.equal(metric(text, /^tokenmill_ep_processes\{state="up"\} (\d+)$/m), 2);
    if (!netem) t.diagnostic("tc netem unavailable here: no latency or loss on the links");
  } finally {
    for (const p of members) if (p.exitCode === null && p.signalCode === null) p.kill("SIGKILL");
    await Promise.all(members.map(exited));
    nsTeardown();
  }
});
