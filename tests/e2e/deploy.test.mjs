// deploy: the systemd unit and the Kubernetes manifests of deploy/ against tokenmill itself:
// every flag they pass is one that `tokenmill <command> --help` lists, every $(VAR) an args
// list uses is defined in the same file, every document names its apiVersion, kind and
// metadata.name, and the time SIGTERM's drain gets (--drain-timeout) fits in the grace period
// (terminationGracePeriodSeconds, TimeoutStopSec). The manifests keep their args as one-line
// flow lists (JSON), so this reads them without a YAML parser.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { root, bin } from "./server.mjs";

const help = {};
function flagsOf(cmd) {
  if (!help[cmd]) {
    const r = spawnSync(bin, [cmd, "--help"], { encoding: "utf8" });
    help[cmd] = new Set([...(r.stdout + r.stderr).matchAll(/(?:^|[\s,])(--?[a-z][a-z0-9-]*)/gm)].map((m) => m[1]));
  }
  return help[cmd];
}

function checkArgs(args, where) {
  const cmd = args[0];
  assert.ok(["serve", "gateway", "worker"].includes(cmd), `${where}: command ${cmd}`);
  const known = flagsOf(cmd);
  assert.ok(known.size > 5, `${cmd} --help lists its options`);
  for (const a of args.slice(1)) if (/^--?[a-z]/.test(a)) assert.ok(known.has(a), `${where}: ${cmd} has no option ${a}`);
  const i = args.indexOf("--drain-timeout");
  return i >= 0 ? Number(args[i + 1]) : null;
}

test("the Kubernetes manifests use tokenmill's own flags and fit the drain in the grace period", () => {
  const dir = path.join(root, "deploy/kubernetes");
  const files = fs.readdirSync(dir).filter((f) => f.endsWith(".yaml"));
  assert.ok(files.includes("serve.yaml") && files.includes("cluster.yaml"));
  let nArgs = 0;
  for (const f of files) {
    const text = fs.readFileSync(path.join(dir, f), "utf8");
    for (const doc of text.split(/^---$/m)) {
      assert.match(doc, /^apiVersion: \S+$/m, `${f}: apiVersion`);
      assert.match(doc, /^kind: [A-Z]\w+$/m, `${f}: kind`);
      assert.match(doc, /^metadata:\n\s+name: [a-z0-9-]+$/m, `${f}: metadata.name`);
      const grace = /terminationGracePeriodSeconds: (\d+)/.exec(doc);
      for (const m of doc.matchAll(/^\s+args: (\[.*\])$/gm)) {
        const args = JSON.parse(m[1]);
        nArgs++;
        const drain = checkArgs(args, f);
        if (drain !== null) assert.ok(grace && Number(grace[1]) > drain, `${f}: grace period above --drain-timeout ${drain}`);
        for (const v of m[1].matchAll(/\$\((\w+)\)/g)) assert.match(doc, new RegExp(`- name: ${v[1]}$`, "m"), `${f}: ${v[1]} defined`);
      }
    }
  }
  assert.ok(nArgs >= 4, "serve, gateway, prefill and decode workers");
});

test("the systemd unit uses tokenmill's own flags and stops after the drain", () => {
  const text = fs.readFileSync(path.join(root, "deploy/systemd/tokenmill.service"), "utf8");
  const exec = /^ExecStart=(\S+) (.*)$/m.exec(text);
  assert.ok(exec, "ExecStart");
  const drain = checkArgs(exec[2].split(/\s+/), "tokenmill.service");
  const stop = Number(/^TimeoutStopSec=(\d+)$/m.exec(text)[1]);
  assert.ok(drain !== null && stop > drain, `TimeoutStopSec ${stop} above --drain-timeout ${drain}`);
  assert.match(text, /^KillSignal=SIGTERM$/m);
});
