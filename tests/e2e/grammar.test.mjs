// grammar.test.mjs: structured output end to end through `tokenmill grammar`.
//  - The JSON-Schema-Test-Suite (npm json-schema-test-suite, draft 4): for every group whose
//    schema compiles, the automaton accepts exactly the documents the suite calls valid;
//    groups that do not compile are refused with the unsupported keyword named.
//  - With random-weight models (the hardest case: they never "want" the format) at
//    temperature 1, N samples per realistic schema (nested objects, arrays of objects, enums,
//    optional fields, recursion, patterns, formats) all end, parse and validate with ajv; the
//    same on the 151k-token Qwen2 vocabulary, whose tokens cross JSON terminals.
//  - Regexes: every sample matches the regex (JavaScript's RegExp, anchored).
//  - llama.cpp's grammars/*.gbnf all load; samples of the JSON ones parse, and every sample
//    that ended is accepted by the byte-level checker.
//  - Greedy output under a grammar that allows all text equals unconstrained output.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync, spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import AjvModule from "ajv";
import { root, bin } from "./server.mjs";

const Ajv = AjvModule.default ?? AjvModule;
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "tm-grammar-"));
const model = path.join(tmp, "tiny.gguf");
const modelQwen = path.join(tmp, "qwen.gguf");
const qwenVocab = path.join(root, "tests/data/llama.cpp/models/ggml-vocab-qwen2.gguf");
const grammars = path.join(root, "tests/data/llama.cpp/grammars");
const suite = path.join(root, "node_modules/json-schema-test-suite/tests/draft4");
let n = 0;

before(() => {
  execFileSync(bin, ["mkmodel", "--arch", "qwen3", "--preset", "tiny", "--type", "q8_0", "--seed", "7", "-o", model],
    { stdio: "pipe" });
  execFileSync(bin, ["mkmodel", "--arch", "qwen3", "--preset", "tiny", "--vocab", qwenVocab, "--type", "q8_0",
    "--seed", "5", "-o", modelQwen], { stdio: "pipe" });
});
after(() => fs.rmSync(tmp, { recursive: true, force: true }));

function grammarArgs(g) {
  if (g.schema) {
    const f = path.join(tmp, `schema-${n++}.json`);
    fs.writeFileSync(f, JSON.stringify(g.schema));
    return ["--schema", f];
  }
  if (g.regex !== undefined) return ["--regex", g.regex];
  if (g.gbnf) return ["--gbnf", g.gbnf];
  return [];
}

function check(g, docs) {
  const f = path.join(tmp, `docs-${n++}.json`);
  fs.writeFileSync(f, JSON.stringify(docs));
  return spawnSync(bin, ["grammar", "check", ...grammarArgs(g), "--input", f], { encoding: "utf8", timeout: 60000 });
}

function sample(g, { m = model, samples = 8, maxTokens = 1500, temp = 1, seed = 1, prompt = "JSON:" } = {}) {
  const r = spawnSync(bin, ["grammar", "sample", "-m", m, ...grammarArgs(g), "-n", String(samples), "--max-tokens",
    String(maxTokens), "--temp", String(temp), "--seed", String(seed), "-p", prompt, "--ctx", "4096", "-t", "1"],
    { encoding: "utf8", timeout: 300000, maxBuffer: 64 << 20 });
  assert.equal(r.status, 0, r.stderr);
  return JSON.parse(r.stdout);
}

test("JSON-Schema-Test-Suite draft 4: compiled schemas accept exactly the valid documents", () => {
  let compiled = 0, refused = 0, checked = 0;
  const mismatches = [];
  for (const file of fs.readdirSync(suite).filter((f) => f.endsWith(".json")).sort()) {
    for (const group of JSON.parse(fs.readFileSync(path.join(suite, file), "utf8"))) {
      const r = check({ schema: group.schema }, group.tests.map((t) => JSON.stringify(t.data)));
      if (r.status !== 0) {
        // refused: it must say why, naming what is not supported
        assert.match(r.stderr, /tokenmill grammar: schema: (unsupported keyword|.*only local references|.*non-integer number)/,
          `${file} / ${group.description}: ${r.stderr}`);
        refused++;
        continue;
      }
      compiled++;
      const accepted = JSON.parse(r.stdout);
      group.tests.forEach((t, i) => {
        checked++;
        if (accepted[i] !== t.valid)
          mismatches.push(`${file} / ${group.description} / ${t.description}: valid ${t.valid}, accepted ${accepted[i]}`);
      });
    }
  }
  assert.deepEqual(mismatches, []);
  // the supported keywords cover most of the suite
  assert.ok(compiled >= 30 && checked >= 120, `compiled ${compiled} groups, ${checked} documents`);
  assert.ok(refused > 0);
});

