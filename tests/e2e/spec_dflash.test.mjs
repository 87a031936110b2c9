// spec_dflash: speculative decoding with a DFlash / DSpark drafter (`--draft FILE --spec
// dspark|dflash`) through the server, on an mkmodel qwen3 target and random drafters written
// by llama.cpp's gguf-py (tests/oracle/gguf_dflash.py; the drafter's arithmetic itself is
// oracle_dflash.test.mjs's). Greedy answers alone and four at once, and a seeded sampled
// answer, are the same text as without speculation (DSpark adaptive, DSpark verifying 5 with
// --spec-p-min, DFlash), drafts are verified and counted as the draft model's ("model"), a
// decode worker behind a gateway drafts with it too, and bad options are refused at start.
// Needs python3 with numpy; skipped without it. The drafters are cached under tests/data/gen/.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import path from "node:path";

import { bin, fetchMetrics, postCompletion, startCluster, startServer, stopServers } from "./server.mjs";
import { root, oracleFiles } from "./oracle_common.mjs";
import { dsv4Model, skip as dsv4Skip } from "./dsv4_model.mjs";

const script = path.join(root, "tests/oracle/gguf_dflash.py");
const { python, skip, cached } = oracleFiles([script, path.join(root, "tests/oracle/gguf_common.py")]);
const run = (cmd, args) => {
  const r = spawnSync(cmd, args, { encoding: "utf8" });
  assert.equal(r.status, 0, r.stderr);
};
let target, dspark, noconf, dflash, plain, adaptive, fixed, plainDf;
const N = 4, MAX = 24;
const prompt = (c) => `tool output ${c}: ` + "alpha beta gamma delta ".repeat(3 + c) + "\nquote: alpha";

before(async () => {
  if (skip) return;
  target = cached("dflash-target", (tmp) => run(bin, ["mkmodel", "--arch", "qwen3", "--layers", "4", "--dim", "256",
    "--ffn", "512", "--heads", "4", "--kv-heads", "2", "--head-dim", "64", "--vocab-size", "2048", "--tied", "--type",
    "f32", "--seed", "1", "-o", tmp]));
  const drafter = (name, args) => cached(`dflash-${name}`, (tmp) => run(python, [script, "--target", target, ...args, "-o", tmp]));
  dspark = drafter("dspark", ["--block", "6", "--markov", "16", "--conf"]);
  noconf = drafter("dspark-noconf", ["--block", "6", "--markov", "8"]);
  dflash = drafter("dflash", ["--block", "6"]);
  const common = ["--threads", "1", "--max-seqs", "4", "--cache", "off"];
  [plain, adaptive, fixed, plainDf] = await Promise.all([
    startServer(target, common),
    startServer(target, [...common, "--draft", dspark, "--spec", "dspark"]),
    startServer(target, [...common, "--draft", dspark, "--spec", "dspark", "--spec-fixed", "5", "--spec-p-min", "0.2"]),
    startServer(target, [...common, "--draft", dflash, "--spec", "dflash", "--spec-fixed", "3"]),
  ]);
});

after(async () => {
  await stopServers();
});

async function complete(S, c, extra = { temperature: 0 }) {
  const j = await postCompletion(S.url, { model: path.basename(target, ".gguf"), prompt: prompt(c), max_tokens: MAX, ignore_eos: true, ...extra });
  return j.choices[0].text;
}

test("greedy answers drafted by DSpark / DFlash equal those without, alone and concurrent", { skip }, async () => {
  const want = [];
  for (let c = 0; c < N; c++) want.push(await complete(plain, c));
  for (const [name, S] of [["dspark adaptive", adaptive], ["dspark verify 5, p-min 0.2", fixed], ["dflash verify 3", plainDf]]) {
    assert.equal(await complete(S, 0), want[0], `${name}, prompt 0 alone`);
    const together = await Promise.all(Array.from({ length: N }, (_, c) => complete(S, c)));
    together.forEach((t, c) => assert.equal(t, want[c], `${name}, prompt ${c} concurrent`));
    const m = await fetchMetrics(S.url);
    assert.ok(m['tokenmill_spec_source_verified_tokens_total{source="model"}'] > 0, `${name}: no draft verified ${JSON.stringify(m)}`);
    assert.ok(m.tokenmill_spec_drafted_tokens_total >= m.tokenmill_spec_verified_tokens_total);
  }
});

test("a seeded sampled answer is the same with DSpark speculation", { skip }, async () => {
  const extra = { temperature: 0.9, top_p: 0.95, seed: 11, presence_penalty: 0.3 };
  for (let c = 0; c < 2; c++) {
    const want = await complete(plain, c, extra);
    assert.equal(await complete(fixed, c, extra), want, `prompt ${c}, dspark`);
    assert.equal(await complete(plainDf, c, extra), want, `prompt ${c}, dflash`);
  }
});

