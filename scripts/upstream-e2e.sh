#!/usr/bin/env bash
# Runs upstream IREE's e2e check suites (tests/e2e/<suite>) through
# `ferrite check-module`, on local-sync and local-task.
#
#   scripts/upstream-e2e.sh [suite...]      (default: all suites below)
#   scripts/upstream-e2e.sh --list [suite...]  (print what would run, run nothing)
#
# The test sources are read from a mirror of iree-org/iree at run time
# (nothing of them is kept in this repository): IREE_MIRROR
# (required). For each suite the llvm-cpu variants of
# `iree_check_single_backend_test_suite` in its CMakeLists.txt give the
# sources and extra compiler flags (list_suite below);
# generated sources (math) are produced by running the suite's generator.
# Suites of generated runner tests (matmul, convolution, attention) run
# each llvm-cpu iree_generated_e2e_runner_test target this host can run:
# its generator (upstream's python, exported into build/ at run time) makes
# a tests and a calls program, both are compiled, and
# `ferrite e2e-{matmul,conv2d,attention}-test` runs the calls.
# Files that the pinned compiler rejects are counted as "skipped: does not
# compile". Everything goes to build/upstream-e2e/<suite>/<variant>/.
#
# Environment: IREE_COMPILE (default .venv/bin/iree-compile), FERRITE
# (default target/release/ferrite), JOBS (parallel compiles, default 2),
# DEVICES (default "local-sync local-task"), RUN_TIMEOUT (seconds per
# check-module run, default 600), PYTHON (generators' interpreter, default
# .venv/bin/python), E2E_ONLY (regex: run only generated runner targets
# whose name matches, e.g. 'cpu_dt_(f32|i8)' or '_small$'), E2E_SKIP (regex:
# leave out generated runner targets whose name matches). With E2E_ONLY or
# E2E_SKIP set, only the targets that run are cleared from the output
# directory, so batches of one suite can run one after another (not at the
# same time: they share <suite>/jobs.txt) and keep each other's logs.
# E2E_VARIANTS: `host` (default) compiles each generated runner target once,
# for this host's CPU (--iree-llvmcpu-target-cpu=host); `upstream` runs it
# once per entry of its TARGET_CPU_FEATURES_VARIANTS for this architecture,
# as upstream's CMake does: `generic` as --iree-llvmcpu-target-cpu=generic,
# `x86_64:<name>:<features>` as --iree-llvmcpu-target-cpu-features=<features>
# with the generator's --requirements=<features>; the instance is named
# <target>_<name> (E2E_ONLY/E2E_SKIP match that name), and one whose
# features this host lacks (per /proc/cpuinfo) is skipped with a note.
# E2E_OUT: output directory (default build/upstream-e2e).
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
IREE_MIRROR=${IREE_MIRROR:?set IREE_MIRROR to a clone or bare git mirror of iree-org/iree}
IREE_COMPILE=${IREE_COMPILE:-$ROOT/.venv/bin/iree-compile}
FERRITE=${FERRITE:-$ROOT/target/release/ferrite}
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
E2E_ONLY=${E2E_ONLY:-}
E2E_SKIP=${E2E_SKIP:-}
E2E_VARIANTS=${E2E_VARIANTS:-host}
JOBS=${JOBS:-2}
DEVICES=${DEVICES:-local-sync local-task}
RUN_TIMEOUT=${RUN_TIMEOUT:-600}
OUT=${E2E_OUT:-$ROOT/build/upstream-e2e}
# The target CPU comes with each job's flags (list_suite).
BASE_FLAGS=(--iree-hal-target-device=local --iree-hal-local-target-device-backends=llvm-cpu)
ALL_SUITES=(stablehlo_ops tosa_ops linalg linalg_ext_ops matmul math convolution tensor_ops
  subbyte_types attention encoding)

LIST_ONLY=0
if [ "${1:-}" = --list ]; then
  LIST_ONLY=1
  shift
