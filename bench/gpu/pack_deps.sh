#!/usr/bin/env bash
# Collects what gradguard's build needs and a GPU machine with only a PyTorch wheel lacks
# into one folder (default .gpu-deps/ at the repository root, git-ignored), taken from this
# Debian machine's installed packages, in /usr's layout so that CMake finds it with
# -DGRADGUARD_DEPS_PREFIX=.gpu-deps:
#
#   include/{yaml-cpp,nlohmann,CLI,gtest,gmock,benchmark}   headers
#   include/{pcre2.h,utf8proc.h}                             the tokenizers' regex and Unicode libraries
#   lib/x86_64-linux-gnu/libyaml-cpp.so*                     yaml-cpp 0.7 (shared; RPATH finds it)
#   lib/x86_64-linux-gnu/lib{pcre2-8,utf8proc}.so*           PCRE2 10.42, utf8proc 2.8 (shared)
#   lib/x86_64-linux-gnu/lib{gtest,gtest_main,gmock,gmock_main}.a, libbenchmark.so*
#   lib/x86_64-linux-gnu/cmake/{yaml-cpp,GTest,benchmark}    their (relocatable) CMake packages
#   share/cmake/{nlohmann_json,CLI11}                        header-only packages
#   src/googletest                                           GoogleTest sources (fallback build)
#   gloo/include/gloo                                        gloo headers, only used when the
#                                                            wheel's torch/include has none
#   MANIFEST.txt                                             package versions, date, size
#
# Debian 12's shared libraries need glibc >= 2.36 and GCC 12's libstdc++: an Ubuntu 24.04
# machine (glibc 2.39, GCC 13) loads them. Everything is built with the C++11 ABI, as
# PyTorch >= 2.7 wheels are.
#
# gloo: c10d's ProcessGroupGloo.hpp (src/dist/communicator.cpp) must match the gloo it
# was written for. Debian 12's gloo (2022) is too old for LibTorch >= 2.6's header; a
# newer copy is taken from a Debian trixie root if one exists here (scripts/torch2.sh
# keeps one; GRADGUARD_GLOO_ROOT names another), else Debian 12's with a warning. The
# build uses it only when the wheel ships no gloo headers of its own.
#
# Usage: bench/gpu/pack_deps.sh [OUT_DIR]        (idempotent: rebuilt from scratch)
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${1:-.gpu-deps}"
arch="$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)"
lib="/usr/lib/$arch"

fail() { printf 'pack_deps.sh: %s\n' "$*" >&2; exit 1; }
need_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "ok installed" ||
  fail "Debian package $1 is not installed (scripts/setup.sh installs it)"; }
for p in libyaml-cpp-dev nlohmann-json3-dev libcli11-dev libgtest-dev libgmock-dev googletest libbenchmark-dev \
         libpcre2-dev libutf8proc-dev; do
  need_pkg "$p"
done

tmp="$out.partial"
rm -rf "$tmp"
mkdir -p "$tmp/include" "$tmp/lib/$arch/cmake" "$tmp/share/cmake" "$tmp/src" "$tmp/gloo/include"

copy() {  # copy SRC DEST_DIR (keeps symlinks, which the .so chains need)
  [ -e "$1" ] || fail "missing $1"
  cp -a "$1" "$2/"
}
# Headers
for h in yaml-cpp nlohmann CLI gtest gmock benchmark pcre2.h utf8proc.h; do copy "/usr/include/$h" "$tmp/include"; done
# Libraries (the .so chain: libX.so -> libX.so.N -> libX.so.N.M.P)
for f in "$lib"/libyaml-cpp.so* "$lib"/libbenchmark.so* "$lib"/libbenchmark_main.a \
         "$lib"/libpcre2-8.so* "$lib"/libutf8proc.so* \
         "$lib"/libgtest.a "$lib"/libgtest_main.a "$lib"/libgmock.a "$lib"/libgmock_main.a; do
  copy "$f" "$tmp/lib/$arch"
done
# CMake packages (all compute their prefix from their own location)
for c in yaml-cpp GTest benchmark; do copy "$lib/cmake/$c" "$tmp/lib/$arch/cmake"; done
for c in nlohmann_json CLI11; do copy "/usr/share/cmake/$c" "$tmp/share/cmake"; done
# GoogleTest sources: tests/CMakeLists.txt builds them when the package above fails to load.
copy /usr/src/googletest "$tmp/src"

# gloo headers: the newest Debian copy on this machine.
gloo_src="" gloo_note=""
for root in ${GRADGUARD_GLOO_ROOT:-} ${GRADGUARD_TORCH2_ROOT:-/var/cache/gradguard/trixie-torch2} \
            /var/cache/gradguard/trixie-probe; do
  if [ -f "$root/usr/include/gloo/rendezvous/store.h" ] &&
     grep -q has_v2_support "$root/usr/include/gloo/rendezvous/store.h"; then
    gloo_src="$root/usr/include/gloo"
    gloo_note="gloo headers from $root ($(dpkg-query --admindir="$root/var/lib/dpkg" -W -f='${Version}' libgloo-dev 2>/dev/null || echo '?'))"
    break
  fi
done
if [ -z "$gloo_src" ] && [ -d /usr/include/gloo ]; then
  gloo_src=/usr/include/gloo
  gloo_note="gloo headers from Debian 12 ($(dpkg-query -W -f='${Version}' libgloo-dev 2>/dev/null || echo '?')): too old for LibTorch >= 2.6 if the wheel ships none"
  printf 'pack_deps.sh: warning: %s\n' "$gloo_note" >&2
fi
[ -n "$gloo_src" ] && cp -a "$gloo_src" "$tmp/gloo/include/"

# Drop what the build never reads (docs, pkg-config files, test sources of googletest).
rm -rf "$tmp/src/googletest/googletest/test" "$tmp/src/googletest/googlemock/test" \
       "$tmp/src/googletest/googletest/samples" "$tmp/src/googletest/googlemock/docs" "$tmp/src/googletest/docs"

{
  echo "gradguard dependency folder made by bench/gpu/pack_deps.sh on $(hostname) at $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "from $(. /etc/os-release && echo "$PRETTY_NAME"), glibc $(ldd --version | head -1 | awk '{print $NF}')"
  for p in libyaml-cpp-dev nlohmann-json3-dev libcli11-dev libgtest-dev libgmock-dev googletest libbenchmark-dev \
           libpcre2-dev libutf8proc-dev; do
    echo "  $p $(dpkg-query -W -f='${Version}' "$p")"
  done
  echo "  ${gloo_note:-no gloo headers found}"
  echo "size: $(du -sh "$tmp" | cut -f1)"
} >"$tmp/MANIFEST.txt"

rm -rf "$out" && mv "$tmp" "$out"
cat "$out/MANIFEST.txt"
size_kb=$(du -sk "$out" | cut -f1)
[ "$size_kb" -le 20480 ] || printf 'pack_deps.sh: warning: %s is %s KiB (over the 20 MiB this folder is meant to stay under)\n' "$out" "$size_kb" >&2
