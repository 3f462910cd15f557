#!/usr/bin/env bash
# Creates <repo>/.venv (if missing) and installs the pinned upstream IREE tools
# that the fixtures and the differential tests use. Idempotent: pip runs only
# when a pinned package is missing or at another version.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
PYTHON="${PYTHON:-python3}"
PINS=(iree-base-compiler==3.13.0 iree-base-runtime==3.13.0)
# perfetto + protobuf: iree-profile-render (Perfetto output of .ireeprof bundles, tested).
EXTRA=(numpy perfetto protobuf)

if [[ ! -x "$VENV/bin/python" ]]; then
  echo "setup-venv: creating $VENV with $($PYTHON --version 2>&1)"
  "$PYTHON" -m venv "$VENV"
else
  echo "setup-venv: using existing $VENV"
fi
PIP=("$VENV/bin/python" -m pip)

# Version of an installed distribution, or nothing.
installed_version() {
  { "${PIP[@]}" show "$1" 2>/dev/null || true; } | awk '/^Version:/ { print $2 }'
}

need=()
for pin in "${PINS[@]}"; do
  name="${pin%%==*}"
  want="${pin##*==}"
  have="$(installed_version "$name")"
  if [[ "$have" == "$want" ]]; then
    echo "setup-venv: $name $have already installed"
  else
    echo "setup-venv: $name ${have:-missing}, want $want"
    need+=("$pin")
  fi
done
for pkg in "${EXTRA[@]}"; do
  have="$(installed_version "$pkg")"
  if [[ -n "$have" ]]; then
    echo "setup-venv: $pkg $have already installed"
  else
    echo "setup-venv: $pkg missing"
    need+=("$pkg")
  fi
done

if [[ ${#need[@]} -gt 0 ]]; then
  echo "setup-venv: pip install ${need[*]}"
  "${PIP[@]}" install --upgrade pip >/dev/null
  "${PIP[@]}" install "${need[@]}"
fi

for tool in iree-as-module iree-run-module iree-dump-module iree-compile; do
  if [[ ! -x "$VENV/bin/$tool" ]]; then
    echo "setup-venv: ERROR: $VENV/bin/$tool missing after install" >&2
    exit 1
  fi
done
echo "setup-venv: ready: $VENV/bin/{iree-compile,iree-as-module,iree-run-module,iree-dump-module}"
