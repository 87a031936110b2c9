// container: the Dockerfile against what the rest of the repository says. Always: Debian 12 in
// both stages, the build stage's packages are the -dev packages scripts/deps.sh installs for the
// build, the runtime stage has each one's library, a non-root USER, EXPOSE of the port the
// Kubernetes manifests' containers listen on, a HEALTHCHECK on /health, the entrypoint
// `tokenmill serve` at the path the manifests run, and every manifest names the image the
// README's build command tags. With a daemonless builder present (podman, else buildah; never
// installed by the tests) the image is built, and with podman run: /health answers 200 on the
// bundled model as the non-root user. Without one the build is skipped, saying so.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync, execFileSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { root } from "./server.mjs";

const dockerfile = fs.readFileSync(path.join(root, "Dockerfile"), "utf8");
const lines = dockerfile.split("\n").filter((l) => !l.startsWith("#"));
const stages = dockerfile.split(/^FROM /m).slice(1);
const deps = fs.readFileSync(path.join(root, "scripts/deps.sh"), "utf8");
const IMAGE = "tokenmill:latest";

// the -dev package a runtime library comes from, as Debian 12 names them
const runtimeOf = { "libpcre2-dev": "libpcre2-8-0", "libssl-dev": "libssl3", "libjansson-dev": "libjansson4",
  "libmicrohttpd-dev": "libmicrohttpd12", "libisal-dev": "libisal2" };

test("the Dockerfile: Debian 12, deps.sh's build packages, non-root, EXPOSE, HEALTHCHECK /health, tokenmill serve", () => {
  assert.equal(stages.length, 2);
  for (const s of stages) assert.match(s, /^docker\.io\/library\/debian:12(-slim)?\b/);
  const depsList = deps.match(/for p in ([^;]+); do/)[1].split(/\s+/);
  const devs = depsList.filter((p) => p.startsWith("lib") && p.endsWith("-dev") && runtimeOf[p]);
  assert.equal(devs.length, Object.keys(runtimeOf).length, "deps.sh installs the five libraries' -dev packages");
  for (const d of [...devs, "build-essential", "pkg-config"]) {
    assert.ok(depsList.includes(d), `deps.sh has ${d}`);
    assert.match(stages[0], new RegExp(`\\s${d}\\s`), `the build stage installs ${d}`);
  }
  for (const d of devs) assert.match(stages[1], new RegExp(`\\s${runtimeOf[d]}\\s`), `the runtime stage installs ${runtimeOf[d]}`);
  const user = lines.find((l) => l.startsWith("USER "));
  assert.ok(user && !/\broot\b|\b0\b/.test(user), "a non-root USER");
  assert.match(dockerfile, /^HEALTHCHECK .*\n?.*\/health/m);
  assert.match(dockerfile, /^ENTRYPOINT \["\/usr\/local\/bin\/tokenmill", "serve"\]$/m);
  const exposed = dockerfile.match(/^EXPOSE (\d+)$/m)[1];
  assert.match(dockerfile, new RegExp(`^CMD .*"--port", "${exposed}"`, "m"));
  // the manifests: the image, the binary's path, the port
  const kube = path.join(root, "deploy/kubernetes");
  let named = 0;
  for (const f of fs.readdirSync(kube).filter((x) => x.endsWith(".yaml"))) {
    const y = fs.readFileSync(path.join(kube, f), "utf8");
    for (const m of y.matchAll(/image: (\S+)/g)) {
      named++;
      assert.equal(m[1], IMAGE, `${f} names the image this Dockerfile builds`);
    }
    for (const m of y.matchAll(/command: \["([^"]+)"\]/g)) assert.equal(m[1], "/usr/local/bin/tokenmill", f);
    for (const m of y.matchAll(/name: http, containerPort: (\d+)/g)) assert.equal(m[1], exposed, `${f}: the HTTP port the image exposes`);
  }
  assert.ok(named >= 2);
  assert.match(fs.readFileSync(path.join(root, "README.md"), "utf8"), new RegExp(`build -t ${IMAGE.replace(".", "\\.")} \\.`));
});

const have = (cmd) => spawnSync(cmd, ["--version"], { stdio: "ignore" }).status === 0;
const builder = have("podman") ? "podman" : have("buildah") ? "buildah" : null;

test("the image builds with a daemonless builder and answers /health", { timeout: 1200_000 }, (t) => {
  if (!builder) {
    t.skip("neither podman nor buildah is installed: the image build is not tested here");
    return;
  }
  const tag = "localhost/tokenmill-e2e:test";
  const args = builder === "podman" ? ["build", "-t", tag, root] : ["bud", "-t", tag, root];
  const b = spawnSync(builder, args, { encoding: "utf8", maxBuffer: 64 << 20 });
  assert.equal(b.status, 0, b.stderr.slice(-4000));
  try {
    if (builder !== "podman") return;   // buildah builds; running it is podman's
    const name = "tokenmill-e2e-" + process.pid;
    execFileSync("podman", ["run", "-d", "--name", name, "-p", "127.0.0.1::8080", tag, "-m",
      "/usr/share/tokenmill/stories260K.gguf", "--host", "0.0.0.0", "--port", "8080"]);
    try {
      const port = execFileSync("podman", ["port", name, "8080"], { encoding: "utf8" }).trim().split(":").pop();
      const uid = execFileSync("podman", ["exec", name, "id", "-u"], { encoding: "utf8" }).trim();
      assert.notEqual(uid, "0");
      let ok = false;
      for (let i = 0; i < 60 && !ok; i++) {
        ok = spawnSync("curl", ["-fsS", `http://127.0.0.1:${port}/health`]).status === 0;
        if (!ok) execFileSync("sleep", ["1"]);
      }
      assert.ok(ok, "/health answers 200");
    } finally {
      spawnSync("podman", ["rm", "-f", name]);
    }
  } finally {
    spawnSync(builder === "podman" ? "podman" : "buildah", ["rmi", "-f", tag]);
  }
});
