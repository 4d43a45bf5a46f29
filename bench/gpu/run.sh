#!/usr/bin/env bash
# The one command of a GPU session: builds gradguard against the machine's PyTorch wheel
# (LibTorch with CUDA), runs the GPU test cases, checks one training step against PyTorch
# (fp32, bf16 autocast, fp16 autocast with loss scaling), benchmarks gradguard against
# PyTorch eager and torch.compile on a GPT-2-small-sized Llama, then runs the whole test
# suite with the time left. Writes results.md and results.json (plus the raw JSON of each
# stage and the tails of their logs) into $OUT if set, else bench/results/gpu-<date>/.
#
# Made for one H200 and a budget of ~8 minutes (GRADGUARD_GPU_BUDGET_S, default 470 s):
# every stage has a time cap and is skipped, and said so, when the budget is spent.
# Stages after a failed one still run when they can (a failed parity check does not stop
# the benchmarks); the exit status is 0 only when the build, the GPU tests and the parity
# check passed.
#
# Needs on the machine: PyTorch with CUDA (python at GRADGUARD_PYTHON, default
# /opt/torch/.venv/bin/python3, else python3), nvcc (its toolkit satisfies LibTorch's CMake
# package), CMake >= 3.18, ninja, a C++17 compiler, and the folder bench/gpu/pack_deps.sh
# makes on a Debian machine (GRADGUARD_DEPS, default .gpu-deps) plus node_modules/uplot
# (report assets). Through the device tool:
#   run(command="bench/gpu/run.sh", carry=[".gpu-deps", "node_modules/uplot"], timeout_s=600)
#
# Environment: OUT, GRADGUARD_PYTHON, GRADGUARD_DEPS, GRADGUARD_GPU_BUDGET_S,
#   GRADGUARD_GPU_JOBS (build parallelism, default nproc), GRADGUARD_BUILD_DIR
#   (default build-cuda), GRADGUARD_GPU_STAGES (comma list to run a subset: env,configure,
#   build,gputests,parity,gpustep,eager,compile,suite). For a dry run of the machinery on
#   a CPU machine: GRADGUARD_GPU_DEVICE=cpu, GRADGUARD_GPU_SHAPE (gpu_step/torch_ref
#   shape options), GRADGUARD_GPU_PARITY_MODES=fp32,bf16 (fp16 needs a GPU),
#   GRADGUARD_GPU_PARITY_ARGS (extra parity.py options, e.g. a smaller model).
set -uo pipefail
cd "$(dirname "$0")/../.."
repo="$PWD"
started=$(date +%s)
budget=${GRADGUARD_GPU_BUDGET_S:-470}
jobs=${GRADGUARD_GPU_JOBS:-$(nproc)}
build=${GRADGUARD_BUILD_DIR:-build-cuda}
deps=${GRADGUARD_DEPS:-.gpu-deps}
device=${GRADGUARD_GPU_DEVICE:-cuda}
parity_modes=${GRADGUARD_GPU_PARITY_MODES:-fp32,bf16,fp16}
# GPT-2-small-sized Llama: 12 layers, 768 wide, 12 heads (MHA), SwiGLU 2048 (GPT-2's 4d MLP
# parameter count with three matrices), byte-level vocabulary 256, seq 1024; 32768 tokens
# per step (micro 16 x accum 2).
shape=${GRADGUARD_GPU_SHAPE:-"--layers 12 --hidden 768 --heads 12 --kv-heads 12 --intermediate 2048 --vocab 256 --seq 1024 --micro 16 --accum 2"}
stages_wanted=",${GRADGUARD_GPU_STAGES:-env,configure,build,gputests,parity,gpustep,eager,compile,suite},"
if [ -n "${GRADGUARD_PYTHON:-}" ]; then py=$GRADGUARD_PYTHON
elif [ -x /opt/torch/.venv/bin/python3 ]; then py=/opt/torch/.venv/bin/python3
else py=$(command -v python3); fi
out=${OUT:-$repo/bench/results/gpu-$(date -u +%Y%m%d-%H%M%S)}
mkdir -p "$out/logs"
command_line="bench/gpu/run.sh${*:+ $*}"
for v in GRADGUARD_PYTHON GRADGUARD_DEPS GRADGUARD_GPU_BUDGET_S GRADGUARD_GPU_JOBS GRADGUARD_BUILD_DIR GRADGUARD_GPU_STAGES \
         GRADGUARD_GPU_DEVICE GRADGUARD_GPU_SHAPE GRADGUARD_GPU_PARITY_MODES GRADGUARD_GPU_PARITY_ARGS; do
  [ -n "${!v:-}" ] && command_line="$v='${!v}' $command_line"
