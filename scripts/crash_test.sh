#!/usr/bin/env bash
# Crash test for checkpoints and resume: trains a small run, stops it KILLS times at
# random moments (startup, mid-step, mid-checkpoint) -- alternately with SIGKILL (a
# crash: nothing of the moment survives) and SIGTERM (a scheduler's preemption: the run
# finishes its step, checkpoints and exits 4) -- resuming after each, then lets it
# finish and checks that the final weights are bit-identical to an uninterrupted run of
# the same configuration. Exit 0 on success.
#
# Usage: scripts/crash_test.sh [KILLS=20]   (needs build/gradguard and data/brown)
set -euo pipefail
cd "$(dirname "$0")/.."
KILLS=${1:-20}
BIN=build/gradguard
WORK=$(mktemp -d /tmp/gradguard-crash-XXXXXX)
trap 'rm -rf "$WORK"' EXIT
[ -x "$BIN" ] && [ -f data/brown/train.bin ] || { echo "crash_test: run scripts/setup.sh first" >&2; exit 1; }

ARGS=(--config configs/tiny.yaml --set run.dir="$WORK" --set schedule.total_steps=200
      --set schedule.warmup_steps=5 --set checkpoint.every=1 --set checkpoint.keep_last=3
      --set eval.every=0 --set log.progress=none --set model.hidden_size=64
      --set model.intermediate_size=128 --set batch.micro_batch=8)

echo "crash_test: uninterrupted reference run"
"$BIN" train "${ARGS[@]}" --name reference >/dev/null

kills=0
terms=0      # SIGTERMs that ended in a clean preemption (exit 4)
resumes=0
while [ "$kills" -lt "$KILLS" ]; do
  if [ -f "$WORK/victim/checkpoints/latest" ]; then
    "$BIN" train --resume "$WORK/victim" --set log.progress=none >"$WORK/log" 2>&1 &
    resumes=$((resumes + 1))
  else
    "$BIN" train "${ARGS[@]}" --name victim --set run.overwrite=true >"$WORK/log" 2>&1 &
  fi
  pid=$!
  sleep "$(awk -v s=$RANDOM 'BEGIN { srand(s); printf "%.2f", 0.2 + rand() * 1.5 }')"
  sig=KILL
  [ $((kills % 2)) -eq 1 ] && sig=TERM
  if kill -s "$sig" "$pid" 2>/dev/null; then
    kills=$((kills + 1))
    rc=0
    wait "$pid" 2>/dev/null || rc=$?
    # SIGTERM: 4 once training runs (checkpoint written), 143 when it came before the
    # handler was installed (startup), 0 when the run had just finished.
    if [ "$sig" = TERM ]; then
      case "$rc" in
        4) terms=$((terms + 1)) ;;
        0|143) ;;
        *) echo "crash_test: SIGTERM ended the run with exit $rc:"; cat "$WORK/log"; exit 1 ;;
      esac
    fi
    echo "crash_test: SIG$sig $kills/$KILLS, exit $rc ($(cat "$WORK/victim/checkpoints/latest" 2>/dev/null || echo 'no checkpoint yet'))"
  else
    wait "$pid" || { echo "crash_test: run failed:"; cat "$WORK/log"; exit 1; }
    echo "crash_test: the run finished before the kill; starting over"
    rm -rf "$WORK/victim"
  fi
done

echo "crash_test: final run to completion"
if [ -f "$WORK/victim/checkpoints/latest" ]; then
  "$BIN" train --resume "$WORK/victim" --set log.progress=none >"$WORK/log" 2>&1 || { cat "$WORK/log"; exit 1; }
else  # the last kill came before the first checkpoint of a fresh start
  "$BIN" train "${ARGS[@]}" --name victim --set run.overwrite=true >"$WORK/log" 2>&1 || { cat "$WORK/log"; exit 1; }
fi
ref="$WORK/reference/checkpoints/step-0000200/model.safetensors"
got="$WORK/victim/checkpoints/step-0000200/model.safetensors"
if cmp -s "$ref" "$got"; then
  echo "crash_test: PASS: $kills stops ($terms clean SIGTERM preemptions), $((resumes + 1)) resumes, final weights bit-identical to the uninterrupted run"
else
  echo "crash_test: FAIL: final weights differ from the uninterrupted run" >&2
  exit 1
fi
