// run.test.mjs: `tokenmill run` end to end on the bundled stories260K model: the greedy text
// equals llama2.c's (200 tokens from BOS), the stats line, seeded sampling is repeatable, and
// bad usage / bad model files give a clear message and a non-zero exit; `tokenmill bench`; and
// for every subcommand, a numeric option whose value is not a number in range ("abc", "2x",
// "-5") is refused with a message naming the option and the value, exit 2, before any work.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { readFileSync, writeFileSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const root = new URL('../../', import.meta.url).pathname;
const bin = join(root, 'build/tokenmill');
const model = join(root, 'models/stories260K.gguf');

function run(args) {
  return spawnSync(bin, ['run', ...args], { encoding: 'utf8', timeout: 60000 });
}

test('greedy: 200 tokens from BOS print exactly llama2.c\'s text', () => {
  const r = run(['-m', model, '-p', '', '--temp', '0', '-n', '200']);
  assert.equal(r.status, 0, r.stderr);
  const expected = readFileSync(join(root, 'tests/data/expected/greedy-200.txt'), 'utf8');
  assert.equal(r.stdout, expected);
  assert.match(r.stderr, /prompt: 1 tokens, [0-9.]+ tokens\/s \| generation: 200 tokens, [0-9.]+ tokens\/s/);
});

test('greedy with one thread gives the same text', () => {
  const r = run(['-m', model, '-p', '', '--temp', '0', '-n', '200', '--threads', '1']);
  assert.equal(r.status, 0, r.stderr);
  assert.equal(r.stdout, readFileSync(join(root, 'tests/data/expected/greedy-200.txt'), 'utf8'));
});

test('a prompt is continued, -n counts generated tokens', () => {
  const r = run(['-m', model, '-p', 'Once upon a time', '--temp', '0', '-n', '30']);
  assert.equal(r.status, 0, r.stderr);
  assert.ok(r.stdout.length > 20, r.stdout);
  assert.match(r.stderr, /generation: 30 tokens/);
});

test('same seed, same text; different seed, different text', () => {
  const args = ['-m', model, '-p', 'Lily', '--temp', '1.0', '-n', '60'];
  const a = run([...args, '--seed', '42']);
  const b = run([...args, '--seed', '42']);
  const c = run([...args, '--seed', '7']);
  assert.equal(a.status, 0, a.stderr);
  assert.equal(a.stdout, b.stdout);
  assert.notEqual(a.stdout, c.stdout);
});

test('bad usage exits 2 with a message', () => {
  for (const args of [[], ['-m', model], ['-p', 'x'], ['-m', model, '-p', 'x', '-n', 'many'],
                      ['-m', model, '-p', 'x', '--bogus'], ['-m', model, '-p', 'x', '--top-p', '2']]) {
    const r = run(args);
    assert.equal(r.status, 2, `args ${JSON.stringify(args)}: ${r.stderr}`);
    assert.match(r.stderr, /tokenmill run: /);
  }
});

