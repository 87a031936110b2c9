#!/usr/bin/env bash
# Runs every test: the C unit tests in the optimised build and again under ASan+UBSan, a
# brief pass of every fuzz target (build/fuzz, `make fuzz-build`: its seed corpus plus
# FUZZ_TEST_RUNS mutations, each target one test), then the end-to-end/oracle tests
# (tests/e2e/*.test.mjs, node's test runner) against the real binary; before those, the
# aarch64 build's tests under qemu-user (when `make arm64` built it). Prints the wall seconds
# of each part, then one closing line "N passed, N failed" over all of them; exits non-zero on
# any failure. TESTS_FILTER=substring limits which test files run.
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/fetch-testdata.sh

pass=0; fail=0
filter="${TESTS_FILTER:-}"
# Wall seconds of each part, printed at the end: where `make test`'s time goes (CI's budget).
times=""; t0=$SECONDS
phase() { times="$times $1 $((SECONDS - t0)) s,"; t0=$SECONDS; }
run_unit() {  # $1 = binary, $2 = label
  local out
  out=$($1 2>&1); local rc=$?  # $1 may be a wrapper and the binary (arm_run below)
  printf '%s\n' "$out" | grep -v '^ok ' | sed "s|^|[$2] |"
  local line; line=$(printf '%s\n' "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed$' | tail -1)
  if [ -n "$line" ]; then
    pass=$((pass + $(echo "$line" | cut -d' ' -f1)))
    fail=$((fail + $(echo "$line" | cut -d' ' -f3)))
  fi
  if [ $rc -ne 0 ] && [ -z "$line" -o "$(echo "$line" | cut -d' ' -f3)" = 0 ]; then
    echo "[$2] exited with status $rc"; fail=$((fail + 1))
  fi
}

for t in build/tests/test_*; do
  [ -x "$t" ] || continue
  case "$t" in *"$filter"*) ;; *) continue ;; esac
  run_unit "$t" "$(basename "$t")"
done
phase unit
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1
for t in build/san/tests/test_*; do
  [ -x "$t" ] || continue
  case "$t" in *"$filter"*) ;; *) continue ;; esac
  run_unit "$t" "san/$(basename "$t")"
done
phase san
unset ASAN_OPTIONS UBSAN_OPTIONS

# Fuzz targets: the seeds, then a bounded number of mutations (a count, not a time, so a slow
# machine runs the same inputs). New inputs go to a scratch dir, never into the committed
# seeds; a crash, leak, hang or UB report is one failed test, its input kept under build/fuzz.
fuzz_runs="${FUZZ_TEST_RUNS:-2000}"
for t in build/fuzz/fuzz_*; do
  [ -x "$t" ] && [ -f "$t" ] || continue
  case "$t" in *.d) continue ;; esac
  name=${t#build/fuzz/fuzz_}
  case "fuzz_$name" in *"$filter"*) ;; *) continue ;; esac
  scratch=$(mktemp -d)
  out=$("$t" -runs="$fuzz_runs" -seed=1 -timeout=60 -rss_limit_mb=4096 -artifact_prefix="build/fuzz/crash-$name-" \
        "$scratch" "tests/fuzz/corpus/$name" 2>&1); rc=$?
  rm -rf "$scratch"
  if [ $rc -eq 0 ]; then pass=$((pass + 1)); else
    fail=$((fail + 1)); echo "[fuzz_$name] found a failing input (exit $rc):"
    printf '%s\n' "$out" | grep -E '^(==[0-9]+==ERROR|SUMMARY|fuzz: |[a-z]+: |    #[0-9] |artifact_prefix|Test unit written)' | head -30
  fi
done
phase fuzz

