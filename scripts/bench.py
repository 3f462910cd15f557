#!/usr/bin/env python3
"""Regenerates the README's figures table: runs every side-by-side benchmark
(Ferrite vs the pinned upstream runtime, interleaved, one run) on this
machine, collects the figures each script records (bench_common.record), and
rewrites the README between the `<!-- bench:begin -->` and
`<!-- bench:end -->` markers with one table, the commit, the date and the
machine it ran on.

Usage: .venv/bin/python scripts/bench.py [--quick] [--only NAME...] [--no-write] [--lock FILE]
       [--save-json FILE]
       .venv/bin/python scripts/bench.py --render FILE

--quick runs fewer rounds (a smoke run, not for the README); --only runs the
named benches (see BENCHES); --no-write prints the table without touching
the README; --lock FILE holds an exclusive flock on FILE while each bench
runs (so builds that take the same lock shared wait); --save-json FILE keeps
the recorded figures (one JSON object a line); --render FILE prints the table
of such a file and runs nothing. Figures taken on other machines (the GPU, 16 quiet cores) are not
produced here: the README lists them separately, each with its command and
date.
"""
import argparse
import contextlib
import fcntl
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = os.path.join(ROOT, ".venv", "bin", "python")
BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"

# name -> (script, full arguments, quick arguments). Each script prints its
# own progress and records its figures through bench_common.record.
BENCHES = {
    "vm": ("bench-vm.py", ["--rounds", "5", "--iterations", "20000000"],
           ["--rounds", "1", "--iterations", "2000000"]),
    "hal": ("bench-hal.py", ["--rounds", "7"], ["--rounds", "1", "--min-time", "0.1"]),
    "python": ("bench-python.py", ["--rounds", "3", "--calls", "5000"], ["--rounds", "1", "--calls", "500"]),
    "zero-copy": ("bench-zero-copy.py", ["--rounds", "3", "--calls", "5"], ["--rounds", "1", "--calls", "1"]),
    "parameters": ("bench-parameters.py", ["--rounds", "3"], ["--rounds", "1"]),
    "tokenizer": ("bench-tokenizer.py", ["--rounds", "3"], ["--rounds", "1"]),
    "model": ("bench-model.py", [], ["--quick"]),
    # Idle and with one busy process per CPU (issue 25), side by side.
    "load": ("bench-load.py", ["--rounds", "3"], ["--rounds", "1", "--min-time", "0.2", "--only", "add", "mlp"]),
    # The committed benches/scaling.png comes from the 16-core device machine
    # (see the README); a sweep here draws its curves beside the build.
    "scaling": ("bench-scaling.py", ["--png", "build/bench/scaling-here.png"],
                ["--quick", "--png", "build/bench/scaling-here.png"]),
}


def fmt(x):
    if x is None:
        return "–"
    if x >= 100:
        return f"{x:,.0f}"
    if x >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}" if x >= 0.1 else f"{x:.3g}"


def marked(ratio, target):
    """A ratio, bold when it meets its target."""
    text = fmt(ratio)
    if target and ratio is not None and ratio <= target:
        return f"**{text}**"
    return text


def table(rows):
    out = []
    area = None
    for r in rows:
        # Rows with a loaded timing (scripts/bench-load.py) show idle and
        # loaded side by side; their target is the loaded ratio's.
        both = "loaded_ferrite" in r
        if r["area"] != area:
            area = r["area"]
            out += ["", f"**{area}**", ""]
            if both:
                out += ["| case | idle Ferrite | idle upstream | idle ratio | loaded Ferrite | "
                        "loaded upstream | loaded ratio | unit | target (loaded) | notes |",
                        "|---|---|---|---|---|---|---|---|---|---|"]
            else:
                out += ["| case | Ferrite | upstream | unit | ratio | target | notes |",
                        "|---|---|---|---|---|---|---|"]
        target = f"≤ {r['target']}" if r.get("target") else ""
        if both:
            out.append(f"| {r['case']} | {fmt(r['ferrite'])} | {fmt(r['upstream'])} | {fmt(r['ratio'])} | "
                       f"{fmt(r['loaded_ferrite'])} | {fmt(r['loaded_upstream'])} | "
                       f"{marked(r['loaded_ratio'], r.get('target'))} | {r['unit']} | {target} | "
                       f"{r.get('note', '')} |")
        else:
            out.append(f"| {r['case']} | {fmt(r['ferrite'])} | {fmt(r['upstream'])} | {r['unit']} | "
                       f"{marked(r['ratio'], r.get('target'))} | {target} | {r.get('note', '')} |")
    return "\n".join(out)


