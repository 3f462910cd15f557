#!/usr/bin/env python3
"""Upstream IREE e2e check suites read from a source directory (test data
beside the repository, never committed), for scripts/upstream-e2e-check.sh.

  upstream_e2e_suites.py plan   --root DIR --tsv TSV --out DIR --compiler-id FILE [--all]
  upstream_e2e_suites.py report --tsv TSV --jobs JOBS --devices "local-sync local-task"
  upstream_e2e_suites.py lit    --log LOG --module VMFB --device DEV --src MLIR
                                --ferrite CMD --reference CMD [--timeout S]

`plan` prints one compile-and-run job per (suite, source file, variant) as
tab-separated `suite file variant src key logbase flags`, and `SKIPPED` and
`# note` lines. The files are those of `expected-llvm-cpu.tsv` with at least
one function upstream passes (every file with --all). A file's variants are
the llvm-cpu `iree_check_single_backend_test_suite` entries of its suite's
CMakeLists.txt that list it, with their COMPILER_FLAGS (entries whose flags
differ only in the target CPU count once, with the first one's target CPU).
A file that no llvm-cpu entry lists (written for GPUs, or a lit test) is
compiled for this host's CPU (the generic CPU would run
linalg/large_linalg_matmul.mlir's f16 matmul in software: minutes, not
seconds) with the target-independent flags of the first other backend's
entry that lists it (variant `llvm-cpu-with-flags-of-<entry>`), or with none
(variant `plain-llvm-cpu`). Sources made by an `iree_genrule` (math) are
generated under --out. `key` hashes the compiler's version text, the flags,
the source bytes and, for target-cpu=host, this CPU's model and features:
the compiled module is cached under that name.

`report` reads each job's run logs (`<logbase>.<device>.log`, ending with the
`### exit N` line the shell script appends) and compares every function with
upstream's verdict: a function upstream passes must pass on every device in
every variant that lists its file, or it is a regression (exit status 1).

`lit` handles the functions check-module skips for their signature (see
cmd_lit).
"""
import argparse
import hashlib
import os
import re
import shlex
import subprocess
import sys
from collections import defaultdict

BASE_FLAGS = ["--iree-hal-target-device=local", "--iree-hal-local-target-device-backends=llvm-cpu"]
DEFAULT_CPU = "--iree-llvmcpu-target-cpu=generic"
HOST_CPU = "--iree-llvmcpu-target-cpu=host"


def host_cpu_id():
    """What `target-cpu=host` compiles for: the model and feature flags of
    this machine's CPU (part of the cache key of such modules)."""
    try:
        with open("/proc/cpuinfo") as f:
            lines = f.read().splitlines()
    except OSError:
        return b"unknown"
    keep = [l for l in lines if l.startswith(("model name", "flags"))][:2]
    return "\n".join(keep).encode()
TARGET_CPU = "--iree-llvmcpu-target-cpu="


# CMakeLists.txt parsing (scripts/upstream-e2e.sh imports these two too).
def blocks(text, kind):
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


def read_tsv(path):
    rows = []
    with open(path) as f:
        header = f.readline().rstrip("\n").split("\t")
        if header[:4] != ["suite", "file", "function", "upstream_llvm_cpu"]:
            sys.exit(f"{path}: unexpected header {header}")
        for line in f:
            if line.strip():
                suite, file, fn, verdict = line.rstrip("\n").split("\t")[:4]
                rows.append((suite, file, fn, verdict))
    return rows


def suite_dir(root, suite):
    """tests/e2e/<suite>, or a nested one (regression_stablehlo ->
    regression/stablehlo)."""
    e2e = os.path.join(root, "tests", "e2e")
    direct = os.path.join(e2e, suite)
    if os.path.isdir(direct):
        return direct
    parts = suite.split("_")
    for i in range(1, len(parts)):
        nested = os.path.join(e2e, "_".join(parts[:i]), "_".join(parts[i:]))
        if os.path.isdir(nested):
            return nested
    return None


