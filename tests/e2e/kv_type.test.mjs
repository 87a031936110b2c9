// kv_type: `--kv-type q8_0|q4_0` through the whole operation on a generated llama (head size 64,
// so llama.cpp's Walsh-Hadamard rotation applies; oracle_kvq.test.mjs holds the numbers against
// llama.cpp). Per type: a 300-token prompt computes two full blocks; sent again it attaches them
// and answers as the first time; after a restart they come from the block store with the same
// answer, and a block on disk is about half an f16 one (`store stat`); a gateway with a prefill and
// a decode worker of that type answers as the one process (the 44-token tail travels quantised
// in the handoff), and a worker of another KV type is refused by that cluster.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync, spawn } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";

import { bin, startServer as startServerOf, startCluster, stopServers, completeCached, assertCachedAndRestored }
  from "./server.mjs";

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "tm-kvtype-"));
const model = path.join(tmp, "llama.gguf");
const NAME = "kv-test";
const PROMPT = Array.from({ length: 300 }, (_, i) => 300 + ((i * 7919) % 3000));

before(() => {
  execFileSync(bin, ["mkmodel", "--arch", "llama", "--layers", "2", "--vocab-size", "4096", "--type", "q8_0", "--seed", "3",
    "-o", model], { stdio: "ignore" });
});

after(async () => {
  await stopServers();
  fs.rmSync(tmp, { recursive: true, force: true });
});

const complete = (srv) => completeCached(srv, NAME, PROMPT);

// The bytes of one stored block: `store stat`'s size line for the store's one shape.
function blockBytes(store) {
  const out = execFileSync(bin, ["store", "stat", `dir:${store}`], { encoding: "utf8" });
  const m = out.match(/(\d+) blocks?, (\d+) bytes/) || out.match(/blocks:\s*(\d+)[^\n]*?bytes:\s*(\d+)/);
  assert.ok(m, `store stat names blocks and bytes:\n${out}`);
  assert.ok(Number(m[1]) > 0, out);
  return Number(m[2]) / Number(m[1]);
}

async function served(kv) {
  const store = path.join(tmp, `store-${kv}`);
  fs.mkdirSync(store);
  const args = ["--ctx", "512", "--max-seqs", "2", "--model-name", NAME, "--cache-dir", store, "--kv-type", kv];
  const first = await assertCachedAndRestored(async () => {
    const S = await startServerOf(model, args);
    assert.match(S.log, new RegExp(`KV ${kv}, \\d+ blocks`), "the start-up line names the KV type");
    return S;
  }, complete);
  return { first, bytes: blockBytes(store) };
}

test("q8_0 and q4_0: blocks in RAM, on disk and in handoffs answer as the uncached prompt; a block is half or less of f16's",
  { timeout: 240000 }, async () => {
    const f16 = await served("f16");
    for (const kv of ["q8_0", "q4_0"]) {
      const r = await served(kv);
      // rows of 64: f16 128 bytes, q8_0 68 (34 per 32), q4_0 36 (18 per 32), plus the block's header
      const want = kv === "q8_0" ? 68 / 128 : 36 / 128;
      const ratio = r.bytes / f16.bytes;
      assert.ok(Math.abs(ratio - want) < 0.03, `${kv}: a block is ${ratio.toFixed(3)} of f16's, want ~${want.toFixed(3)}`);
      // split: the prefill worker computes and stores, the decode worker takes the tail quantised
      const C = await startCluster(model, ["prefill", "decode"], {
        gatewayArgs: ["--model-name", NAME, "--register", "127.0.0.1:0"], workerArgs: ["--kv-type", kv, "--ctx", "512"] });
      const split = await complete(C);
      assert.equal(split.text, r.first.text, `${kv}: gateway + workers answer as serve`);
      // a worker of another KV type is not let into this cluster
      const w = spawn(bin, ["worker", "--role", "decode", "-m", model, "--gateway", C.register ?? "127.0.0.1:1", "--listen",
        "127.0.0.1:0", "--cache", "off", "--threads", "1", "--name", "odd"], { env: C.env });
      let log = "";
      w.stderr.on("data", (d) => (log += d));
      const admin = async () => (await (await fetch(`${C.url}/admin/workers`)).json()).workers;
      for (let i = 0; i < 300 && !/refused by the gateway/.test(log); i++) await new Promise((res) => setTimeout(res, 20));
      w.kill();
      assert.match(log, /refused by the gateway [^:]+:\d+: the vocabulary or KV type differs/, log);
      assert.ok(!(await admin()).some((x) => x.name === "odd" && x.up), "the f16 worker is not up in the cluster");
      await stopServers();
    }
  });