test('a missing or broken model file is a clear error', () => {
  const r = run(['-m', '/nonexistent/model.gguf', '-p', 'x']);
  assert.equal(r.status, 1);
  assert.match(r.stderr, /cannot load \/nonexistent\/model\.gguf: .*No such file/);
  const dir = mkdtempSync(join(tmpdir(), 'tm-run-'));
  try {
    const bad = join(dir, 'bad.gguf');
    writeFileSync(bad, 'this is not a gguf file at all');
    const r2 = run(['-m', bad, '-p', 'x']);
    assert.equal(r2.status, 1);
    assert.match(r2.stderr, /cannot load .*bad\.gguf: .*(magic|GGUF)/i);
    const trunc = join(dir, 'trunc.gguf');
    writeFileSync(trunc, readFileSync(model).subarray(0, 4096));
    const r3 = run(['-m', trunc, '-p', 'x']);
    assert.equal(r3.status, 1);
    assert.match(r3.stderr, /cannot load .*trunc\.gguf: /);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('bench: JSON timings, --depth runs pp after a cached prefix, bad values are refused', () => {
  const r = spawnSync(bin, ['bench', '-m', model, '--pp', '20', '--tg', '4', '--seqs', '1,2', '--reps', '1', '--depth', '300'],
                      { encoding: 'utf8', timeout: 60000 });
  assert.equal(r.status, 0, r.stderr);
  const j = JSON.parse(r.stdout);
  assert.equal(j.depth, 300);
  assert.equal(j.pp.n, 20);
  assert.equal(j.pp.tok_s.length, 1);
  assert.ok(j.pp.tok_s[0] > 0 && j.tg.tok_s[0] > 0);
  assert.deepEqual(j.batched.map((b) => b.seqs), [1, 2]);
  const bad = spawnSync(bin, ['bench', '-m', model, '--depth', '-5'], { encoding: 'utf8', timeout: 60000 });
  assert.notEqual(bad.status, 0);
  assert.match(bad.stderr, /usage: tokenmill bench/);
});

test('numeric options: not a number in range is refused with the option and the value, exit 2', () => {
  const M = model;
  const cases = [
    [['bench', '-m', M, '--pp', 'abc', '--tg', '0'], /tokenmill bench: --pp: 'abc' is not a whole number in 0\.\.\d+/],
    [['bench', '-m', M, '--threads', '2x', '--pp', '0', '--tg', '0'], /tokenmill bench: --threads: '2x' is not a whole number/],
    [['bench', '-m', M, '--reps', '0', '--tg', '0'], /tokenmill bench: --reps: 0 is below the minimum: it must be in 1\.\.100/],
    [['bench', '-m', M, '--batch', '', '--tg', '0'], /tokenmill bench: --batch: '' is not a whole number/],
    [['bench', '-m', M, '-d', '99999999999999999999', '--tg', '0'], /tokenmill bench: -d: 99999999999999999999 is above the maximum: it must be in 0\.\./],
    [['eval', '-m', M, '--input', '/nonexistent.json', '--threads', '2x'], /tokenmill eval: --threads: '2x' is not a whole number/],
    [['eval', '-m', M, '--input', '/nonexistent.json', '--batch', 'abc'], /tokenmill eval: --batch: 'abc' is not a whole number in 1\.\./],
    [['template', '-m', M, '--input', '/nonexistent.json', '--threads', '3q'], /tokenmill template: --threads: '3q' is not a whole number/],
    [['gateway', '-m', M, '--listen', '127.0.0.1:0', '--ctx', '12q'], /tokenmill gateway: --ctx: '12q' is not a whole number in 1\.\./],
    [['gateway', '-m', M, '--listen', '127.0.0.1:0', '--ctx', '-5'], /tokenmill gateway: --ctx: -5 is below the minimum: it must be in 1\.\./],
    [['gateway', '-m', M, '--listen', '127.0.0.1:0', '--wait-timeout', '3s'], /tokenmill gateway: --wait-timeout: '3s' is not a number in /],
    [['gateway', '-m', M, '--listen', '127.0.0.1:0', '--heartbeat-timeout', 'nan'], /tokenmill gateway: --heartbeat-timeout: 'nan' is not a number/],
    [['gateway', '-m', M, '--listen', '127.0.0.1:0x'], /tokenmill gateway: --listen port: '0x' is not a whole number in 0\.\.65535/],
    [['serve', '-m', M, '--port', '0', '--ctx', '5k'], /tokenmill serve: --ctx: '5k' is not a whole number/],
    [['worker', '--role', 'mixed', '-m', M, '--listen', '127.0.0.1:0', '--threads', ' 2'], /tokenmill worker: --threads: ' 2' is not a whole number/],
    // a number out of range says which bound, not "not a whole number"
    [['serve', '-m', M, '--port', '0', '--max-body', '1000'], /tokenmill serve: --max-body: 1000 is below the minimum: it must be in 1024\.\./],
    // a second -m serves a second model, which needs a name of its own: not silently the first's
    [['serve', '-m', M, '-m', M, '--port', '0'], /tokenmill serve: two models are named '[^']+': name them apart with -m NAME=FILE/],
  ];
  for (const [args, re] of cases) {
    const r = spawnSync(bin, args, { encoding: 'utf8', timeout: 30000 });
    assert.equal(r.status, 2, `${JSON.stringify(args)}: status ${r.status} signal ${r.signal}: ${r.stderr}`);
    assert.match(r.stderr, re, JSON.stringify(args));
    assert.equal(r.stdout, '', JSON.stringify(args));
  }
});

test('TOKENMILL_SIMD that names no level is refused, naming the levels', () => {
  const r = spawnSync(bin, ['tokenize', '-m', model, 'x'], { encoding: 'utf8', timeout: 30000, env: { ...process.env, TOKENMILL_SIMD: 'bogus' } });
  assert.equal(r.status, 2, r.stderr);
  assert.match(r.stderr, /TOKENMILL_SIMD=bogus is not a SIMD level \(this CPU has: scalar, avx2/);
  const ok = spawnSync(bin, ['tokenize', '-m', model, 'x'], { encoding: 'utf8', timeout: 30000, env: { ...process.env, TOKENMILL_SIMD: 'scalar' } });
  assert.equal(ok.status, 0, ok.stderr);
});
