#!/usr/bin/env node
// bench/dspark_calib: how well a DSpark drafter's confidence head predicts acceptance: the
// confidence of every drafted token against whether the target's greedy verification accepted
// it, binned, from the rounds `tokenmill eval -m TARGET --draft DRAFTER` runs (the drafting
// rounds of llama.cpp's draft-dspark: inject, draft a block, accept the target's greedy
// agreement, roll back).
//
//   bench/dspark_calib [--target T.gguf] [--draft D.gguf | --echo] [--prompts 24] [--rounds 24] [--n-draft 5]
//
// A drafted token counts as tested when every token drafted before it in its block was
// accepted (the k-th is verified only then): the confidence is the head's estimate that the
// target accepts it given those. Without --target / --draft it writes the tests' random pair
// (an mkmodel qwen3 of 4 layers and a gguf_dflash.py DSpark drafter) under bench/out/; with --echo
// the drafter is bench/dspark_echo.py's for the target instead (it drafts the anchor again, so
// drafts pass where the target repeats its last token; its confidence head is the random one).
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { parseArgs } from "./args.mjs";

const root = path.resolve(import.meta.dirname, "..");
const bin = path.join(root, "build/tokenmill");
const o = parseArgs("bench/dspark_calib", [
  { name: "--target", arg: "T.gguf", default: null, help: "the model (default: a random qwen3 under bench/out)" },
  { name: "--draft", arg: "D.gguf", default: null, help: "its DSpark drafter (default: a random one for the default target)" },
  { name: "--echo", kind: "flag", help: "the drafter: bench/dspark_echo.py's for the target (drafts that pass where the target repeats itself)" },
  { name: "--prompts", kind: "number", default: 24, help: "prompts (random token ids)" },
  { name: "--rounds", kind: "number", default: 24, help: "drafting rounds per prompt" },
  { name: "--n-draft", kind: "number", default: 5, help: "tokens drafted per round" },
]);
if (o.draft && o.echo) {
  console.error("bench/dspark_calib: --draft or --echo, not both");
  process.exit(2);
}
const run = (cmd, args) => {
  const r = spawnSync(cmd, args, { cwd: root, encoding: "utf8", maxBuffer: 1 << 28 });
  if (r.status !== 0) throw new Error(`${cmd} ${args.join(" ")}: ${r.stderr}`);
  return r.stdout;
};
fs.mkdirSync(path.join(root, "bench/out"), { recursive: true });
const target = o.target ?? path.join(root, "bench/out/calib-qwen3-target.gguf");
if (!fs.existsSync(target))
  run(bin, ["mkmodel", "--arch", "qwen3", "--layers", "4", "--dim", "256", "--ffn", "512", "--heads", "4", "--kv-heads", "2",
    "--head-dim", "64", "--vocab-size", "2048", "--tied", "--type", "f32", "--seed", "1", "-o", target]);
const draft = o.draft ?? path.join(root, `bench/out/calib-dspark${o.echo ? "-echo-" + path.basename(target, ".gguf") : ""}.gguf`);
if (!fs.existsSync(draft)) {
  const py = ["python3", "/usr/bin/python3"].find((p) => spawnSync(p, ["-c", "import numpy"]).status === 0);
  if (!py) throw new Error("needs python3 with numpy");
  if (o.echo) run(py, ["bench/dspark_echo.py", "--target", target, "-o", draft]);
  else run(py, ["tests/oracle/gguf_dflash.py", "--target", target, "--block", "6", "--markov", "16", "--conf", "-o", draft]);
}
let x = 1;
const rnd = (n) => ((x = (x * 1103515245 + 12345) % 2147483648), x % n);
const seqs = Array.from({ length: o.prompts }, () => Array.from({ length: 8 + rnd(24) }, () => rnd(2000)));
const inFile = path.join(root, "bench/out/calib-in.json");
fs.writeFileSync(inFile, JSON.stringify({ seqs, n_draft: o.nDraft, rounds: o.rounds, mode: "dspark" }));
const lines = run(bin, ["eval", "-m", target, "--draft", draft, "--input", inFile, "--kv", "f32", "--threads", "1"])
  .trim().split("\n").map((l) => JSON.parse(l));
const bins = [0, 0.2, 0.4, 0.6, 0.8, 1.0001].map((lo, i, a) => ({ lo, hi: a[i + 1], n: 0, conf: 0, acc: 0 })).slice(0, 5);
const byPos = Array.from({ length: o.nDraft }, () => ({ n: 0, conf: 0, acc: 0 }));
for (let s = 0; s < seqs.length; s++) {
  const r = lines.filter((l) => l.seq === s);
  for (let i = 0; i + 1 < r.length; i++) {
    const accepted = r[i + 1].pos - r[i].pos - 1;   // the anchor is always kept
    for (let j = 0; j <= Math.min(accepted, r[i].slots.length - 1); j++) {
      const c = r[i].slots[j].conf, ok = j < accepted ? 1 : 0;
      const b = bins.find((b) => c >= b.lo && c < b.hi);
      b.n++, b.conf += c, b.acc += ok;
      byPos[j].n++, byPos[j].conf += c, byPos[j].acc += ok;
    }
  }
}
console.log(`| confidence | drafts tested | mean confidence (predicted) | accepted (measured) |`);
console.log(`|---|---|---|---|`);
for (const b of bins)
  console.log(`| ${b.lo.toFixed(1)}-${Math.min(b.hi, 1).toFixed(1)} | ${b.n} | ${b.n ? (b.conf / b.n).toFixed(3) : "-"} | ${b.n ? (b.acc / b.n).toFixed(3) : "-"} |`);
// The verify count calibrates a request's confidences by one factor, its measured acceptance
// over its tested drafts' mean confidence (docs/spec.md): that factor over all of them here.
const all = bins.reduce((a, b) => ({ n: a.n + b.n, conf: a.conf + b.conf, acc: a.acc + b.acc }), { n: 0, conf: 0, acc: 0 });
if (all.n)
  console.log(`\nall ${all.n} tested: mean confidence ${(all.conf / all.n).toFixed(3)}, accepted ${(all.acc / all.n).toFixed(3)}; ` +
    `the verify count prices a draft at its confidence x ${(all.acc / all.conf).toFixed(3)} (measured / mean confidence)`);
console.log(`\n| drafted position | tested | mean confidence | accepted |`);
console.log(`|---|---|---|---|`);
byPos.forEach((p, j) => console.log(`| ${j + 1} | ${p.n} | ${p.n ? (p.conf / p.n).toFixed(3) : "-"} | ${p.n ? (p.acc / p.n).toFixed(3) : "-"} |`));
