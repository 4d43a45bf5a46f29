#!/usr/bin/env bash
# `pip install --no-build-isolation .` into a virtual environment that uses Debian's torch
# (--system-site-packages), as docs/python.md tells a user: the package must land in the
# environment (not the build tree a .pth file points at) and import there.
# Usage: pip_install_test.sh SOURCE_DIR BUILD_DIR PYTHON
set -euo pipefail
src=$1 build=$2 python=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$python" -m venv --system-site-packages "$tmp/venv"
# The build directory's module was built for $python, whose torch the environment shares.
GRADGUARD_BUILD_DIR="$build" "$tmp/venv/bin/python" -m pip install --no-build-isolation --no-index --no-deps \
  --disable-pip-version-check -q "$src"
cd "$tmp"
"$tmp/venv/bin/python" - "$tmp/venv" <<'PY'
import os, sys
import torch, gradguard
venv = os.path.realpath(sys.argv[1])
where = os.path.realpath(gradguard.__file__)
assert where.startswith(venv + os.sep), "gradguard imported from %s, not the environment %s" % (where, venv)
assert os.path.realpath(gradguard._C.__file__).startswith(venv + os.sep), gradguard._C.__file__
model = torch.nn.Linear(4, 2)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
guard = gradguard.Guard(model, opt)
loss = model(torch.ones(3, 4)).pow(2).mean()
loss.backward()
out = guard.step(0, loss)
assert out.applied and out.grad_norm > 0, out
print("installed in", where, "version", gradguard.__version__, "step applied, grad norm", out.grad_norm)
PY
# Nothing of the install is left in the source tree outside build/.
for leftover in "$src/gradguard.egg-info" "$src/python/gradguard.egg-info" "$src/python/gradguard/_C"*.so; do
  [ ! -e "$leftover" ] || { echo "pip left $leftover in the source tree"; exit 1; }
done
