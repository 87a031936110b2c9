// oracle_common: what the oracle tests that compare tokenmill with the prebuilt llama.cpp on
// models written by llama.cpp's gguf-py share: finding a python with numpy, the model files
// cached in tests/data/gen under a hash of the scripts that write them (so an edited script
// writes them anew), a seeded generator for prompts, llama.cpp's side of a comparison
// (tests/oracle/llama_eval.mjs in its own process), the C++ drivers built against the prebuilt
// libllama (tests/oracle/*_llama.cpp) and the top-K comparison of one position.
import assert from 'node:assert/strict';
import {spawn, spawnSync} from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';

export const root = path.resolve(import.meta.dirname, '../..');
export const bin = process.env.TM_BIN || path.join(root, 'build/tokenmill');
export const gen = path.join(root, 'tests/data/gen');
export const ggufPy = path.join(root, 'tests/data/llama.cpp/gguf-py');

// The first python3 with numpy: a pyenv python3 on PATH may lack it where Debian's has it.
export function findPython() {
  for (const py of ['python3', '/usr/bin/python3']) {
    const r = spawnSync(py, ['-c', 'import numpy'], {encoding: 'utf8'});
    if (r.status === 0) return py;
  }
  return null;
}

// For tests whose models `scripts` write: {python, skip (why the tests cannot run, or false),
// cached(name, make)}, where cached returns gen/NAME-KEY.gguf, calling make(tmpPath) to write
// it first when it is not there (and removing NAME's files of other keys).
export function oracleFiles(scripts) {
  const python = findPython();
  const skip = !fs.existsSync(bin) ? 'build/tokenmill not built'
    : !fs.existsSync(ggufPy) ? 'no tests/data/llama.cpp (scripts/fetch-testdata.sh)'
    : !python ? 'no python3 with numpy (scripts/deps.sh installs python3-numpy)' : false;
  let key = '';
  if (!skip) {
    const h = crypto.createHash('sha256');
    for (const s of scripts) h.update(fs.readFileSync(s));
    key = h.digest('hex').slice(0, 10);
  }
  function cached(name, make) {
    const file = path.join(gen, `${name}-${key}.gguf`);
    if (fs.existsSync(file)) return file;
    fs.mkdirSync(gen, {recursive: true});
    for (const f of fs.readdirSync(gen))
      if (f.startsWith(`${name}-`) && f.endsWith('.gguf')) fs.rmSync(path.join(gen, f));
    const tmp = `${file}.tmp${process.pid}`;
    make(tmp);
    fs.renameSync(tmp, file);
    return file;
  }
  return {python, skip, cached};
}

export function rng(seed) { // mulberry32: rng(n) is an integer in [0, n)
  let s = seed >>> 0;
  return (n) => {
    s = (s + 0x6D2B79F5) >>> 0;
    let t = s;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) % n;
  };
}

// llama.cpp's answer for the eval input file inFile (one thread, KV cache of type kv).
export function llamaEval(file, inFile, kv = 'f32') {
  return new Promise((resolve, reject) => {
    const ch = spawn(process.execPath, [path.join(root, 'tests/oracle/llama_eval.mjs'), '-m', file, '--input', inFile,
      '--threads', '1', '--kv', kv], {env: {...process.env, UV_THREADPOOL_SIZE: '1'}});
    const out = [], err = [];
    ch.stdout.on('data', (d) => out.push(d));
    ch.stderr.on('data', (d) => err.push(d));
    ch.on('error', reject);
    ch.on('close', (code) => {
      if (code !== 0) reject(new Error(`llama_eval failed (exit ${code}): ${Buffer.concat(err)}`));
      else resolve(JSON.parse(Buffer.concat(out).toString('utf8')));
    });
  });
}

// Both engines on one input: the input written to a temp dir gen/in-TAG-*, tokenmill eval (2
// threads) and llamaEval with a KV cache of type kv; {tm, ll}, their parsed answers.
export async function runBoth(file, input, kv = 'f32', tag = 'oracle') {
  const dir = fs.mkdtempSync(path.join(gen, `in-${tag}-`));
  const inFile = path.join(dir, 'in.json');
  fs.writeFileSync(inFile, JSON.stringify(input));
  try {
    const tm = spawnSync(bin, ['eval', '-m', file, '--input', inFile, '--threads', '2', '--kv', kv],
      {encoding: 'utf8', maxBuffer: 64 << 20});
    assert.equal(tm.status, 0, `tokenmill eval failed: ${tm.stderr}`);
    return {tm: JSON.parse(tm.stdout), ll: await llamaEval(file, inFile, kv)};
  } finally {
    fs.rmSync(dir, {recursive: true, force: true});
  }
}

// max |Δ logprob| over the tokens both top-Ks ([id, logprob] pairs) hold at one position; a
// token only one of them holds must be within tol of the other's last.
export function posDiff(got, ref, tol, label) {
  const g = new Map(got), r = new Map(ref);
  let d = 0;
  for (const [id, lp] of ref) {
    if (g.has(id)) d = Math.max(d, Math.abs(g.get(id) - lp));
    else assert.ok(lp <= got.at(-1)[1] + tol, `${label}: llama.cpp's token ${id} (${lp}) not in tokenmill's top-${got.length}`);
  }
  for (const [id, lp] of got)
    if (!r.has(id)) assert.ok(lp <= ref.at(-1)[1] + tol, `${label}: tokenmill's token ${id} (${lp}) not in llama.cpp's top-${ref.length}`);
  return d;
}

// The prebuilt libllama's folder, and why C++ drivers cannot be built against it (false: they can).
export const llamaLibDir = path.join(root, 'node_modules/@node-llama-cpp/linux-x64/bins/linux-x64');
export const llamaDriverSkip = spawnSync('g++', ['--version']).status !== 0 ? 'no g++'
  : !fs.existsSync(llamaLibDir) ? 'no prebuilt node-llama-cpp libllama' : false;

// A C++ driver of the C API (source under tests/oracle, with llama_driver.h) built against the
// prebuilt libllama, once per hash of both, under gen/NAME-HASH; its path.
export function llamaDriver(source, name) {
  const key = crypto.createHash('sha256').update(fs.readFileSync(source))
    .update(fs.readFileSync(path.join(root, 'tests/oracle/llama_driver.h'))).digest('hex').slice(0, 10);
  const out = path.join(gen, `${name}-${key}`);
  if (fs.existsSync(out)) return out;
  fs.mkdirSync(gen, {recursive: true});
  const B = fs.realpathSync(llamaLibDir);
  const tmp = `${out}.tmp${process.pid}`;
  const r = spawnSync('g++', ['-O1', '-std=c++17', `-DLIBDIR="${B}"`, `-I${root}/tests/data/llama.cpp/include`,
    `-I${root}/tests/data/llama.cpp/ggml/include`, source, '-o', tmp, `-L${B}`, '-l:libllama.v0.4.0.so',
    '-l:libggml.v0.4.0.so', '-l:libggml-base.so', `-Wl,-rpath,${B}`], {encoding: 'utf8', maxBuffer: 1 << 26});
  assert.equal(r.status, 0, `g++ ${name} failed: ${r.stderr}`);
  fs.renameSync(tmp, out);
  return out;
}