done
export repo jobs build deps py out command_line device shape
stages_tsv="$out/stages.tsv"
printf 'stage\tstatus\tseconds\tnote\n' >"$stages_tsv"
failed_required=0

elapsed() { echo $(( $(date +%s) - started )); }
left() { echo $(( budget - $(elapsed) )); }
note() { printf '[run.sh %4ss] %s\n' "$(elapsed)" "$*"; }
record() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "${4:-}" >>"$stages_tsv"; }

# stage NAME CAP_S MIN_S REQUIRED CMD...: runs CMD with a time limit of min(CAP_S, budget
# left), logging to $out/logs/NAME.log (tail kept) and echoing progress lines; skipped
# when fewer than MIN_S seconds are left or the stage is not wanted.
stage() {
  local name=$1 cap=$2 min=$3 required=$4; shift 4
  if [[ "$stages_wanted" != *",$name,"* ]]; then record "$name" skipped 0 "not in GRADGUARD_GPU_STAGES"; return 0; fi
  local l; l=$(left)
  if [ "$l" -lt "$min" ]; then
    note "$name: skipped (${l}s of the ${budget}s budget left, needs ${min}s)"
    record "$name" skipped 0 "budget: ${l}s left, needs ${min}s"
    [ "$required" = 1 ] && failed_required=1
    return 0
  fi
  local limit=$(( cap < l ? cap : l ))
  note "$name: start (limit ${limit}s)"
  local t0; t0=$(date +%s)
  local log="$out/logs/$name.log"
  # bash -c so that exported shell functions run under timeout too.
  timeout --kill-after=10 "$limit" bash -c '"$@"' stage "$@" >"$log.full" 2>&1 &
  local pid=$! n=0
  while kill -0 "$pid" 2>/dev/null; do  # progress: the log's last line every 15 s
    sleep 1
    n=$(( n + 1 ))
    if [ $(( n % 15 )) -eq 0 ] && kill -0 "$pid" 2>/dev/null; then
      note "$name: ... $(tail -c 2000 "$log.full" | tail -n 1 | cut -c1-160)"
    fi
  done
  wait "$pid"; local rc=$?
  local s=$(( $(date +%s) - t0 ))
  tail -n 400 "$log.full" >"$log"; rm -f "$log.full"
  local status=ok
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then status=timeout; elif [ "$rc" -ne 0 ]; then status="failed(rc=$rc)"; fi
  note "$name: $status in ${s}s"
  [ "$status" != ok ] && tail -n 15 "$log" | sed 's/^/    /'
  record "$name" "$status" "$s"
  [ "$status" != ok ] && [ "$required" = 1 ] && failed_required=1
  [ "$status" = ok ]
}

# ---- env --------------------------------------------------------------------------------
env_report() {
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "command: $command_line"
  echo "commit: $(git -C "$repo" rev-parse HEAD 2>/dev/null || echo unknown)$(git -C "$repo" diff --quiet HEAD 2>/dev/null || echo ' (+ uncommitted changes)')"
  echo "host: $(hostname), $(nproc) CPUs, $(free -g | awk '/Mem:/{print $2}') GiB RAM"
  echo "os: $(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME")"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv,noheader 2>&1 | sed 's/^/gpu: /'
  echo "python: $py"
  "$py" -c 'import torch, sys; print("torch:", torch.__version__, "cuda:", torch.version.cuda, "available:", torch.cuda.is_available(), "devices:", torch.cuda.device_count()); print("torch cmake prefix:", torch.utils.cmake_prefix_path); import os; inc=os.path.join(os.path.dirname(torch.__file__), "include"); print("wheel gloo headers:", os.path.isdir(os.path.join(inc, "gloo")))'
  echo "nvcc: $(command -v nvcc || echo 'not on PATH') $(nvcc --version 2>/dev/null | tail -1)"
  local cuda_home; cuda_home=$(dirname "$(dirname "$(command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)")")
  echo "CUDA toolkit libraries in $cuda_home: $(ls "$cuda_home"/lib64 "$cuda_home"/lib 2>/dev/null | grep -oE '^lib(cudart|nvrtc|cublas|cufft|curand|cusparse|cusolver|nvToolsExt|nvJitLink)\.so' | sort -u | tr '\n' ' ')"
  echo "cmake: $(cmake --version | head -1); ninja: $(ninja --version); c++: $(c++ --version | head -1)"
  echo "deps: $deps: $(head -1 "$deps/MANIFEST.txt" 2>/dev/null || echo MISSING)"
}
if [ -z "$(command -v nvcc)" ] && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH="/usr/local/cuda/bin:$PATH"; fi
export -f env_report
stage env 30 5 0 env_report
cp "$out/logs/env.log" "$out/env.txt" 2>/dev/null
[ -d "$deps" ] || note "warning: $deps missing: yaml-cpp/nlohmann/CLI11/GoogleTest come from the system, if there"