# aarch64 (build/arm64, `make arm64`) under qemu-user: the kernel/model unit tests, which run
# each SIMD level the emulated CPU has (scalar and neon) against the scalar path, on a CPU
# with i8mm (qemu's "max"); test_ops's matmul tests again on one without (neoverse-n1,
# Graviton2's core: the dot-product kernels alone); batch invariance on two weight types in
# the sanitizers' lighter matrix (emulation is many times slower); then the greedy oracle
# (200 tokens from BOS, llama2.c's text) at TOKENMILL_SIMD scalar and neon; then refusals: an
# x86 level, and neon on a CPU without the dot-product extension (cortex-a72, Graviton1's).
# qemu's -E splits its value at commas, so TESTS_ONLY goes through the environment.
arm_run() {  # $1 = qemu cpu, then the command
  local cpu=$1; shift
  qemu-aarch64 -cpu "$cpu" -L /usr/aarch64-linux-gnu \
    -E LD_LIBRARY_PATH="$PWD/build/arm64/sysroot/usr/lib/aarch64-linux-gnu" "$@"
}
arm_check() {  # $1 = label, $2 = 0 when it passed
  if [ "$2" = 0 ]; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "[arm64] $1 failed"; fi
}
if [ -x build/arm64/tokenmill ] && command -v qemu-aarch64 >/dev/null && case arm64 in *"$filter"*) true ;; *) false ;; esac; then
  for t in build/arm64/tests/test_*; do
    [ -x "$t" ] && [ -f "$t" ] || continue
    case "$t" in *.d) continue ;; esac
    name=$(basename "$t")
    if [ "$name" = test_invariance ]; then
      TM_TEST_LIGHT=1 TESTS_ONLY=test_invariance_q8_0,test_invariance_q4_K run_unit "arm_run max $t" "arm64/$name"
    else
      run_unit "arm_run max $t" "arm64/$name"
    fi
  done
  [ -x build/arm64/tests/test_ops ] &&
    TESTS_ONLY=test_matmul_all_types,test_matmul_batch_invariant \
      run_unit "arm_run neoverse-n1 build/arm64/tests/test_ops" "arm64/neoverse-n1/test_ops"
  want=tests/data/expected/greedy-200.txt
  for lvl in scalar neon; do
    TOKENMILL_SIMD=$lvl arm_run max build/arm64/tokenmill run -m models/stories260K.gguf -p '' --temp 0 -n 200 \
      > build/arm64/greedy-$lvl.txt 2>/dev/null
    cmp -s build/arm64/greedy-$lvl.txt "$want"; arm_check "greedy at $lvl (build/arm64/greedy-$lvl.txt)" $?
  done
  out=$(TOKENMILL_SIMD=avx2 arm_run max build/arm64/tokenmill run -m models/stories260K.gguf -n 1 2>&1); rc=$?
  [ $rc = 2 ] && printf '%s' "$out" | grep -q 'TOKENMILL_SIMD=avx2'; arm_check "TOKENMILL_SIMD=avx2 refused" $?
  out=$(TOKENMILL_SIMD=neon arm_run cortex-a72 build/arm64/tokenmill run -m models/stories260K.gguf -n 1 2>&1); rc=$?
  [ $rc = 2 ] && printf '%s' "$out" | grep -q 'this CPU lacks it'; arm_check "TOKENMILL_SIMD=neon refused without dotprod" $?
fi
phase arm64

e2e=$(ls tests/e2e/*.test.mjs 2>/dev/null | grep -- "$filter" || true)
if [ -n "$e2e" ]; then
  out=$(node --test --test-concurrency=1 --test-reporter=tap $e2e 2>&1); rc=$?
  mkdir -p build; printf '%s\n' "$out" > build/e2e.tap
  printf '%s\n' "$out" | grep -E '^ *not ok|^# (pass|fail|tests|oracle)'
  # on failure, the diagnostics of the failing tests (full TAP output in build/e2e.tap)
  printf '%s\n' "$out" | awk '/^ *not ok/{p=1} /^ *ok /{p=0} p' | head -150
  p=$(printf '%s\n' "$out" | grep -E '^# pass ' | awk '{print $3}'); f=$(printf '%s\n' "$out" | grep -E '^# fail ' | awk '{print $3}')
  pass=$((pass + ${p:-0})); fail=$((fail + ${f:-0}))
  if [ $rc -ne 0 ] && [ "${f:-0}" = 0 ]; then echo "node tests exited with status $rc"; fail=$((fail + 1)); fi
fi

phase e2e
echo "time:${times%,}"
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
