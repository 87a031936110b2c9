// bench_profile: `tokenmill bench profile` on a generated qwen3 model: the JSON names every
// stage of a dense layer with its share of the step (the shares add up to one), counts the
// profiled steps and has one row per layer plus the stages outside the layers; the table form
// prints the same stages; --limit (here and in `bench`) adds the steps held against a read of
// their bytes. No timing is compared (the machine is shared). Bad options exit 2.
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync, spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { bin } from "./server.mjs";

test("bench profile: per-stage and per-layer decode time as JSON and as a table", () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "tm-profile-"));
  try {
    const model = path.join(dir, "q3.gguf");
    execFileSync(bin, ["mkmodel", "--arch", "qwen3", "--preset", "tiny", "--type", "q8_0", "--seed", "3", "-o", model], { stdio: "pipe" });
    const r = JSON.parse(execFileSync(bin, ["bench", "profile", "-m", model, "-t", "2", "--tg", "4", "--depth", "8", "--json"], { encoding: "utf8" }));
    assert.equal(r.steps, 4);
    assert.equal(r.threads, 2);
    const ops = Object.fromEntries(r.ops.map((o) => [o.op, o]));
    for (const op of ["embed", "qkv", "qkv_post", "attention", "wo", "add_norm", "ffn_up", "swiglu", "ffn_down", "out_norm", "output"])
      assert.ok(ops[op], `stage ${op} missing: ${JSON.stringify(r.ops)}`);
    assert.ok(!ops.moe, "a dense model has no MoE stage");
    const share = r.ops.reduce((s, o) => s + o.share, 0);
    assert.ok(Math.abs(share - 1) < 1e-3, `shares add up to ${share}`);
    assert.ok(ops.qkv.bytes > 0 && ops.output.bytes > 0 && ops.attention.bytes === 0);
    assert.ok(ops.attention.rounds >= 1, "attention runs on the pool");
    assert.ok(r.step_ms > 0 && r.staged_ms > 0 && r.staged_ms <= r.step_ms * 1.001);
    const layers = r.layers.filter((l) => l.layer !== "outside");
    assert.equal(r.layers.length, layers.length + 1);
    assert.ok(r.layers.at(-1).ops.output > 0 && typeof r.layers.at(-1).ops.embed === "number");
    // every layer runs its projections and its attention on every step (figures in ms to 4 places)
    assert.ok(layers.length >= 1 && layers.every((l, i) => l.layer === i && l.ops.qkv > 0 && l.ops.attention > 0),
      JSON.stringify(layers));
    // --limit: the steps again, each held against a read of the bytes it reads (shapes only)
    const lim = JSON.parse(execFileSync(bin, ["bench", "profile", "-m", model, "-t", "2", "--tg", "5", "--limit", "--json"], { encoding: "utf8" })).limit;
    assert.equal(lim.steps, 5);
    assert.ok(lim.bytes > 0 && lim.bytes <= r.weight_bytes && lim.bytes % 64 === 0, JSON.stringify(lim));
    assert.ok(lim.tok_s > 0 && lim.read_gb_s > 0, JSON.stringify(lim));
    assert.ok(lim.share.length === 3 && lim.share[0] > 0 && lim.share[0] <= lim.share[1] && lim.share[1] <= lim.share[2],
      JSON.stringify(lim));
    assert.equal(r.limit, undefined, "no --limit, no limit figures");
    const bl = JSON.parse(execFileSync(bin, ["bench", "-m", model, "-t", "2", "--pp", "8", "--tg", "4", "--seqs", "1", "--reps", "1", "--limit"], { encoding: "utf8" }));
    assert.equal(bl.tg_limit.steps, 4);
    assert.equal(bl.tg_limit.bytes, lim.bytes);
    assert.ok(bl.tg_limit.share[1] > 0 && bl.tg.tok_s.length === 1 && bl.batched.length === 1, JSON.stringify(bl));
    const nol = JSON.parse(execFileSync(bin, ["bench", "-m", model, "-t", "1", "--pp", "8", "--tg", "2", "--seqs", "1", "--reps", "1"], { encoding: "utf8" }));
    assert.equal(nol.tg_limit, undefined);
    const tl = execFileSync(bin, ["bench", "profile", "-m", model, "-t", "1", "--tg", "2", "--limit"], { encoding: "utf8" });
    assert.match(tl, /^--limit: 2 steps again .* a step streams at [\d.]+ % of the read after it/m);
    const table = execFileSync(bin, ["bench", "profile", "-m", model, "-t", "1", "--tg", "2"], { encoding: "utf8" });
    assert.match(table, /^stage +ms\/token +share/m);
    assert.match(table, /^attention /m);
    assert.match(table, /per layer, ms\/token:/);
    for (const args of [["--tg", "0"], ["--depth", "x"], ["--bogus"]]) {
      const bad = spawnSync(bin, ["bench", "profile", "-m", model, ...args], { encoding: "utf8" });
      assert.equal(bad.status, 2, args.join(" "));
      assert.match(bad.stderr, /tokenmill bench profile/);
    }
    const none = spawnSync(bin, ["bench", "profile"], { encoding: "utf8" });
    assert.equal(none.status, 2);
    // thread placement: --cpus pins to the listed CPUs; a list the process cannot use is refused
    const one = spawnSync(bin, ["bench", "profile", "-m", model, "--cpus", "0", "--tg", "1", "--json"], { encoding: "utf8" });
    assert.equal(one.status, 0, one.stderr);
    assert.match(one.stderr, /threads: 1 thread on CPU 0: 1 of 1 physical cores, 0 SMT siblings, 1 of 1 NUMA node/);
    assert.equal(JSON.parse(one.stdout).threads, 1);
    for (const cpus of ["1000", "0-x", ""]) {
      const bad = spawnSync(bin, ["bench", "profile", "-m", model, "--cpus", cpus, "--tg", "1"], { encoding: "utf8" });
      assert.equal(bad.status, 2, cpus);
      assert.match(bad.stderr, /--cpus: /);
    }
    // the default is one thread per physical core: on a tree where CPUs 0 and 1 are SMT
    // siblings of one core (and both allowed here), one thread
    const sys = path.join(dir, "sys");
    fs.mkdirSync(path.join(sys, "devices/system/cpu"), { recursive: true });
    fs.writeFileSync(path.join(sys, "devices/system/cpu/online"), "0-1\n");
    for (const c of [0, 1]) {
      fs.mkdirSync(path.join(sys, `devices/system/cpu/cpu${c}/topology`), { recursive: true });
      fs.writeFileSync(path.join(sys, `devices/system/cpu/cpu${c}/topology/thread_siblings_list`), "0-1\n");
    }
    const smt = spawnSync(bin, ["bench", "profile", "-m", model, "--tg", "1", "--json"],
      { encoding: "utf8", env: { ...process.env, TOKENMILL_TEST_SYSFS: sys } });
    assert.equal(smt.status, 0, smt.stderr);
    if (os.availableParallelism() >= 2 && /^0-1|^0,1/.test(fs.readFileSync("/proc/self/status", "utf8").match(/Cpus_allowed_list:\s*(\S+)/)[1])) {
      assert.match(smt.stderr, /threads: 1 thread on CPU 0: 1 of 1 physical cores/);
      assert.equal(JSON.parse(smt.stdout).threads, 1);
      // two separate cores: one thread without --cpus is left unpinned (other processes
      // would pin theirs to the same first core)
      for (const c of [0, 1])
        fs.writeFileSync(path.join(sys, `devices/system/cpu/cpu${c}/topology/thread_siblings_list`), `${c}\n`);
      const few = spawnSync(bin, ["bench", "profile", "-m", model, "-t", "1", "--tg", "1", "--json"],
        { encoding: "utf8", env: { ...process.env, TOKENMILL_TEST_SYSFS: sys } });
      assert.equal(few.status, 0, few.stderr);
      assert.match(few.stderr, /threads: 1 on 2 usable physical cores, not pinned/);
    }
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
