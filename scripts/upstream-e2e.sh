#!/usr/bin/env bash
# Runs upstream IREE's e2e check suites (tests/e2e/<suite>) through
# `ferrite check-module`, on local-sync and local-task.
#
#   scripts/upstream-e2e.sh [suite...]      (default: all suites below)
#
# The test sources are read from a mirror of iree-org/iree at run time
# (nothing of them is kept in this repository): IREE_MIRROR, default
# /work/.mirror/iree-org+iree/repo. For each suite the llvm-cpu variants of
# `iree_check_single_backend_test_suite` in its CMakeLists.txt give the
# sources and extra compiler flags (list_suite below);
# generated sources (math) are produced by running the suite's generator.
# Files that the pinned compiler rejects are counted as "skipped: does not
# compile". Everything goes to build/upstream-e2e/<suite>/<variant>/.
#
# Environment: IREE_COMPILE (default .venv/bin/iree-compile), FERRITE
# (default target/release/ferrite), JOBS (parallel compiles, default 2),
# DEVICES (default "local-sync local-task"), RUN_TIMEOUT (seconds per
# check-module run, default 600).
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
IREE_MIRROR=${IREE_MIRROR:-/work/.mirror/iree-org+iree/repo}
IREE_COMPILE=${IREE_COMPILE:-$ROOT/.venv/bin/iree-compile}
FERRITE=${FERRITE:-$ROOT/target/release/ferrite}
JOBS=${JOBS:-2}
DEVICES=${DEVICES:-local-sync local-task}
RUN_TIMEOUT=${RUN_TIMEOUT:-600}
OUT=$ROOT/build/upstream-e2e
BASE_FLAGS=(--iree-hal-target-device=local --iree-hal-local-target-device-backends=llvm-cpu
  --iree-llvmcpu-target-cpu=host)
ALL_SUITES=(stablehlo_ops tosa_ops linalg linalg_ext_ops matmul math convolution tensor_ops
  subbyte_types attention encoding)

[ -d "$IREE_MIRROR" ] || { echo "no IREE mirror at $IREE_MIRROR (set IREE_MIRROR)" >&2; exit 2; }
[ -x "$IREE_COMPILE" ] || { echo "no iree-compile at $IREE_COMPILE" >&2; exit 2; }
[ -x "$FERRITE" ] || { echo "no ferrite at $FERRITE (cargo build --release -p ferrite-cli)" >&2; exit 2; }

