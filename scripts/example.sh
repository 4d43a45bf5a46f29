#!/usr/bin/env bash
# The installed package, end to end: installs gradguard from build/ into a temporary
# prefix, builds examples/libtorch_loop/ against it as another project would
# (find_package(gradguard), CMAKE_PREFIX_PATH), runs it with an inf injected into the
# gradients at one step and a loss spike at another, and checks what the guard left
# behind: the inf step skipped (its metrics line and a skip event), a snapshot of the
# spike step with its diagnosis, and a report.html rendered from the example's
# metrics.jsonl by build/gradguard. Prints each check and the seconds each phase took;
# exit 0 only when every check passes.
#
# Usage: scripts/example.sh
# Configures build/ (Release, Ninja, as scripts/test.sh does) when it has not been
# configured, and builds the library and CLI targets in it (nothing when they are up to
# date). Everything else goes into a fresh temporary directory, removed when all checks
# pass and kept (its path printed) when one fails. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

STEPS=60
INF_STEP=20     # the loss rule needs 10 healthy steps first: keep the spike well after
SPIKE_STEP=45

t0=$SECONDS
phase_start=$SECONDS
phase() { printf '== %s (%d s)\n' "$1" $((SECONDS - phase_start)); phase_start=$SECONDS; }

# ---- the library in build/ ----------------------------------------------------------------
if [ ! -f build/CMakeCache.txt ]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
fi
cmake --build build --target gradguard gradguard_cli -j"$(nproc)"
phase "build/: gradguard and gradguard_cli up to date"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/gradguard-example-XXXXXX")
PREFIX=$WORK/prefix
RUN=$WORK/run
keep=1
trap 'if [ "$keep" = 0 ]; then rm -rf "$WORK"; else echo "example.sh: files kept in $WORK" >&2; fi' EXIT

cmake --install build --prefix "$PREFIX" >/dev/null
phase "installed into $PREFIX"

# A fixed compiler cache key across runs: paths under $WORK are hashed relative to it.
launcher=()
command -v ccache >/dev/null 2>&1 && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
export CCACHE_BASEDIR=$WORK
cmake -S examples/libtorch_loop -B "$WORK/loop" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_PREFIX_PATH="$PREFIX" "${launcher[@]}" >/dev/null
cmake --build "$WORK/loop" -j"$(nproc)"
phase "examples/libtorch_loop configured and built against the installed package"

fails=0
check() {  # check DESCRIPTION COMMAND...
  local what=$1
  shift
  if "$@"; then
    printf 'ok    %s\n' "$what"
  else
    printf 'FAIL  %s\n' "$what"
    fails=$((fails + 1))
  fi
}

rc=0
"$WORK/loop/libtorch_loop" --steps "$STEPS" --run-dir "$RUN" --inject-inf "$INF_STEP" \
  --inject-spike "$SPIKE_STEP" >"$WORK/loop.log" 2>&1 || rc=$?
sed 's/^/  | /' "$WORK/loop.log"
phase "ran libtorch_loop --steps $STEPS --inject-inf $INF_STEP --inject-spike $SPIKE_STEP"

metrics=$RUN/metrics.jsonl
spike_snapshot=$RUN/snapshots/step-$(printf '%07d' "$SPIKE_STEP")-loss_spike
# metrics.jsonl lines start with "step"; then a step line has "loss", an event line "event".
step_lines() { grep -E '^\{"step":[0-9]+,"loss"' "$metrics"; }
inf_step_skipped() { step_lines | grep -E "^\{\"step\":$INF_STEP," | grep -q '"skipped":true'; }
inf_skip_event() { grep -qE "^\{\"step\":$INF_STEP,\"event\":\"skip\"" "$metrics"; }
skipped_count() { step_lines | grep -c '"skipped":true' || true; }
installed() {
  [ -f "$PREFIX/include/gradguard/guard/guarded_step.h" ] && [ -f "$PREFIX/lib/libgradguard.a" ] &&
    [ -f "$PREFIX/lib/cmake/gradguard/gradguardConfig.cmake" ] &&
    [ -f "$PREFIX/lib/cmake/gradguard/gradguardConfigVersion.cmake" ]
}
diagnosed() { [ -s "$spike_snapshot/diagnosis.md" ] && [ -s "$spike_snapshot/diagnosis.json" ]; }
report() { build/gradguard report "$RUN" >/dev/null && [ -s "$RUN/report.html" ]; }
cli_runs() { "$PREFIX/bin/gradguard" --version >/dev/null; }

check "the installed package has the headers, the library and the CMake config" installed
check "the installed CLI runs (bin/gradguard --version)" cli_runs
check "the example exits 0: its own check that the faults were caught and nothing else happened (got $rc)" \
  test "$rc" -eq 0
check "metrics.jsonl: step $INF_STEP (the inf) has \"skipped\": true" inf_step_skipped
check "metrics.jsonl: a skip event at step $INF_STEP" inf_skip_event
check "metrics.jsonl: exactly 2 steps skipped, the inf and the spike (got $(skipped_count))" \
  test "$(skipped_count)" -eq 2
check "snapshot of step $SPIKE_STEP: ${spike_snapshot#"$WORK"/}/ has diagnosis.md and diagnosis.json" diagnosed
check "build/gradguard report renders report.html from the example's metrics.jsonl" report

total=$((SECONDS - t0))
if [ "$fails" -eq 0 ]; then
  keep=0
  printf 'example.sh: PASS: all checks passed in %d s\n' "$total"
else
  printf 'example.sh: FAIL: %d check(s) failed in %d s\n' "$fails" "$total" >&2
  exit 1
fi
