#!/usr/bin/env bash
# scripts/check_layers.py against small hand-made trees: it must name an include that goes
# down the layer table (exit 1), pass a tree that follows it (exit 0), and refuse a
# design.md without the table (exit 2); then the repository itself must follow its table.
# Exit 77 (skipped) without python3, as in the LibTorch 2.6 chroot.
set -u
command -v python3 >/dev/null 2>&1 || { echo "python3 not found: skipped"; exit 77; }
here="$(cd "$(dirname "$0")/../.." && pwd)"
check="$here/scripts/check_layers.py"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail=0
expect() {  # expect CODE DESCRIPTION -- runs the check on $tmp/repo
  local code=$1 what=$2 out rc=0
  out="$(python3 "$check" "$tmp/repo" 2>&1)" || rc=$?
  if [ "$rc" -ne "$code" ]; then
    echo "FAIL: $what: exit $rc, expected $code"; echo "$out"; fail=1
  else
    echo "ok: $what"
  fi
  printf '%s\n' "$out" > "$tmp/out"
}

mkdir -p "$tmp/repo/docs" "$tmp/repo/src/core" "$tmp/repo/src/train" "$tmp/repo/include/gradguard/train"
cat > "$tmp/repo/docs/design.md" <<'MD'
# x
## Layers
| layer | folders | what |
|---|---|---|
| 0. core | `core/` | base |
| 1. train | `train/ config/` | loop |
## Other
MD
printf '#include "gradguard/core/error.h"\n#include "private.h"\n' > "$tmp/repo/src/train/loop.cpp"
printf '#include <vector>\n' > "$tmp/repo/src/core/error.cpp"
expect 0 "includes going up the table pass"

printf '#include <vector>\n#include "gradguard/train/loop.h"\n' > "$tmp/repo/src/core/error.cpp"
expect 1 "core including train is found"
grep -q "src/core/error.cpp:2: includes gradguard/train/loop.h (1. train) from 0. core" "$tmp/out" ||
  { echo "FAIL: the violation is not named with file, line and layers"; cat "$tmp/out"; fail=1; }

printf '# x\n## Layers\nno table here\n' > "$tmp/repo/docs/design.md"
expect 2 "a design.md without the table is refused"

rc=0
python3 "$check" "$here" || rc=$?
if [ "$rc" -ne 0 ]; then echo "FAIL: the repository does not follow docs/design.md's layer table"; fail=1; fi
exit $fail