const schemas = {
  person: {
    type: "object",
    properties: {
      name: { type: "string", minLength: 1, maxLength: 12 },
      age: { type: "integer", minimum: 0, maximum: 130 },
      role: { enum: ["admin", "user", "guest"] },
      address: {
        type: "object",
        properties: {
          city: { type: "string", maxLength: 10 },
          zip: { type: "string", pattern: "^[0-9]{5}$" },
        },
        required: ["city", "zip"],
        additionalProperties: false,
      },
      nickname: { type: ["string", "null"], maxLength: 8 },
    },
    required: ["name", "age", "role"],
    additionalProperties: false,
  },
  order: {
    type: "object",
    properties: {
      id: { type: "string", format: "uuid" },
      created: { type: "string", format: "date-time" },
      lines: {
        type: "array",
        minItems: 1,
        maxItems: 3,
        items: {
          type: "object",
          properties: {
            sku: { type: "string", pattern: "^[A-Z]{3}-[0-9]{4}$" },
            quantity: { type: "integer", minimum: 1, maximum: 99 },
            price: { type: "number", minimum: 0 },
            gift: { type: "boolean" },
          },
          required: ["sku", "quantity", "price"],
          additionalProperties: false,
        },
      },
      status: { const: "open" },
    },
    required: ["id", "lines", "status"],
    additionalProperties: false,
  },
  tree: {
    $ref: "#/definitions/node",
    definitions: {
      node: {
        type: "object",
        properties: {
          label: { type: "string", maxLength: 6 },
          children: { type: "array", maxItems: 2, items: { $ref: "#/definitions/node" } },
        },
        required: ["label"],
        additionalProperties: false,
      },
    },
  },
  call: {
    type: "object",
    properties: {
      name: { const: "get_weather" },
      arguments: {
        type: "object",
        properties: {
          location: { type: "string", maxLength: 16 },
          unit: { anyOf: [{ enum: ["celsius", "fahrenheit"] }, { type: "null" }] },
          days: { type: "integer", minimum: 1, maximum: 14 },
          when: { type: "string", format: "date" },
        },
        required: ["location", "unit"],
        additionalProperties: false,
      },
    },
    required: ["name", "arguments"],
    additionalProperties: false,
  },
  open: {
    type: "object",
    properties: { kind: { enum: ["a", "b"] }, tags: { type: "array", items: { type: "string", maxLength: 4 }, maxItems: 4 } },
    required: ["kind"],
  },
};

function validator() {
  const ajv = new Ajv({ strict: false });
  ajv.addFormat("uuid", /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i);
  ajv.addFormat("date", /^\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])$/);
  ajv.addFormat("date-time", /^\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])T([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d+)?(Z|[+-]([01]\d|2[0-3]):[0-5]\d)$/);
  return ajv;
}

function assertValidSamples(name, schema, outs) {
  const validate = validator().compile(schema);
  for (const [i, o] of outs.entries()) {
    assert.equal(o.finish, "stop", `${name} #${i}: ended by ${o.finish} after ${o.tokens} tokens: ${o.text}`);
    let doc;
    assert.doesNotThrow(() => { doc = JSON.parse(o.text); }, `${name} #${i}: not JSON: ${o.text}`);
    assert.ok(validate(doc), `${name} #${i}: ${JSON.stringify(validate.errors)}: ${o.text}`);
  }
}

test("random-weight model, temperature 1: every sample of every schema is valid (ajv)", () => {
  for (const [name, schema] of Object.entries(schemas)) {
    const outs = sample({ schema }, { samples: 8, seed: 11 });
    assert.equal(outs.length, 8);
    assertValidSamples(name, schema, outs);
  }
});

test("151k-token vocabulary (tokens cross terminals): samples are valid", () => {
  for (const name of ["person", "call", "tree"]) {
    const outs = sample({ schema: schemas[name] }, { m: modelQwen, samples: 4, seed: 3 });
    assertValidSamples(name, schemas[name], outs);
  }
});

test("the budget running out inside a document ends with finish length", () => {
  const outs = sample({ schema: schemas.order }, { samples: 2, maxTokens: 5 });
  for (const o of outs) {
    assert.equal(o.finish, "length");
    assert.equal(o.tokens, 5);
  }
});

test("regexes: every sample matches", () => {
  const regexes = ["\\(\\d{3}\\) \\d{3}-\\d{4}", "(yes|no|maybe)", "#[0-9a-f]{6}", "[a-z]{2,8}@[a-z]{3,6}\\.(com|org)",
    "(\\d{1,3}\\.){3}\\d{1,3}", "[A-Z][a-z]{1,8}( [A-Z][a-z]{1,8})?, [0-9]{4}", "é{1,4}[^\\x00-\\x7F]{2}"];
  for (const re of regexes) {
    for (const m of [model, modelQwen]) {
      const outs = sample({ regex: re }, { m, samples: 6, maxTokens: 200, seed: 5 });
      const rx = new RegExp(`^(?:${re})$`, "u");
      for (const o of outs) {
        assert.equal(o.finish, "stop", `${re}: ${JSON.stringify(o)}`);
        assert.match(o.text, rx, `${re}: ${JSON.stringify(o.text)}`);
      }
    }
  }
});