# Flags of other backends' check suites that only concern their targets.
GPU_FLAG = re.compile(r"--iree-(rocm|hip|cuda|vulkan|spirv|metal|llvmgpu|codegen-llvmgpu|gpu|hal-target)")


def check_suites(cmake_text):
    """[(name, backend, flags, [source basenames])] of the check suites, and
    {generated basename: command} of the genrules."""
    gens = {}
    for b in blocks(cmake_text, "iree_genrule"):
        f = fields(b)
        for o in f.get("OUTS", []):
            gens[o] = " ".join(f.get("CMD", []))
    out = []
    for b in blocks(cmake_text, "iree_check_single_backend_test_suite"):
        v = fields(b)
        out.append((v.get("NAME", ["?"])[0], (v.get("TARGET_BACKEND") or ["?"])[0],
                    v.get("COMPILER_FLAGS", []), [s.rsplit("/", 1)[-1] for s in v.get("SRCS", [])]))
    return out, gens


def cmd_plan(args):
    rows = read_tsv(args.tsv)
    with open(args.compiler_id, "rb") as f:
        compiler_id = f.read()
    files = defaultdict(lambda: {"pass": 0, "skip": 0})
    for suite, file, _, verdict in rows:
        files[(suite, file)][verdict] += 1
    by_suite = defaultdict(list)
    for (suite, file), n in files.items():
        if n["pass"] or args.all:
            by_suite[suite].append(file)
        else:
            print(f"SKIPPED upstream e2e {suite}/{file}: upstream skips all {n['skip']} function(s)"
                  " on llvm-cpu (not compiled; E2E_ALL=1 tries it)")
    for suite in sorted(by_suite):
        sdir = suite_dir(args.root, suite)
        if sdir is None:
            print(f"# {suite}: no tests/e2e directory for it under {args.root}")
            continue
        cmake = os.path.join(sdir, "CMakeLists.txt")
        text = open(cmake).read() if os.path.exists(cmake) else ""
        suites, gens = check_suites(text)
        for file in sorted(by_suite[suite]):
            chosen = []  # (name, flags)
            seen = set()
            for name, backend, flags, srcs in suites:
                if backend != "llvm-cpu" or file not in srcs:
                    continue
                rest = tuple(f for f in flags if not f.startswith(TARGET_CPU))
                if rest in seen:
                    continue
                seen.add(rest)
                if not any(f.startswith(TARGET_CPU) for f in flags):
                    flags = flags + [DEFAULT_CPU]
                chosen.append((name, list(flags)))
            if not chosen:
                # No llvm-cpu suite lists it: the target-independent flags of
                # the first other backend's suite that does (e.g.
                # --iree-input-demote-f64-to-f32=false), else none.
                other = [(n, f) for n, b, f, srcs in suites if file in srcs]
                if other:
                    name, flags = other[0]
                    kept = [f for f in flags if not GPU_FLAG.match(f) and not f.startswith(TARGET_CPU)]
                    chosen = [(f"llvm-cpu-with-flags-of-{name}", kept + [HOST_CPU])]
                else:
                    chosen = [("plain-llvm-cpu", [HOST_CPU])]
            src = os.path.join(sdir, file)
            if file in gens:
                gdir = os.path.join(args.out, "generated", suite)
                os.makedirs(gdir, exist_ok=True)
                src = os.path.join(gdir, file)
                cmd = re.sub(r"\$\(rootpath ([^)]*)\)", lambda m: shlex.quote(os.path.join(sdir, m.group(1))),
                             gens[file])
                cmd = re.sub(r"\$\(execpath [^)]*\)", shlex.quote(src), cmd)
                r = subprocess.run(["bash", "-c", cmd], cwd=sdir, capture_output=True, text=True)
                if r.returncode != 0:
                    print(f"# {suite}/{file}: generator failed: {r.stderr.strip()[-300:]}")
                    continue
            elif not os.path.exists(src):
                print(f"# {suite}/{file}: not in {sdir}")
                continue
            with open(src, "rb") as f:
                body = f.read()
            for name, flags in chosen:
                all_flags = BASE_FLAGS + flags
                h = hashlib.sha256()
                h.update(compiler_id + b"\0" + "\0".join(all_flags).encode() + b"\0" + body)
                if HOST_CPU in all_flags:
                    h.update(b"\0" + host_cpu_id())
                stem = file[:-5] if file.endswith(".mlir") else file
                logbase = os.path.join(args.out, "runs", suite, name, stem)
                print("\t".join([suite, file, name, src, h.hexdigest()[:24], logbase, " ".join(all_flags)]))