fi

case $E2E_VARIANTS in
  host | upstream) ;;
  *) echo "E2E_VARIANTS must be host or upstream, not '$E2E_VARIANTS'" >&2; exit 2 ;;
esac
[ -d "$IREE_MIRROR" ] || { echo "no IREE mirror at $IREE_MIRROR (set IREE_MIRROR)" >&2; exit 2; }
if [ $LIST_ONLY = 0 ]; then
  [ -x "$IREE_COMPILE" ] || { echo "no iree-compile at $IREE_COMPILE" >&2; exit 2; }
  [ -x "$FERRITE" ] || { echo "no ferrite at $FERRITE (cargo build --release -p ferrite-cli)" >&2; exit 2; }
fi

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
# (target-cpu flags replaced by the host's) followed by its sources, `S<TAB>src`
# or, for sources made by an iree_genrule, `G<TAB>out<TAB>command`. Variants
# repeating an earlier one's sources and flags, and sources already listed
# with the same flags, are left out. A suite with no llvm-cpu variant but
# plain .mlir files lists them as variant `plain-llvm-cpu`.
list_suite() {
  FERRITE_SCRIPTS="$ROOT/scripts" python3 - "$@" <<'PY'
import os
import re
import subprocess
import sys

mirror, suite = sys.argv[1], sys.argv[2]
only = sys.argv[3] if len(sys.argv) > 3 else ""
skip = sys.argv[4] if len(sys.argv) > 4 else ""
variant_mode = sys.argv[5] if len(sys.argv) > 5 else "host"
HOST_CPU = "--iree-llvmcpu-target-cpu=host"
text = subprocess.run(
    ["git", "-C", mirror, "show", f"HEAD:tests/e2e/{suite}/CMakeLists.txt"],
    capture_output=True, text=True, check=True).stdout


# CMakeLists.txt parsing shared with scripts/upstream-e2e-check.sh.
sys.path.insert(0, os.environ["FERRITE_SCRIPTS"])
from upstream_e2e_suites import blocks as blocks_of, fields  # noqa: E402


def blocks(kind):
    return blocks_of(text, kind)


gens = {}
for b in blocks("iree_genrule"):
    f = fields(b)
    for o in f.get("OUTS", []):
        gens[o] = " ".join(f.get("CMD", []))

variants = [fields(b) for b in blocks("iree_check_single_backend_test_suite")]
cpu = [v for v in variants if v.get("TARGET_BACKEND") == ["llvm-cpu"]]
def host_cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def host_lacks(features):
    """The LLVM features (`+avx2,+avx512vnni`) /proc/cpuinfo does not list
    (it writes some with an underscore: avx512_vnni, avx512_bf16)."""
    have = host_cpu_flags()
    missing = []
    for feat in features.split(","):
        feat = feat.strip().lstrip("+")
        alt = re.sub(r"^avx512", "avx512_", feat)
        if feat and feat not in have and alt not in have:
            missing.append(feat)
    return missing


def cpu_variants_of(name, entries):
    """(suffix, compiler flags, generator args) per variant to run, as
    upstream's CMake makes them on x86_64; notes the ones left out."""
    if variant_mode == "host":
        return [("", [HOST_CPU], [])]
    out = []
    for entry in entries or ["generic"]:
        if entry in ("generic", "host"):
            out.append(("_" + entry, [f"--iree-llvmcpu-target-cpu={entry}"], []))
            continue
        parts = entry.split(":")
        if len(parts) != 3 or parts[0] != "x86_64":
            continue
        _, vname, features = parts
        missing = host_lacks(features)
        if missing:
            print(f"# {name}_{vname}: this host lacks CPU feature(s) {','.join(missing)}: skipped")
            continue
        out.append(("_" + vname, [f"--iree-llvmcpu-target-cpu-features={features}"],
                    [f"--requirements={features}"]))
    return out


# Generated runner tests (matmul, conv2d, attention): one `R` line per
# llvm-cpu target (and, with E2E_VARIANTS=upstream, CPU variant) this host
# can run.
seen_runs = set()
for b in blocks("iree_generated_e2e_runner_test"):
    f = fields(b)
    name = f["NAME"][0]
    if "llvm-cpu" not in f.get("TARGET_BACKENDS", []):
        continue
    flags = [x for x in f.get("COMPILER_FLAGS", []) if not x.startswith("--iree-llvmcpu-target-cpu=")]
    triple = [x.split("=", 1)[1] for x in flags if x.startswith("--iree-llvmcpu-target-triple=")]
    if any(not t.startswith("x86_64") for t in triple):
        print(f"# {name}: built for {triple[0]}, not this host: skipped")
        continue
    cpu_variants = f.get("TARGET_CPU_FEATURES_VARIANTS", ["default"])
    if not {"default", "generic"} & set(cpu_variants) and not any(v.startswith("x86_64:") for v in cpu_variants):
        print(f"# {name}: cpu feature variants {' '.join(cpu_variants)} are for other architectures: skipped")
        continue
    for suffix, vflags, vgen in cpu_variants_of(name, f.get("TARGET_CPU_FEATURES_VARIANTS")):
        gen_args = f.get("GENERATOR_ARGS", []) + vgen
        key = (tuple(gen_args), tuple(flags + vflags), tuple(f.get("RUNNER_ARGS", [])))
        if key in seen_runs:
            print(f"# {name}{suffix}: same generator args and flags as an earlier target"
                  f"{' (cpu features aside)' if variant_mode == 'host' else ''}: skipped")
            continue
        seen_runs.add(key)
        if only and not re.search(only, name + suffix):
            continue
        if skip and re.search(skip, name + suffix):
            continue
        print("\t".join(["R", name + suffix, f["TEST_TYPE"][0], f["GENERATOR"][0],
                         " ".join(gen_args), " ".join(flags + vflags),
                         " ".join(f.get("RUNNER_ARGS", []))]))
if not cpu:
    listing = subprocess.run(
        ["git", "-C", mirror, "ls-tree", "--name-only", "HEAD", f"tests/e2e/{suite}/"],
        capture_output=True, text=True, check=True).stdout.split()
    plain = [p.rsplit("/", 1)[-1] for p in listing if p.endswith(".mlir")]
    if plain and not seen_runs:
        backends = sorted({w.get("TARGET_BACKEND", ["?"])[0] for w in variants})
        print(f"# no llvm-cpu check suite upstream (only {', '.join(backends) or 'none'}); "
              "compiling its plain .mlir for llvm-cpu anyway")
        print(f"V\tplain-llvm-cpu\t{HOST_CPU}")
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
    print(f"V\t{name}\t{' '.join(flags + [HOST_CPU])}")
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

# tally SUITE ID DEVICE LOG RC: adds a run's `N passed, M failed` to the
# suite's counts (pass/fail/errs) and its failures to `failures`.
tally() {
  local suite=$1 id=$2 dev=$3 log=$4 rc=$5 counts p f why fn
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
    echo "  ERROR     $id [$dev] ferrite exited $rc: $why"
    failures+=("$suite/$id [$dev]: ferrite exited $rc: $why (log: $log)")
  else
    echo "  ran       $id [$dev]: $p passed, $f failed"
    if [ "$f" != 0 ]; then
      while read -r fn; do
        failures+=("$suite/$id [$dev]: $fn (log: $log)")
      done < <(grep -E '^\[  FAILED  \] ' "$log" | sed 's/^\[  FAILED  \] //; s/ ([0-9]* ms)$//' | sort -u)
    fi
  fi
}

if [ $LIST_ONLY = 1 ]; then
  for suite in "${suites[@]}"; do
    echo "=== $suite"
    list_suite "$IREE_MIRROR" "$suite" "$E2E_ONLY" "$E2E_SKIP" "$E2E_VARIANTS" | awk -F'\t' '
      /^#/ { sub(/^# /, "  note: "); print; next }
      $1 == "R" { print "  runner    " $2 " (" $3 ")"; next }
      $1 == "V" { print "  variant   " $2 (length($3) ? " [" $3 "]" : ""); next }
      { print "    source  " $2 }'
  done
  exit 0
fi

summary=()
failures=()
for suite in "${suites[@]}"; do
  echo "=== $suite"
  sdir=$OUT/$suite
  # A filtered run clears only the targets it runs (below).
  [ -z "$E2E_ONLY$E2E_SKIP" ] && rm -rf "$sdir"
  mkdir -p "$sdir"
  listing=$(list_suite "$IREE_MIRROR" "$suite" "$E2E_ONLY" "$E2E_SKIP" "$E2E_VARIANTS") || {
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
      V) variant=$a flags=$b; rm -rf "${sdir:?}/$variant"; mkdir -p "$sdir/$variant" ;;
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
      tally "$suite" "$id" "$dev" "$log" $?
    done
  done <"$jobs_file"
  # Generated runner tests: generate the tests and calls programs, compile
  # both, run them with `ferrite e2e-<type>-test` (the runner flags of the
  # target, if any, passed on).
  pysrc=$OUT/pysrc
  while IFS=$'\t' read -r kind name ttype gen gargs cflags rargs; do
    [ "$kind" = R ] || continue
    total=$((total + 1))
    tdir=$sdir/$name
    rm -rf "$tdir"
    mkdir -p "$tdir"
    if [ ! -d "$pysrc/tests/e2e/$suite" ]; then
      mkdir -p "$pysrc"
      git -C "$IREE_MIRROR" archive HEAD "tests/e2e/$suite" | tar -x -C "$pysrc"
    fi
    read -r -a ga <<<"$gargs"
    if ! (cd "$pysrc" && PYTHONPATH="$pysrc" "$PYTHON" "tests/e2e/$suite/$gen" "${ga[@]}" \
        "--output_${ttype}_mlir=$tdir/$ttype.mlir" "--output_calls_mlir=$tdir/calls.mlir") \
        >"$tdir/gen.log" 2>&1; then
      echo "  SKIPPED   $name (generator failed: see $tdir/gen.log)"
      continue
    fi
    # The generators at the mirror's HEAD write iree_linalg_ext.attention's
    # indexing maps as an attribute dictionary; the pinned compiler parses
    # them only as properties (`<{...}>`). Same op, older syntax.
    if grep -q 'iree_linalg_ext\.attention {' "$tdir/$ttype.mlir"; then
      perl -0pi -e 's/iree_linalg_ext\.attention \{(\s*indexing_maps = \[.*?\])\s*\}(\s*ins\()/iree_linalg_ext.attention <{$1}>$2/gs' \
        "$tdir/$ttype.mlir"
      echo "  note: $name: attention indexing maps rewritten as properties <{...}> for the pinned compiler"
    fi
    read -r -a cf <<<"$cflags"
    compile_one "$name/$ttype" "$tdir/$ttype.mlir" "$tdir/$ttype.vmfb" "${cf[@]}" &
    compile_one "$name/calls" "$tdir/calls.mlir" "$tdir/calls.vmfb" "${cf[@]}"
    wait
    [ -f "$tdir/$ttype.vmfb" ] && [ -f "$tdir/calls.vmfb" ] || continue
    compiled=$((compiled + 1))
    read -r -a ra <<<"$rargs"
    for dev in $DEVICES; do
      log=$tdir/$dev.log
      timeout "$RUN_TIMEOUT" "$FERRITE" "e2e-$ttype-test" --module="$tdir/$ttype.vmfb" \
        --module="$tdir/calls.vmfb" --device="$dev" "${ra[@]}" >"$log" 2>&1
      tally "$suite" "$name" "$dev" "$log" $?
    done
  done <<<"$listing"

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