# ---- build ------------------------------------------------------------------------------
torch_prefix=$("$py" -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null)
nvcc_path=$(command -v nvcc || true)
# GoogleTest is built from its sources (.gpu-deps/src/googletest): the static archives of
# Debian 12 are GCC 12 objects, and this machine compiles with another GCC.
configure() {
  local extra=()
  [ -n "$nvcc_path" ] && extra+=("-DCUDAToolkit_ROOT=$(dirname "$(dirname "$nvcc_path")")" "-DCMAKE_CUDA_COMPILER=$nvcc_path")
  [ -d "$deps" ] && extra+=("-DGRADGUARD_DEPS_PREFIX=$repo/$deps")
  cmake -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$torch_prefix" \
    -DGRADGUARD_PYTHON="$py" -DGRADGUARD_BUILD_TESTS=ON -DGRADGUARD_BUILD_BENCH=ON -DGRADGUARD_BUILD_FUZZ=OFF \
    -DTORCH_CUDA_ARCH_LIST=9.0 -DCMAKE_CUDA_ARCHITECTURES=90 -DGRADGUARD_GTEST_FROM_SOURCE=ON "${extra[@]}"
}
export -f configure
export torch_prefix nvcc_path
stage configure 90 20 1 configure
grep -E "gradguard:|CUDA|Caffe2|warning|Error" "$out/logs/configure.log" 2>/dev/null | head -40 | sed 's/^/    /'
if [ -f "$out/logs/configure.log" ] && ! grep -q "GPU code: CUDA" "$out/logs/configure.log"; then
  note "warning: the configure log does not say 'GPU code: CUDA': the CUDA paths are not compiled in"
fi
stage build 300 60 1 ninja -C "$build" -j"$jobs" gradguard_cli gradguard_tests gpu_step

tests_bin="$build/tests/gradguard_tests"
gg_bin="$build/gradguard"
step_bin="$build/bench/gpu_step"

# ---- GPU tests --------------------------------------------------------------------------
# core/device's CUDA cases, the CUDA prefetcher, and anything else named for the GPU.
gpu_filter='*Device*:*Cuda*:*CUDA*:*Gpu*:*GPU*'
stage gputests 120 20 1 "$tests_bin" --gtest_filter="$gpu_filter" --gtest_output="json:$out/gtest-gpu.json" \
  --gtest_color=no

# ---- parity -----------------------------------------------------------------------------
# shellcheck disable=SC2086
stage parity 90 30 1 "$py" bench/gpu/parity.py --gradguard "$gg_bin" --device "$device" --modes "$parity_modes" \
  --work "$repo/$build/parity" --out "$out" ${GRADGUARD_GPU_PARITY_ARGS:-}

# ---- benchmarks -------------------------------------------------------------------------
# The model and batch: $shape (GPT-2-small-sized by default, see the top).
gpustep() {
  # shellcheck disable=SC2086
  "$step_bin" --device "$device" $shape --dtype bf16 --steps 20 --warmup 3 >"$out/gpu_step_bf16.json" || return 1
  [ "$device" = cpu ] && return 0  # fp16 autocast needs a GPU
  # shellcheck disable=SC2086
  "$step_bin" --device "$device" $shape --dtype fp16 --steps 10 --warmup 3 --rounds 1 >"$out/gpu_step_fp16.json"
}
torch_ref() {  # torch_ref eager|compile
  # shellcheck disable=SC2086
  "$py" bench/gpu/torch_ref.py --device "$device" --impl "$1" --steps 20 --warmup 3 $shape >"$out/torch_$1.json"
}
export -f gpustep torch_ref
export step_bin
stage gpustep 90 20 0 gpustep
stage eager 60 20 0 torch_ref eager
stage compile 150 60 0 torch_ref compile

# ---- the whole suite, with what is left -------------------------------------------------
suite() {
  local junit=()
  ctest --help 2>/dev/null | grep -q -- --output-junit && junit=(--output-junit "$out/ctest-junit.xml")
  cd "$build" && ctest -j "$(( jobs > 8 ? 8 : jobs ))" --timeout 120 --output-on-failure "${junit[@]}"
}
export -f suite
stage suite 600 40 0 suite

# ---- report -----------------------------------------------------------------------------
"$py" bench/gpu/report.py --out "$out" --command "$command_line" --budget "$budget" --elapsed "$(elapsed)" ||
  note "report.py failed; raw results are in $out"
note "done in $(elapsed)s: $out/results.md"
[ -f "$out/results.md" ] && sed -n '1,80p' "$out/results.md"
exit $(( failed_required ? 1 : 0 ))