suites=("$@")
[ ${#suites[@]} -eq 0 ] && suites=("${ALL_SUITES[@]}")

# compile_one ID MLIR VMFB FLAGS...: prints one progress line.
compile_one() {
  local id=$1 mlir=$2 vmfb=$3
  shift 3
  if "$IREE_COMPILE" "${BASE_FLAGS[@]}" "$@" "$mlir" -o "$vmfb" >"$vmfb.compile.log" 2>&1; then
    echo "  compiled  $id"
  else
    rm -f "$vmfb"
    echo "  SKIPPED   $id (does not compile: $(grep -m1 -o 'error: .*' "$vmfb.compile.log" | cut -c1-120))"
  fi
}
export -f compile_one
export IREE_COMPILE
export BASE_FLAGS_STR="${BASE_FLAGS[*]}"

# list_suite MIRROR SUITE: the llvm-cpu check tests of tests/e2e/SUITE, read
# from its CMakeLists.txt. Prints `# note` lines, then per llvm-cpu variant of
# iree_check_single_backend_test_suite a line `V<TAB>name<TAB>extra flags`
# (target-cpu flags dropped: host is used) followed by its sources, `S<TAB>src`
# or, for sources made by an iree_genrule, `G<TAB>out<TAB>command`. Variants
# repeating an earlier one's sources and flags, and sources already listed
# with the same flags, are left out. A suite with no llvm-cpu variant but
# plain .mlir files lists them as variant `plain-llvm-cpu`.
list_suite() {
  python3 - "$@" <<'PY'
import re
import subprocess
import sys

mirror, suite = sys.argv[1], sys.argv[2]
text = subprocess.run(
    ["git", "-C", mirror, "show", f"HEAD:tests/e2e/{suite}/CMakeLists.txt"],
    capture_output=True, text=True, check=True).stdout


def blocks(kind):
    out, cur = [], None
    for raw in text.splitlines():
        line = raw.strip()
        if cur is None:
            if line.startswith(kind + "("):
                cur = []
            continue
        if line == ")":
            out.append(cur)
            cur = None
            continue
        if not line or line.startswith("#"):
            continue
        cur.append(line)
    return out


def fields(lines):
    d, key = {}, None
    for line in lines:
        if re.fullmatch(r"[A-Z_]+", line):
            key = line
            d.setdefault(key, [])
        elif key:
            d[key].append(line.strip('"').replace("\\(", "(").replace("\\)", ")"))
    return d


gens = {}
for b in blocks("iree_genrule"):
    f = fields(b)
    for o in f.get("OUTS", []):
        gens[o] = " ".join(f.get("CMD", []))

variants = [fields(b) for b in blocks("iree_check_single_backend_test_suite")]
cpu = [v for v in variants if v.get("TARGET_BACKEND") == ["llvm-cpu"]]
runners = blocks("iree_generated_e2e_runner_test")
if runners:
    r = fields(runners[0])
    print(f"# {len(runners)} iree_generated_e2e_runner_test targets (runner "
          f"{r.get('TEST_RUNNER', ['?'])[0]}) need upstream's native e2e test "
          "module (random inputs, reference results): not run")
if not cpu:
    listing = subprocess.run(
        ["git", "-C", mirror, "ls-tree", "--name-only", "HEAD", f"tests/e2e/{suite}/"],
        capture_output=True, text=True, check=True).stdout.split()
    plain = [p.rsplit("/", 1)[-1] for p in listing if p.endswith(".mlir")]
    if plain:
        backends = sorted({w.get("TARGET_BACKEND", ["?"])[0] for w in variants})
        print(f"# no llvm-cpu check suite upstream (only {', '.join(backends) or 'none'}); "
              "compiling its plain .mlir for llvm-cpu anyway")
        print("V\tplain-llvm-cpu\t")
        for name in plain:
            print(f"S\t{name}")
    sys.exit(0)
seen = set()
seen_srcs = set()
for v in cpu:
    name = v.get("NAME", ["?"])[0]
    flags = [f for f in v.get("COMPILER_FLAGS", []) if not f.startswith("--iree-llvmcpu-target-cpu=")]
    key = (tuple(flags), tuple(v.get("SRCS", [])))
    if key in seen:
        print(f"# variant {name}: same sources and flags (target cpu aside) as an earlier one, skipped")
        continue
    seen.add(key)
    if v.get("RUNNER_ARGS"):
        print(f"# variant {name}: runner args not applied: {' '.join(v['RUNNER_ARGS'])}")
    print(f"V\t{name}\t{' '.join(flags)}")
    for src in v.get("SRCS", []):
        base = src.rsplit("/", 1)[-1]
        if (base, tuple(flags)) in seen_srcs:
            print(f"# variant {name}: {base} with the same flags already listed, skipped")
            continue
        seen_srcs.add((base, tuple(flags)))
        if base in gens:
            print(f"G\t{base}\t{gens[base]}")
        else:
            print(f"S\t{src}")
PY
}

summary=()
failures=()
for suite in "${suites[@]}"; do
  echo "=== $suite"
  sdir=$OUT/$suite
  rm -rf "$sdir"
  mkdir -p "$sdir"
  listing=$(list_suite "$IREE_MIRROR" "$suite") || {
    echo "  cannot read tests/e2e/$suite/CMakeLists.txt from the mirror"
    summary+=("$suite|-|-|-|-|-|-|-|unreadable")
    continue
  }
  grep '^#' <<<"$listing" | sed 's/^# /  note: /'
  jobs_file=$sdir/jobs.txt
  : >"$jobs_file"
  variant="" flags=""
  while IFS=$'\t' read -r kind a b; do
    case $kind in
      V) variant=$a flags=$b; mkdir -p "$sdir/$variant" ;;
      S|G)
        name=${a##*/}
        src=$sdir/$variant/$name
        if [ "$kind" = G ]; then
          # The generators named in upstream's CMakeLists read the suite dir.
          gdir=$sdir/generator
          mkdir -p "$gdir"
          for f in $(git -C "$IREE_MIRROR" ls-tree --name-only HEAD "tests/e2e/$suite/"); do
            git -C "$IREE_MIRROR" show "HEAD:$f" >"$gdir/${f##*/}"
          done
          cmd=$(sed -E "s#\\\$\(rootpath ([^)]*)\)#$gdir/\1#g; s#\\\$\(execpath [^)]*\)#$src#g" <<<"$b")
          if ! (cd "$gdir" && bash -c "$cmd") >"$src.gen.log" 2>&1; then
            echo "  SKIPPED   $variant/$name (generator failed: see $src.gen.log)"
            continue
          fi
          echo "  generated $variant/$name"
        else
          git -C "$IREE_MIRROR" show "HEAD:tests/e2e/$suite/$a" >"$src" 2>/dev/null || {
            echo "  SKIPPED   $variant/$name (not in the mirror)"
            continue
          }
        fi
        printf '%s\t%s\t%s\t%s\n' "$variant/$name" "$src" "${src%.mlir}.vmfb" "$flags" >>"$jobs_file"
        ;;
    esac
  done <<<"$listing"

  total=$(wc -l <"$jobs_file")
  # Compile, at most $JOBS at a time.
  set -f
  tr '\n' '\0' <"$jobs_file" | xargs -0 -P "$JOBS" -I{} bash -c '
    IFS=$'"'"'\t'"'"' read -r id mlir vmfb flags <<<"$1"
    read -r -a base <<<"$BASE_FLAGS_STR"
    BASE_FLAGS=("${base[@]}")
    read -r -a extra <<<"$flags"
    compile_one "$id" "$mlir" "$vmfb" "${extra[@]}"' _ {}
  set +f
  compiled=0
  line="$suite"
  declare -A pass=() fail=() errs=()
  while IFS=$'\t' read -r id mlir vmfb flags; do
    [ -f "$vmfb" ] || continue
    compiled=$((compiled + 1))
    for dev in $DEVICES; do
      log=${vmfb%.vmfb}.$dev.log
      timeout "$RUN_TIMEOUT" "$FERRITE" check-module --module="$vmfb" --device="$dev" >"$log" 2>&1
      rc=$?
      counts=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$log" | tail -1)
      p=$(awk '{print $1}' <<<"${counts:-0 passed, 0 failed}")
      f=$(awk '{print $3}' <<<"${counts:-0 passed, 0 failed}")
      pass[$dev]=$(( ${pass[$dev]:-0} + p ))
      fail[$dev]=$(( ${fail[$dev]:-0} + f ))
      if [ -z "$counts" ]; then
        errs[$dev]=$(( ${errs[$dev]:-0} + 1 ))
        why=$(tail -3 "$log" | tr '\n' ' ' | cut -c1-200)
        [ $rc -eq 124 ] && why="timed out after ${RUN_TIMEOUT}s"
        [ $rc -gt 128 ] && [ $rc -ne 124 ] && why="killed by signal $((rc - 128)); $why"
        echo "  ERROR     $id [$dev] check-module exited $rc: $why"
        failures+=("$suite/$id [$dev]: check-module exited $rc: $why (log: $log)")
      else
        status="ok"
        [ "$f" != 0 ] && status="FAILED"
        echo "  ran       $id [$dev]: $p passed, $f failed"
        if [ "$f" != 0 ]; then
          while read -r fn; do
            failures+=("$suite/$id [$dev]: $fn (log: $log)")
          done < <(grep -E '^\[  FAILED  \] ' "$log" | sed 's/^\[  FAILED  \] //; s/ ([0-9]* ms)$//' | sort -u)
        fi
      fi
    done
  done <"$jobs_file"
  skipped=$((total - compiled))
  cols="$suite|$total|$compiled|$skipped"
  for dev in $DEVICES; do
    cols+="|${pass[$dev]:-0}|${fail[$dev]:-0}|${errs[$dev]:-0}"
  done
  summary+=("$cols")
  unset pass fail errs
done

echo
echo "=== summary (functions passed/failed per device; 'errors' = module runs without a result line)"
hdr="suite|files|compiled|skipped: does not compile"
for dev in $DEVICES; do hdr+="|$dev passed|$dev failed|$dev errors"; done
{ echo "$hdr"; printf '%s\n' "${summary[@]}"; } | column -t -s '|'
if [ ${#failures[@]} -gt 0 ]; then
  echo
  echo "=== failures"
  printf '%s\n' "${failures[@]}"
  exit 1
fi