test("a decode worker drafts with a DSpark drafter behind a gateway", { skip, timeout: 60000 }, async () => {
  const C = await startCluster(target, ["prefill", "decode"], { workerArgs: ["--draft", dspark, "--spec", "dspark", "--spec-fixed", "3"] });
  const want = await complete(plain, 2);
  const j = await postCompletion(C.url, { model: path.basename(target, ".gguf"), prompt: prompt(2), max_tokens: MAX, ignore_eos: true, temperature: 0 });
  assert.equal(j.choices[0].text, want);
  const det = j.usage.completion_tokens_details;
  assert.ok(det.accepted_prediction_tokens + det.rejected_prediction_tokens > 0, JSON.stringify(j.usage));
});

test("bad DSpark / DFlash options are refused at start", { skip }, () => {
  for (const [args, msg] of [
    [["--spec", "dspark"], /--spec dspark needs --draft FILE/],
    [["--draft", "NOCONF", "--spec", "dspark"], /has no confidence head/],
    [["--spec", "ngram", "--spec-p-min", "0.5"], /--spec-p-min needs --spec dspark or dflash/],
  ]) {
    const argv = args.map((a) => (a === "NOCONF" ? noconf : a));
    const r = spawnSync(bin, ["serve", "-m", target, "--port", "0", "--cache", "off", ...argv], { encoding: "utf8", timeout: 30000 });
    assert.notEqual(r.status, 0, args.join(" "));
    assert.match(r.stderr, msg);
  }
});

// The DeepSeek V4 backbone: a DSpark drafter of tests/oracle/gguf_dspark_v4.py (hyper-connections,
// V4 layers, Markov and confidence heads) on the gguf_dsv4.py V4 target; its arithmetic is
// oracle_dflash.test.mjs's. Greedy answers, alone and concurrent, equal those without
// speculation, drafts are verified, and a decode worker behind a gateway drafts with it too.
const v4Script = path.join(root, "tests/oracle/gguf_dspark_v4.py");
const v4Files = oracleFiles([v4Script, path.join(root, "tests/oracle/gguf_dsv4.py"), path.join(root, "tests/oracle/gguf_common.py")]);
const skipV4 = skip || v4Files.skip || dsv4Skip;

test("DSpark with the V4 backbone on a deepseek4 target: greedy answers equal those without", { skip: skipV4, timeout: 120000 }, async () => {
  const t = dsv4Model();
  const d = v4Files.cached("dspark-v4-conf", (tmp) => run(v4Files.python, [v4Script, "--target", t, "--block", "6", "--markov", "16", "--conf", "-o", tmp]));
  const common = ["--threads", "1", "--max-seqs", "4", "--cache", "off"];
  const [p, a, f] = await Promise.all([
    startServer(t, common),
    startServer(t, [...common, "--draft", d, "--spec", "dspark"]),
    startServer(t, [...common, "--draft", d, "--spec", "dspark", "--spec-fixed", "5", "--spec-p-min", "0.2"]),
  ]);
  const ask = async (url, c) => (await postCompletion(url, { model: path.basename(t, ".gguf"), prompt: prompt(c), max_tokens: MAX, ignore_eos: true, temperature: 0 })).choices[0].text;
  const want = [];
  for (let c = 0; c < N; c++) want.push(await ask(p.url, c));
  for (const [name, S] of [["v4 dspark adaptive", a], ["v4 dspark verify 5, p-min 0.2", f]]) {
    assert.equal(await ask(S.url, 0), want[0], `${name}, prompt 0 alone`);
    const together = await Promise.all(Array.from({ length: N }, (_, c) => ask(S.url, c)));
    together.forEach((x, c) => assert.equal(x, want[c], `${name}, prompt ${c} concurrent`));
    const m = await fetchMetrics(S.url);
    assert.ok(m['tokenmill_spec_source_verified_tokens_total{source="model"}'] > 0, `${name}: no draft verified ${JSON.stringify(m)}`);
  }
  const C = await startCluster(t, ["prefill", "decode"], { workerArgs: ["--draft", d, "--spec", "dspark", "--spec-fixed", "3"] });
  const j = await postCompletion(C.url, { model: path.basename(t, ".gguf"), prompt: prompt(2), max_tokens: MAX, ignore_eos: true, temperature: 0 });
  assert.equal(j.choices[0].text, want[2], "v4 dspark on a decode worker");
  const det = j.usage.completion_tokens_details;
  assert.ok(det.accepted_prediction_tokens + det.rejected_prediction_tokens > 0, JSON.stringify(j.usage));
});