def machine():
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{os.cpu_count()} cores, {cpu}"


@contextlib.contextmanager
def exclusive(path):
    """Holds an exclusive flock on `path` (when given) for the block."""
    if not path:
        yield
        return
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def ensure_python_package():
    """The Python benches import ferrite.runtime from .venv: build and
    install it (release) when it is missing, as scripts/test.sh does."""
    probe = subprocess.run([PY, "-c", "import ferrite.runtime"], cwd=ROOT, capture_output=True)
    if probe.returncode == 0:
        return
    print("bench: ferrite.runtime is not installed in .venv; building it (maturin develop --release)",
          flush=True)
    subprocess.run([PY, "-m", "pip", "install", "-q", "maturin"], cwd=ROOT, check=True)
    subprocess.run([os.path.join(ROOT, ".venv", "bin", "maturin"), "develop", "--release", "-q"],
                   cwd=ROOT, check=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", nargs="*", choices=sorted(BENCHES))
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--lock", help="file to flock exclusively around each bench")
    ap.add_argument("--save-json", help="copy the recorded figures (JSON lines) to this file")
    ap.add_argument("--render", help="print the table of recorded figures (JSON lines) and exit")
    args = ap.parse_args()
    if args.render:
        with open(args.render) as f:
            print(table([json.loads(line) for line in f if line.strip()]))
        return
    if not os.path.exists(PY):
        sys.exit("bench: .venv missing: run scripts/setup-venv.sh first")
    names = args.only or list(BENCHES)
    ensure_python_package()
    with tempfile.NamedTemporaryFile("r", suffix=".jsonl") as results:
        env = dict(os.environ, FERRITE_BENCH_JSON=results.name)
        failed = []
        for i, name in enumerate(names, 1):
            script, full, quick = BENCHES[name]
            path = os.path.join(ROOT, "scripts", script)
            if not os.path.exists(path):
                sys.exit(f"bench: scripts/{script} is missing")
            print(f"\n==> [{i}/{len(names)}] {name}: scripts/{script}", flush=True)
            with exclusive(args.lock):
                rc = subprocess.run([PY, path, *(quick if args.quick else full)], cwd=ROOT, env=env).returncode
            if rc:
                failed.append(name)
        recorded = results.read()
        rows = [json.loads(line) for line in recorded.splitlines() if line.strip()]
    if args.save_json:
        with open(args.save_json, "w") as f:
            f.write(recorded)
    if failed:
        sys.exit(f"bench: failed: {', '.join(failed)} (README left as it was)")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True).stdout.strip()
    head = (f"Generated by `scripts/bench.py{' --quick' if args.quick else ''}` at {commit} on "
            f"{datetime.date.today().isoformat()}, on {machine()}. Ratio = Ferrite time / upstream time "
            f"(lower is better), both runtimes interleaved in one run on the same `.vmfb`, inputs and "
            f"device; a bold ratio meets its target.")
    text = head + "\n" + table(rows)
    print("\n" + text)
    if args.no_write or args.only:
        return
    readme = os.path.join(ROOT, "README.md")
    with open(readme) as f:
        s = f.read()
    if BEGIN not in s or END not in s:
        sys.exit(f"bench: README.md has no {BEGIN} ... {END} section")
    s = s[: s.index(BEGIN) + len(BEGIN)] + "\n" + text + "\n" + s[s.index(END):]
    with open(readme, "w") as f:
        f.write(s)
    print("bench: README.md figures updated")


if __name__ == "__main__":
    main()
