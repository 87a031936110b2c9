// llama_node: node-llama-cpp for the llama.cpp drivers (the oracle and the benchmarks' peer
// columns), loaded the one way that gives llama.cpp its best speed on this machine.
//
// node-llama-cpp runs every llama_decode on a libuv pool thread; with the default pool of 4
// threads, llama.cpp's compute threads on a 2-core machine run at about half speed and
// erratically (measured: 21-24 ms vs 10.5-11 ms per decode step of a 565 MB f32 model). A
// pool of one thread gives llama.cpp its best speed. The pool is sized when node starts, so
// importing this module re-runs the importing script under UV_THREADPOOL_SIZE=1 when it isn't
// set (static imports are evaluated before the importer's own code, so nothing has run yet).
if (process.env.UV_THREADPOOL_SIZE !== '1') {
  const {spawnSync} = await import('node:child_process');
  const r = spawnSync(process.execPath, [...process.execArgv, ...process.argv.slice(1)],
    {stdio: 'inherit', env: {...process.env, UV_THREADPOOL_SIZE: '1'}});
  process.exit(r.status ?? 1);
}
export const {getLlama, LlamaLogLevel} = await import('node-llama-cpp');
