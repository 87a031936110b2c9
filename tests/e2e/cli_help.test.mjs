// cli_help: `tokenmill --help` is the map of the commands. It lists every subcommand that
// src/cli/cmd.h declares, with the sub-verbs each dispatches (grammar bench, bench curves and
// profile, store's verbs), says where the options are, and every option it names for a
// command is one that command's own --help lists (the summary cannot name an option that is
// gone); mkmodel's architectures are the ones mkmodel itself offers.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { bin, root } from "./server.mjs";

const help = (args) => {
  const r = spawnSync(bin, [...args, "--help"], { encoding: "utf8" });
  assert.equal(r.status, 0, `${args.join(" ")} --help: exit ${r.status} ${r.stderr}`);
  return r.stdout + r.stderr;
};

test("top-level --help: every subcommand and sub-verb, options its commands really have", () => {
  const top = help([]);
  const lines = top.split("\n").filter((l) => l.startsWith("  ")).map((l) => l.trim());
  const decl = fs.readFileSync(path.join(root, "src/cli/cmd.h"), "utf8");
  const cmds = [...decl.matchAll(/^int cmd_([a-z0-9_]+)\(/gm)].map((m) => m[1]);
  assert.ok(cmds.length >= 13, `commands declared: ${cmds}`);
  for (const c of cmds) assert.ok(lines.some((l) => l.startsWith(`${c} `)), `top-level --help lacks '${c}'`);
  for (const v of ["grammar print|check|sample|bench", "bench curves", "bench profile", "store stat|ls|gc|fsck", "convert llama2c"])
    assert.ok(top.includes(v), `top-level --help lacks '${v}'`);
  assert.match(top, /tokenmill COMMAND --help' lists every option/);
  const listed = (cmdPath, text) => {
    const own = help(cmdPath);
    for (const opt of text.matchAll(/(?<![\w-])(--?[a-z][a-z0-9-]*)/g))
      assert.ok(new RegExp(`(^|[\\s,\\[(|])${opt[1]}[\\s=,\\]|)]`, "m").test(own),
        `'${cmdPath.join(" ")} --help' does not list ${opt[1]}, which the top-level --help names`);
  };
  // each "; "-separated summary names a command path and options: its own --help lists them;
  // a note "(serve/worker --opt)" names other commands' options
  for (const line of lines) {
    for (let seg of line.split(/; (?=[a-z]+ )/)) {
      for (const m of seg.matchAll(/\(([a-z]+(?:\/[a-z]+)*) ([^)]*)\)/g))
        if (m[1].split("/").every((c) => cmds.includes(c))) {
          for (const c of m[1].split("/")) listed([c], m[2]);
          seg = seg.replace(m[0], "");
        }
      const words = seg.split(" ");
      const cmdPath = [words[0]];
      if (/^[a-z0-9]+$/.test(words[1] ?? "") && ["bench", "convert"].includes(words[0])) cmdPath.push(words[1]);
      listed(cmdPath, seg);
    }
  }
  const archs = (s) => /--arch ([a-z0-9|.-]+)/.exec(s)?.[1];
  assert.equal(archs(lines.find((l) => l.startsWith("mkmodel "))), archs(help(["mkmodel"])));
});
