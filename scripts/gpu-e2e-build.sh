#!/usr/bin/env bash
# Compiles upstream's e2e check suites (tests/e2e/<suite>) for CUDA sm_80:
# the sources of each suite's `iree_check_single_backend_test_suite` whose
# TARGET_BACKEND is "cuda", with upstream's COMPILER_FLAGS for it, into
# $OUT_DIR/<suite>/<name>.vmfb. scripts/test-gpu.sh runs them on a GPU.
# Usage: IREE_MIRROR=... scripts/gpu-e2e-build.sh OUT_DIR [suite...]
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
IREE_MIRROR=${IREE_MIRROR:?set IREE_MIRROR to a clone or bare git mirror of iree-org/iree}
IREE_COMPILE=${IREE_COMPILE:-$ROOT/.venv/bin/iree-compile}
OUT_DIR=${1:?usage: gpu-e2e-build.sh OUT_DIR [suite...]}
shift
suites=("$@")
[ ${#suites[@]} -eq 0 ] && suites=(tosa_ops stablehlo_ops linalg math tensor_ops)
for suite in "${suites[@]}"; do
  mkdir -p "$OUT_DIR/$suite"
  python3 - "$IREE_MIRROR" "$suite" <<'PY' > "$OUT_DIR/$suite/sources.txt"
import re, subprocess, sys
mirror, suite = sys.argv[1], sys.argv[2]
text = subprocess.run(["git", "-C", mirror, "show", f"HEAD:tests/e2e/{suite}/CMakeLists.txt"],
                      capture_output=True, text=True).stdout
for block in re.findall(r"iree_check_single_backend_test_suite\((.*?)\n\)", text, re.S):
    toks = [t.strip().strip('"') for t in block.split("\n") if t.strip() and not t.strip().startswith("#")]
    d, key = {}, None
    for t in toks:
        if re.fullmatch(r"[A-Z_]+", t):
            key = t; d.setdefault(key, [])
        elif key:
            d[key].append(t)
    if d.get("TARGET_BACKEND") != ["cuda"] or d.get("DRIVER") != ["cuda"]:
        continue
    flags = " ".join(f for f in d.get("COMPILER_FLAGS", []) if "iree-cuda-target" not in f)
    for src in d.get("SRCS", []):
        print(src, flags)
PY
  n=0
  while read -r src flags; do
    [ -z "$src" ] && continue
    name=${src%.mlir}
    git -C "$IREE_MIRROR" show "HEAD:tests/e2e/$suite/$src" > "$OUT_DIR/$suite/$src" 2>/dev/null || continue
    # shellcheck disable=SC2086
    if "$IREE_COMPILE" --iree-hal-target-device=cuda --iree-cuda-target=sm_80 $flags \
        "$OUT_DIR/$suite/$src" -o "$OUT_DIR/$suite/$name.vmfb" >"$OUT_DIR/$suite/$name.log" 2>&1; then
      n=$((n + 1))
    else
      echo "  $suite/$name: does not compile for cuda ($(grep -m1 -o 'error: .*' "$OUT_DIR/$suite/$name.log" | cut -c1-100))"
    fi
    rm -f "$OUT_DIR/$suite/$src" "$OUT_DIR/$suite/$name.log"
  done < "$OUT_DIR/$suite/sources.txt"
  echo "$suite: $n modules compiled for cuda"
done
