#!/usr/bin/env bash
# Compiles upstream's e2e check suites for CUDA sm_80: every source of every
# `iree_check_single_backend_test_suite` whose TARGET_BACKEND is "cuda", in
# every suite folder of tests/e2e, with upstream's COMPILER_FLAGS for it
# (target flags replaced by sm_80: the pinned compiler knows no Hopper
# target; the driver JIT-compiles the PTX), into OUT_DIR/<suite>/<name>.vmfb.
# scripts/test-gpu.sh runs them on a GPU (scripts/gpu-e2e-check.py: Ferrite
# and upstream's cuda driver side by side, per function).
#
# Usage: scripts/gpu-e2e-build.sh OUT_DIR [suite...]
# Sources: UPSTREAM_E2E (default ../shared/upstream-e2e, upstream's tests/e2e
# kept as test data, never copied into the repository). JOBS compiles at a
# time (default 2); a module already newer than its source is kept.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
UPSTREAM_E2E=${UPSTREAM_E2E:-$ROOT/../shared/upstream-e2e}
IREE_COMPILE=${IREE_COMPILE:-$ROOT/.venv/bin/iree-compile}
JOBS=${JOBS:-2}
OUT_DIR=${1:?usage: gpu-e2e-build.sh OUT_DIR [suite...]}
shift
E2E=$UPSTREAM_E2E/tests/e2e
[ -d "$E2E" ] || { echo "gpu-e2e-build: no upstream e2e sources at $E2E (set UPSTREAM_E2E)" >&2; exit 2; }
[ -x "$IREE_COMPILE" ] || { echo "gpu-e2e-build: no $IREE_COMPILE (scripts/setup-venv.sh)" >&2; exit 2; }
mkdir -p "$OUT_DIR"

# One line per (suite, source, flags) of the cuda check suites.
python3 - "$E2E" "$@" >"$OUT_DIR/jobs.txt" <<'PY'
import os, re, sys
root, only = sys.argv[1], set(sys.argv[2:])
for suite in sorted(os.listdir(root)):
    cm = os.path.join(root, suite, "CMakeLists.txt")
    if (only and suite not in only) or not os.path.isfile(cm):
        continue
    text = open(cm).read()
    seen = set()
    for block in re.findall(r"iree_check_single_backend_test_suite\((.*?)\n\)", text, re.S):
        d, key = {}, None
        for t in (x.strip() for x in block.split("\n")):
            if not t or t.startswith("#"):
                continue
            t = t.strip('"')
            if re.fullmatch(r"[A-Z_]+", t):
                key = t
                d.setdefault(key, [])
            elif key:
                d[key].append(t)
        if d.get("TARGET_BACKEND") != ["cuda"]:
            continue
        flags = [f for f in d.get("COMPILER_FLAGS", [])
                 if "iree-cuda-target" not in f and "iree-hal-target-device" not in f]
        for src in d.get("SRCS", []):
            path = os.path.join(root, suite, src)
            if not os.path.isfile(path) or (src, tuple(flags)) in seen:
                continue
            seen.add((src, tuple(flags)))
            print("\t".join([suite, src, " ".join(flags)]))
PY
n=$(wc -l <"$OUT_DIR/jobs.txt")
echo "gpu-e2e-build: $n sources of cuda check suites, $JOBS compiles at a time"
export IREE_COMPILE OUT_DIR E2E
tr '\n' '\0' <"$OUT_DIR/jobs.txt" | xargs -0 -r -P "$JOBS" -I{} bash -c '
  IFS=$'"'"'\t'"'"' read -r suite src flags <<<"$1"
  read -r -a fl <<<"$flags"
  name=${src%.mlir}
  # Variants of one source under other flags get their own module.
  [ -n "$flags" ] && name=$name.$(printf "%s" "$flags" | md5sum | cut -c1-8)
  out=$OUT_DIR/$suite/$name.vmfb
  mkdir -p "$OUT_DIR/$suite"
  [ "$out" -nt "$E2E/$suite/$src" ] && exit 0
  if timeout 900 "$IREE_COMPILE" --iree-hal-target-device=cuda --iree-cuda-target=sm_80 \
      "${fl[@]}" "$E2E/$suite/$src" -o "$out.tmp" >"$OUT_DIR/$suite/$name.log" 2>&1; then
    mv "$out.tmp" "$out"
    rm -f "$OUT_DIR/$suite/$name.log"
  else
    rm -f "$out.tmp"
    echo "  $suite/$src: does not compile for cuda ($(grep -m1 -o "error: .*" "$OUT_DIR/$suite/$name.log" | cut -c1-100))"
  fi' _ {}
for d in "$OUT_DIR"/*/; do
  echo "$(basename "$d"): $(ls "$d"*.vmfb 2>/dev/null | wc -l) modules"
done
