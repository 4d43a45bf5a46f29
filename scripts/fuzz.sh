#!/usr/bin/env bash
# Builds the libFuzzer targets in fuzz/ (clang, ASan + UBSan, into build-fuzz/) and runs
# each for DURATION seconds (default 60) on a scratch copy of its seed corpus in
# fuzz/corpus/<target>/, so the checked-in corpus never grows. Exits non-zero if any
# target finds a crash, leak, timeout or out-of-memory input, printing the reproducer's
# path and the command that replays it.
#
# Usage: scripts/fuzz.sh [DURATION_SECONDS]
# Environment: FUZZ_JOBS (build parallelism, default nproc), CXX (default clang++),
#              FUZZ_TARGETS (space-separated subset of the targets).
# Needs, beyond scripts/setup.sh's packages: clang-14 (or clang) and libclang-rt-14-dev
# (libFuzzer and the sanitizer runtimes); llvm-14 for symbolized stack traces.
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION="${1:-60}"
[[ "$DURATION" =~ ^[0-9]+$ ]] || { echo "fuzz.sh: DURATION must be a number of seconds" >&2; exit 2; }
TARGETS=(${FUZZ_TARGETS:-safetensors_header_fuzz config_fuzz token_file_fuzz})
BUILD=build-fuzz

CXX="${CXX:-}"
if [ -z "$CXX" ] || ! "$CXX" --version 2>/dev/null | grep -q clang; then
  CXX=""
  for c in clang++ clang++-14; do command -v "$c" >/dev/null 2>&1 && { CXX="$c"; break; }; done
fi
[ -n "$CXX" ] || { echo "fuzz.sh: clang++ not found (apt-get install clang-14 libclang-rt-14-dev)" >&2; exit 2; }
rt_dir="$("$CXX" -print-resource-dir)/lib/linux"
if ! ls "$rt_dir"/libclang_rt.fuzzer-*.a >/dev/null 2>&1; then
  echo "fuzz.sh: libFuzzer runtime missing in $rt_dir (apt-get install libclang-rt-14-dev)" >&2
  exit 2
fi

generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
if [ -f "$BUILD/CMakeCache.txt" ] && ! grep -q "^CMAKE_GENERATOR:INTERNAL=${generator[1]:-Unix Makefiles}$" "$BUILD/CMakeCache.txt"; then
  generator=()  # keep whatever generator the existing build dir was made with
fi
echo "== configuring $BUILD with $CXX"
cmake -S . -B "$BUILD" "${generator[@]}" -DCMAKE_CXX_COMPILER="$CXX" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DGRADGUARD_BUILD_FUZZ=ON -DGRADGUARD_BUILD_TESTS=OFF -DGRADGUARD_BUILD_BENCH=OFF >/dev/null
echo "== building ${TARGETS[*]}"
cmake --build "$BUILD" -j"${FUZZ_JOBS:-$(nproc)}" --target "${TARGETS[@]}"

symbolizer="$(command -v llvm-symbolizer || true)"
[ -z "$symbolizer" ] && [ -x /usr/lib/llvm-14/bin/llvm-symbolizer ] && symbolizer=/usr/lib/llvm-14/bin/llvm-symbolizer
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1${symbolizer:+:external_symbolizer_path=$symbolizer}}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1${symbolizer:+:external_symbolizer_path=$symbolizer}}"

failed=()
for t in "${TARGETS[@]}"; do
  work="$BUILD/fuzz-run/$t"
  rm -rf "$work"
  mkdir -p "$work/corpus" "$work/artifacts"
  cp fuzz/corpus/"$t"/* "$work/corpus/"
  log="$work/fuzz.log"
  echo "== $t: ${DURATION}s (log: $log)"
  set +e
  "$BUILD/fuzz/$t" "$work/corpus" -max_total_time="$DURATION" -timeout=10 -rss_limit_mb=4096 \
    -artifact_prefix="$work/artifacts/" -print_final_stats=1 >"$log" 2>&1
  rc=$?
  set -e
  grep -E "^stat::number_of_executed_units|^stat::average_exec_per_sec|^stat::new_units_added|^#[0-9]+ *DONE" "$log" |
    sed 's/^/   /' || true
  artifacts=("$work"/artifacts/*)
  if [ "$rc" -ne 0 ] || [ -e "${artifacts[0]}" ]; then
    failed+=("$t")
    echo "!! $t failed (exit $rc); last lines of $log:" >&2
    tail -n 40 "$log" | sed 's/^/   /' >&2
    for a in "${artifacts[@]}"; do
      [ -e "$a" ] && echo "!! reproducer: $a   (replay: $BUILD/fuzz/$t $a)" >&2
    done
  fi
done

if ((${#failed[@]})); then
  echo "fuzz.sh: FAILED: ${failed[*]}" >&2
  exit 1
fi
echo "fuzz.sh: all targets ran ${DURATION}s without findings"
