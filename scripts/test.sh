#!/usr/bin/env bash
# Runs every test: the C unit tests in the optimised build and again under ASan+UBSan, a
# brief pass of every fuzz target (build/fuzz, `make fuzz-build`: its seed corpus plus
# FUZZ_TEST_RUNS mutations, each target one test), then the end-to-end/oracle tests
# (tests/e2e/*.test.mjs, node's test runner) against the real binary. Prints the wall seconds of each part, then one closing line "N passed, N failed" over all of them; exits non-zero on
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
  out=$("$1" 2>&1); local rc=$?
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
