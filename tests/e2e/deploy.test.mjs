// deploy: the systemd unit and the Kubernetes manifests of deploy/ against tokenmill itself and
// against Kubernetes: every manifest document is valid for its apiVersion and kind by the
// Kubernetes API's own schemas (the npm package kubernetes-models, objects read from the YAML
// as Kubernetes reads it: yaml_subset.mjs), and a deliberately broken copy is refused; every
// flag the manifests and the unit pass is one that `tokenmill <command> --help` lists, every
// $(VAR) a container's args use is in its env, and the time SIGTERM's drain gets
// (--drain-timeout) fits in the grace period (terminationGracePeriodSeconds, TimeoutStopSec).
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { root, bin } from "./server.mjs";
import { yamlDocs } from "./yaml_subset.mjs";

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

const kubeDir = path.join(root, "deploy/kubernetes");
const manifests = () => fs.readdirSync(kubeDir).filter((f) => f.endsWith(".yaml"));

// Validates one document with the model of its apiVersion and kind (throws when invalid).
async function kubeValidate(doc, where) {
  assert.ok(doc && typeof doc.apiVersion === "string" && typeof doc.kind === "string", `${where}: apiVersion and kind`);
  const mod = await import(`kubernetes-models/${doc.apiVersion}`);
  const Model = mod[doc.kind];
  assert.equal(typeof Model, "function", `${where}: no Kubernetes model for ${doc.apiVersion} ${doc.kind}`);
  new Model(doc).validate();
}

test("the Kubernetes manifests are valid for the Kubernetes API's schemas", async () => {
  const kinds = new Set();
  for (const f of manifests()) {
    const docs = yamlDocs(fs.readFileSync(path.join(kubeDir, f), "utf8"));
    assert.ok(docs.length > 0, `${f}: documents`);
    for (const d of docs) {
      const where = `${f}: ${d.kind} ${d.metadata?.name}`;
      assert.match(d.metadata?.name ?? "", /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/, `${where}: metadata.name`);
      await kubeValidate(d, where);
      kinds.add(d.kind);
      if (d.kind === "ConfigMap") for (const [k, v] of Object.entries(d.data ?? {})) if (k.endsWith(".yaml")) yamlDocs(v);
    }
  }
  for (const k of ["Deployment", "Service", "PersistentVolumeClaim", "HorizontalPodAutoscaler", "Secret"])
    assert.ok(kinds.has(k), `a ${k} among the manifests`);
});

test("a broken manifest is refused by the schema check", async () => {
  const text = fs.readFileSync(path.join(kubeDir, "serve.yaml"), "utf8");
  const valid = yamlDocs(text).find((d) => d.kind === "Deployment");
  await kubeValidate(valid, "serve.yaml");
  // a port given a name where a number belongs, a probe's period as text, a Deployment
  // without its selector: each copy must fail, naming the field
  const broken = [
    [/containerPort: 8080/, "containerPort: eighty", /containerPort/],
    [/periodSeconds: 2$/m, 'periodSeconds: "2s"', /periodSeconds/],
    [/^  selector:\n    matchLabels: .*\n/m, "", /selector/],
  ];
  for (const [from, to, field] of broken) {
    assert.match(text, from);
    const d = yamlDocs(text.replace(from, to)).find((x) => x.kind === "Deployment");
    await assert.rejects(kubeValidate(d, "broken serve.yaml"), field, `${from} -> ${to} is refused`);
  }
  assert.throws(() => yamlDocs(text.replace("replicas: 1", "replicas: 1\n\tpaused: true")), /tab/);
});

test("the Kubernetes manifests use tokenmill's own flags and fit the drain in the grace period", () => {
  const files = manifests();
  assert.ok(files.includes("serve.yaml") && files.includes("cluster.yaml"));
  let nArgs = 0;
  for (const f of files)
    for (const d of yamlDocs(fs.readFileSync(path.join(kubeDir, f), "utf8"))) {
      if (d.kind !== "Deployment") continue;
      const pod = d.spec.template.spec;
      for (const c of pod.containers) {
        if (!c.args) continue;
        nArgs++;
        const where = `${f}: ${d.metadata.name}`;
        const drain = checkArgs(c.args, where);
        if (drain !== null) assert.ok(pod.terminationGracePeriodSeconds > drain, `${where}: grace period above --drain-timeout ${drain}`);
        const env = new Set((c.env ?? []).map((e) => e.name));
        for (const v of c.args.join(" ").matchAll(/\$\((\w+)\)/g)) assert.ok(env.has(v[1]), `${where}: ${v[1]} defined`);
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