RESULT = re.compile(r"^\[ +(OK|FAILED) +\] (\S+?)(?: \(\d+ ms\))?$")
RUN = re.compile(r"^\[ RUN +\] (\S+)$")


def parse_log(path):
    """({function: ("ok"|"failed", error text)}, exit status or None, tail)."""
    try:
        lines = open(path, errors="replace").read().splitlines()
    except OSError:
        return None, None, ""
    res, rc, cur, buf = {}, None, None, []
    for line in lines:
        m = RUN.match(line)
        if m:
            cur, buf = m.group(1), []
            continue
        m = RESULT.match(line)
        if m:
            fn = m.group(2)
            err = " ".join(x.strip() for x in buf if x.strip())
            if cur == fn or fn not in res:
                res[fn] = ("ok" if m.group(1) == "OK" else "failed", err)
            cur, buf = None, []
            continue
        if line.startswith("### exit "):
            rc = int(line.split()[2])
            continue
        if cur is not None:
            buf.append(line)
    tail = " ".join(x.strip() for x in lines[-4:] if not x.startswith("### exit"))
    return res, rc, tail


def lookup(res, fn):
    for k, v in res.items():
        if k == fn or k.endswith("." + fn):
            return v
    return None


def cmd_report(args):
    rows = read_tsv(args.tsv)
    devices = args.devices.split()
    jobs = defaultdict(list)  # (suite, file) -> [(variant, logbase)]
    with open(args.jobs) as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            suite, file, variant, _src, key, logbase, _flags = line.rstrip("\n").split("\t")
            jobs[(suite, file)].append((variant, logbase, key))
    logs = {}
    upstream_runs = {}

    def upstream_fails(key, dev, fn):
        """Whether upstream's own runtime (iree.runtime, checks evaluated by
        scripts/check-with-python.py) fails `fn` of the same compiled module
        on this machine too. expected-llvm-cpu.tsv holds upstream's verdicts
        from its own build host; a float tolerance a reduction meets with one
        host's vector width may fail with another's, for both runtimes."""
        if not args.cache or not args.python:
            return False
        k = (key, dev)
        if k not in upstream_runs:
            module = os.path.join(args.cache, key + ".vmfb")
            cmd = [args.python, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                             "check-with-python.py"),
                   "--runtime", "iree", "--device", dev, module]
            try:
                out = subprocess.run(cmd, capture_output=True, text=True, timeout=600).stdout
            except (OSError, subprocess.TimeoutExpired):
                out = ""
            verdicts = {}
            for ln in out.splitlines():
                m = re.match(r"^\[ +(OK|FAILED) +\] \S+?\.([^\s.]+) \(", ln)
                if m:
                    verdicts[m.group(2)] = m.group(1)
            upstream_runs[k] = verdicts
        return upstream_runs[k].get(fn) == "FAILED"

    def log_of(logbase, dev):
        k = (logbase, dev)
        if k not in logs:
            logs[k] = parse_log(f"{logbase}.{dev}.log")
        return logs[k]

    table = defaultdict(lambda: defaultdict(int))
    regressions, extra, upstream_too = [], [], []
    for suite, file, fn, verdict in rows:
        t = table[suite]
        t["up_" + verdict] += 1
        for dev in devices:
            why = None
            js = jobs.get((suite, file), [])
            if not js:
                why = "not run (not compiled: upstream skips this file)" if verdict == "skip" \
                    else "not run (no job for this file)"
            for variant, logbase, key in js:
                res, rc, tail = log_of(logbase, dev)
                if res is None:
                    why = f"[{variant}] not run: module did not compile (see {logbase}.compile.log)"
                    break
                r = lookup(res, fn)
                if r is None:
                    how = "timed out" if rc == 124 else (
                        f"killed by signal {rc - 128}" if rc and rc > 128 else f"exit {rc}")
                    why = f"[{variant}] not run: check-module {how} before it: {tail[:300]}"
                    break
                if r[0] != "ok":
                    why = f"[{variant}] FAILED: {r[1][:400]}"
                    if verdict == "pass" and upstream_fails(key, dev, fn):
                        upstream_too.append(f"{suite}/{file} {fn} [{dev}]: {r[1][:200]}")
                        why = "upstream-fails-too"
                    break
            if why is None:
                t[dev + "_pass"] += 1
                if verdict == "skip":
                    t[dev + "_extra"] += 1
                    if dev == devices[0]:
                        extra.append(f"{suite}/{file} {fn}")
            elif why == "upstream-fails-too":
                t[dev + "_both"] += 1
            elif verdict == "pass":
                t[dev + "_regress"] += 1
                regressions.append(f"{suite}/{file} {fn} [{dev}]: {why}")
    hdr = ["suite", "upstream pass", "upstream skip"]
    for dev in devices:
        hdr += [f"{dev} pass", f"{dev} regress"]
    out = [hdr]
    tot = defaultdict(int)
    for suite in sorted(table):
        t = table[suite]
        row = [suite, t["up_pass"], t["up_skip"]]
        for dev in devices:
            row += [t[dev + "_pass"], t[dev + "_regress"]]
        for k, v in t.items():
            tot[k] += v
        out.append(row)
    row = ["total", tot["up_pass"], tot["up_skip"]]
    for dev in devices:
        row += [tot[dev + "_pass"], tot[dev + "_regress"]]
    out.append(row)
    widths = [max(len(str(r[i])) for r in out) for i in range(len(hdr))]
    print("=== upstream e2e (llvm-cpu) vs upstream's verdicts; 'pass' counts every function"
          " Ferrite passes, 'regress' the functions upstream passes that Ferrite fails or does not run")
    for r in out:
        print("  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(r, widths))))
    if extra:
        print(f"\n=== {len(extra)} function(s) upstream skips that Ferrite passes (fine): "
              + ", ".join(extra[:20]) + (" ..." if len(extra) > 20 else ""))
    if upstream_too:
        print(f"\n=== {len(upstream_too)} failure(s) upstream's own runtime shares on this machine's"
              " build of the same module (the tsv verdict is from upstream's host; not regressions)")
        for r in upstream_too:
            print("  " + r)
    if regressions:
        print(f"\n=== {len(regressions)} regression(s) against upstream's verdicts")
        for r in regressions:
            print("  " + r)
        return 1
    print("\nno regressions: every function upstream passes passed on " + " and ".join(devices))
    return 0


SKIPPED = re.compile(r"^\[ +SKIPPED +\] (\S+?)\.(\S+) \(signature '([^']*)'")


def run_lines(src):
    """{function or "*": [--input=... args]} from the source's lit `RUN:`
    lines that run it with iree-run-mlir (those naming llvm-cpu first)."""
    lines, cur = [], ""
    for raw in open(src, errors="replace").read().splitlines():
        m = re.match(r"^\s*//\s*RUN:(.*)$", raw)
        if not m:
            continue
        part = m.group(1).rstrip()
        if part.endswith("\\"):
            cur += part[:-1] + " "
            continue
        lines.append(cur + part)
        cur = ""
    runs = [l for l in lines if "iree-run-mlir" in l]
    runs.sort(key=lambda l: "llvm-cpu" not in l)
    out = {}
    for line in runs:
        try:
            words = shlex.split(line.split("|")[0] if "iree-opt" not in line else line.split("|")[1])
        except ValueError:
            continue
        fn = next((w.split("=", 1)[1] for w in words if w.startswith("--function=")), "*")
        out.setdefault(fn, [w for w in words if w.startswith("--input=")])
    return out


def cmd_lit(args):
    """Functions check-module skips for their signature (upstream's lit tests
    run them with iree-run-mlir and FileCheck their output): run each under
    Ferrite's run-module and upstream's iree-run-module on the same module,
    device and the RUN line's inputs, and append a check-module-style result
    to the log: OK when both succeed with the same output."""
    log = open(args.log, errors="replace").read().splitlines()
    skipped = [(m.group(1), m.group(2), m.group(3)) for m in map(SKIPPED.match, log) if m]
    if not skipped:
        return 0
    inputs = run_lines(args.src)
    out = []
    for mod, fn, sig in skipped:
        ins = inputs.get(fn, inputs.get("*"))
        out.append(f"[ RUN      ] {mod}.{fn}")
        if ins is None:
            out.append(f"    no iree-run-mlir RUN line gives this function's inputs (signature '{sig}')")
            out.append(f"[  FAILED  ] {mod}.{fn}")
            continue
        common = [f"--module={args.module}", f"--device={args.device}", f"--function={fn}"] + ins
        res = []
        for cmd in (shlex.split(args.ferrite) + common, shlex.split(args.reference) + common):
            try:
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, stdin=subprocess.DEVNULL)
                res.append((r.returncode, r.stdout.strip(), r.stderr.strip()))
            except subprocess.TimeoutExpired:
                res.append((124, "", f"timed out after {args.timeout} s"))
        (frc, fout, ferr), (urc, uout, uerr) = res
        note = f"(run-module with {' '.join(ins) or 'no inputs'}, compared with upstream iree-run-module)"
        if urc != 0:
            out.append(f"    upstream iree-run-module failed too (exit {urc}): {(uerr or uout)[-300:]}")
            out.append(f"    ferrite: exit {frc}: {(ferr or fout)[-300:]}")
            out.append(f"[  FAILED  ] {mod}.{fn}")
        elif frc != 0:
            out.append(f"    ferrite run-module exit {frc}: {(ferr or fout)[-400:]}")
            out.append(f"[  FAILED  ] {mod}.{fn}")
        elif fout != uout:
            out.append(f"    output differs from upstream's: ferrite {fout[-300:]!r} vs upstream {uout[-300:]!r}")
            out.append(f"[  FAILED  ] {mod}.{fn}")
        else:
            out.append(f"    {note}")
            out.append(f"[       OK ] {mod}.{fn}")
    with open(args.log, "a") as f:
        f.write("\n".join(out) + "\n")
    return 0


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("plan")
    p.add_argument("--root", required=True)
    p.add_argument("--tsv", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--compiler-id", required=True)
    p.add_argument("--all", action="store_true")
    r = sub.add_parser("report")
    r.add_argument("--tsv", required=True)
    r.add_argument("--jobs", required=True)
    r.add_argument("--devices", required=True)
    r.add_argument("--cache", help="folder of the compiled modules (<key>.vmfb), for the"
                   " cross-check of failures under upstream's runtime")
    r.add_argument("--python", help="interpreter with upstream's iree.runtime")
    lt = sub.add_parser("lit")
    for a in ("--log", "--module", "--device", "--src", "--ferrite", "--reference"):
        lt.add_argument(a, required=True)
    lt.add_argument("--timeout", type=int, default=300)
    args = ap.parse_args()
    sys.exit({"plan": cmd_plan, "report": cmd_report, "lit": cmd_lit}[args.cmd](args))


if __name__ == "__main__":
    main()