test("llama.cpp's grammars/*.gbnf load; samples are in the language", () => {
  const files = fs.readdirSync(grammars).filter((f) => f.endsWith(".gbnf")).sort();
  assert.ok(files.length >= 8, files.join(","));
  for (const f of files) {
    const gbnf = path.join(grammars, f);
    const p = spawnSync(bin, ["grammar", "print", "--gbnf", gbnf], { encoding: "utf8" });
    assert.equal(p.status, 0, `${f}: ${p.stderr}`);
    const outs = sample({ gbnf }, { samples: 4, maxTokens: 300, seed: 2 });
    const ended = outs.filter((o) => o.finish === "stop");
    for (const o of outs) assert.ok(o.finish === "stop" || o.finish === "length", `${f}: ${o.finish}`);
    if (f.startsWith("json")) {
      assert.equal(ended.length, outs.length, `${f}: ${JSON.stringify(outs)}`);
      for (const o of outs) assert.doesNotThrow(() => JSON.parse(o.text), `${f}: ${o.text}`);
    }
    if (ended.length) {
      const r = check({ gbnf }, ended.map((o) => o.text));
      assert.equal(r.status, 0, r.stderr);
      assert.deepEqual(JSON.parse(r.stdout), ended.map(() => true), `${f}: ${JSON.stringify(ended)}`);
    }
  }
});

test("greedy output under an allow-all grammar equals unconstrained output", () => {
  const stories = path.join(root, "models/stories260K.gguf");
  const all = path.join(tmp, "all.gbnf");
  fs.writeFileSync(all, "root ::= .*\n");
  const opts = { m: stories, samples: 2, maxTokens: 200, temp: 0, prompt: "" };
  const free = sample({}, opts), constrained = sample({ gbnf: all }, opts);
  assert.ok(free[0].tokens > 50);
  assert.deepEqual(constrained, free);
});

test("bad grammars and bad usage are clear errors", () => {
  const cases = [
    [{ schema: { type: "object", patternProperties: { x: {} }, minProperties: 1 } }, /unsupported keywords 'patternProperties', 'minProperties'/],
    [{ schema: { oneOf: [{}] } }, /unsupported keyword 'oneOf'/],
    [{ regex: "(a)\\1" }, /regex: backreferences are not supported/],
    [{ regex: "(ab" }, /regex: missing '\)'/],
  ];
  for (const [g, msg] of cases) {
    const r = check(g, ["x"]);
    assert.equal(r.status, 1, r.stderr);
    assert.match(r.stderr, msg);
  }
  const bad = path.join(tmp, "bad.gbnf");
  fs.writeFileSync(bad, "root ::= item+\n");
  const r = check({ gbnf: bad }, []);
  assert.equal(r.status, 1);
  assert.match(r.stderr, /undefined rule 'item'/);
  for (const args of [["grammar"], ["grammar", "frobnicate", "--json"], ["grammar", "check", "--json"],
                      ["grammar", "sample", "--json"], ["grammar", "print", "--json", "--regex", "a"],
                      ["grammar", "bench", "--json"], ["grammar", "bench", "-m", qwenVocab],
                      ["grammar", "bench", "-m", path.join(tmp, "missing.gguf"), "--json"]]) {
    const u = spawnSync(bin, args, { encoding: "utf8" });
    assert.ok(u.status === 2 || u.status === 1, `${args}: ${u.status} ${u.stderr}`);
    assert.match(u.stderr, /tokenmill grammar: /);
  }
});

test("grammar bench: the matcher alone on a vocabulary, mask times per token as JSON", () => {
  const f = path.join(tmp, "bench-schema.json");
  fs.writeFileSync(f, JSON.stringify({ type: "object", properties: { n: { type: "integer" }, s: { enum: ["a", "b"] } },
    required: ["n", "s"], additionalProperties: false }));
  const out = JSON.parse(execFileSync(bin, ["grammar", "bench", "-m", qwenVocab, "--schema", f, "-n", "3", "--max-tokens", "40",
    "--seed", "2"], { encoding: "utf8" }));
  assert.equal(out.n_vocab, 151936);
  assert.equal(out.documents, 3);
  assert.ok(out.completed <= 3 && out.tokens >= 6 && out.tokens <= 3 * 40, JSON.stringify(out));
  for (const k of ["mask", "mask_first_document", "mask_second_half", "cpu", "cpu_first_document", "cpu_second_half"])
    for (const q of ["mean_us", "p50_us", "p99_us", "max_us"]) assert.ok(Number.isFinite(out[k][q]) && out[k][q] >= 0, `${k}.${q}`);
  assert.ok(out.mask.p50_us <= out.mask.p99_us && out.mask.p99_us <= out.mask.max_us);
});
