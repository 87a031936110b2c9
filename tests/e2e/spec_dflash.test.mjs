// spec_dflash: speculative decoding with a DFlash / DSpark drafter (`--draft FILE --spec
// dspark|dflash`) through the server, on an mkmodel qwen3 target and random drafters written
// by llama.cpp's gguf-py (tests/oracle/gguf_dflash.py; the drafter's arithmetic itself is
// oracle_dflash.test.mjs's). Greedy answers alone and four at once, and a seeded sampled
// answer, are the same text as without speculation (DSpark adaptive, DSpark verifying 5 with
// --spec-p-min, DFlash), drafts are verified and counted as the draft model's ("model"), a
// decode worker behind a gateway drafts with it too, and bad options are refused at start.
// Sampled outputs through DSpark and DFlash are distributed as the target's alone (a
// two-sample chi-square test on a drafter whose drafts pass: bench/dspark_echo.py).
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

// The distribution of sampled outputs. A random drafter's tokens are never the target's, so no
// draft of it is accepted and the acceptance rule is never exercised; bench/dspark_echo.py's
// drafter drafts the anchor again at every slot (its Markov head made the identity), and with
// the logits biased onto three tokens, where a sampled token is often the one before it again,
// about 60 % of its drafts pass. Seeded completions of 4 tokens at temperature 2 are drawn from
// the target alone (seeds 1..n) and through DSpark and DFlash verifying 3 (other seeds), and a
// two-sample chi-square test over the 4-token outcomes must not tell them apart at 0.1 %. The
// seeds are fixed, so the statistics are the same on every run. Checked to fail when a rejected
// draft is given a second chance (a second draw from the target that keeps the draft if it comes
// out, counting its mass twice as test_spec's wrong rule does).
const echoScript = path.join(root, "bench/dspark_echo.py");
const echoFiles = oracleFiles([echoScript, script, path.join(root, "tests/oracle/gguf_common.py")]);

// The 0.1 % critical value of chi-square with df degrees of freedom (Wilson-Hilferty).
const chiCrit = (df) => df * (1 - 2 / (9 * df) + 3.0902 * Math.sqrt(2 / (9 * df))) ** 3;

// The two-sample statistic of outcome counts a and b (Maps, equal totals); cells whose pooled
// count is under 10 are pooled into one.
function chiTwoSample(a, b) {
  const cells = new Map();
  for (const [m, side] of [[a, 0], [b, 1]])
    for (const [k, n] of m) {
      if (!cells.has(k)) cells.set(k, [0, 0]);
      cells.get(k)[side] += n;
    }
  const merged = [], rest = [0, 0];
  for (const c of cells.values()) {
    if (c[0] + c[1] >= 10) merged.push(c);
    else rest[0] += c[0], rest[1] += c[1];
  }
  if (rest[0] + rest[1] > 0) merged.push(rest);
  let x2 = 0;
  for (const [x, y] of merged) {
    const e = (x + y) / 2;
    x2 += ((x - e) ** 2 + (y - e) ** 2) / e;
  }
  return { x2, df: merged.length - 1 };
}

test("sampled outputs through DSpark and DFlash are distributed as the target's alone (chi-square)", { skip: skip || echoFiles.skip, timeout: 300000 }, async (t) => {
  const echo = echoFiles.cached("dspark-echo", (tmp) => run(echoFiles.python, [echoScript, "--target", target, "-o", tmp]));
  const common = ["--threads", "1", "--max-seqs", "8", "--cache", "off"];
  const [ds, df] = await Promise.all([
    startServer(target, [...common, "--draft", echo, "--spec", "dspark", "--spec-fixed", "3"]),
    startServer(target, [...common, "--draft", echo, "--spec", "dflash", "--spec-fixed", "3"]),
  ]);
  const n = 480, biased = { 400: 100, 500: 100, 600: 100 };
  const draw = async (S, seed0) => {
    const counts = new Map();
    for (let i = 0; i < n; i += 8) {
      const js = await Promise.all(Array.from({ length: 8 }, (_, k) => postCompletion(S.url, {
        model: path.basename(target, ".gguf"), prompt: [5, 6, 7, 8, 9, 10], max_tokens: 4, ignore_eos: true,
        temperature: 2, seed: seed0 + i + k, logit_bias: biased })));
      for (const j of js) {
        assert.equal(j.usage.completion_tokens, 4);
        counts.set(j.choices[0].text, (counts.get(j.choices[0].text) ?? 0) + 1);
      }
    }
    return counts;
  };
  const want = await draw(plain, 1);
  for (const [name, S, seed0] of [["dspark", ds, 1 + n], ["dflash", df, 1 + 2 * n]]) {
    const got = await draw(S, seed0);
    const m = await fetchMetrics(S.url);
    const verified = m.tokenmill_spec_verified_tokens_total, accepted = m.tokenmill_spec_accepted_tokens_total;
    // the rule is exercised both ways: drafts kept and drafts rejected, many of each
    assert.ok(accepted > n / 4 && verified - accepted > n / 4, `${name}: ${accepted} of ${verified} drafts accepted`);
    const { x2, df: dof } = chiTwoSample(want, got);
    t.diagnostic(`${name}: ${accepted} of ${verified} drafts accepted; chi-square ${x2.toFixed(1)}, ${dof} degrees of freedom, bound ${chiCrit(dof).toFixed(1)}`);
    assert.ok(dof >= 4, `${name}: ${dof} degrees of freedom`);
    assert.ok(x2 < chiCrit(dof), `${name}: chi-square ${x2.toFixed(1)} over ${dof} degrees of freedom, 0.1 % bound ${chiCrit(dof).toFixed(1)}: ` +
      `target ${JSON.stringify([...want])}, ${name} ${JSON.stringify([...got])}`);
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
