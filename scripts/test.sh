#!/usr/bin/env bash
# Builds gradguard with its tests (build/, Release) and runs the whole suite with CTest.
# Extra arguments go to ctest, e.g. scripts/test.sh -R Config.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGRADGUARD_BUILD_TESTS=ON >/dev/null
cmake --build build -j"$(nproc)"
cd build
ctest --output-on-failure -j"$(nproc)" "$@"
