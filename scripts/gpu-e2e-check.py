#!/usr/bin/env python3
"""Upstream's e2e check suites on cuda, Ferrite next to upstream, per
function: every module under E2E_DIR/<suite>/ (scripts/gpu-e2e-build.sh)
runs under `ferrite check-module --device=cuda` and under upstream's
`iree.runtime` cuda driver (scripts/check-with-python.py, the pinned wheel
has no iree-check-module). Prints a per-suite table (functions upstream
passes, Ferrite passes, regressions) and every regression: a function
upstream passes that Ferrite fails or does not run. Exits 1 on any
regression; functions upstream fails are reported, not counted.

Usage: gpu-e2e-check.py --ferrite BIN --e2e-dir DIR [--upstream-pythonpath P]
Without --upstream-pythonpath (no upstream wheel) every Ferrite failure
counts as a regression.
"""
import argparse
import os
import re
import subprocess
import sys
from collections import defaultdict

RESULT = re.compile(r"^\[ +(OK|FAILED) +\] (\S+?)\.(\S+?)(?: \(\d+ ms\))?(?::.*)?$")


def verdicts(text):
    out = {}
    for line in text.splitlines():
        m = RESULT.match(line)
        if m:
            out[m.group(3)] = m.group(1)
    return out


def run(cmd, env=None, timeout=600):
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        return p.stdout + p.stderr
    except subprocess.TimeoutExpired as e:
        return (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ferrite", required=True)
    ap.add_argument("--e2e-dir", required=True)
    ap.add_argument("--upstream-pythonpath")
    ap.add_argument("--log")
    args = ap.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))
    table = defaultdict(lambda: defaultdict(int))
    regressions, upstream_fails = [], []
    log = open(args.log, "a") if args.log else None
    for suite in sorted(os.listdir(args.e2e_dir)):
        d = os.path.join(args.e2e_dir, suite)
        modules = sorted(os.path.join(d, m) for m in os.listdir(d) if m.endswith(".vmfb")) \
            if os.path.isdir(d) else []
        if not modules:
            continue
        for m in modules:
            fe_out = run([args.ferrite, "check-module", "--device=cuda", f"--module={m}"])
            fe = verdicts(fe_out)
            if args.upstream_pythonpath:
                env = dict(os.environ, PYTHONPATH=args.upstream_pythonpath)
                up_out = run([sys.executable, os.path.join(here, "check-with-python.py"),
                              "--runtime", "iree", "--device", "cuda", m], env=env, timeout=900)
                up = verdicts(up_out)
            else:
                up_out, up = "", {}
            if log:
                log.write(f"== {m}\n-- ferrite\n{fe_out}\n-- upstream\n{up_out}\n")
            names = sorted(set(fe) | set(up))
            if not names:
                # Nothing ran: the module failed to load on one side.
                names = ["<module>"]
            t = table[suite]
            for fn in names:
                u, f = up.get(fn), fe.get(fn)
                t["functions"] += 1
                t["upstream_pass"] += u == "OK"
                t["ferrite_pass"] += f == "OK"
                what = f"{suite}/{os.path.basename(m)} {fn}"
                if f != "OK" and (u == "OK" or not args.upstream_pythonpath):
                    t["regress"] += 1
                    tail = " ".join(fe_out.strip().splitlines()[-2:])[:300]
                    regressions.append(f"{what}: ferrite {f or 'did not run'}: {tail}")
                elif u != "OK" and args.upstream_pythonpath:
                    upstream_fails.append(f"{what}: upstream {u or 'did not run'}, ferrite {f or 'did not run'}")
    hdr = ["suite", "functions", "upstream pass", "ferrite pass", "regressions"]
    rows = [hdr]
    tot = defaultdict(int)
    for suite in sorted(table):
        t = table[suite]
        rows.append([suite, t["functions"], t["upstream_pass"] if args.upstream_pythonpath else "-",
                     t["ferrite_pass"], t["regress"]])
        for k, v in t.items():
            tot[k] += v
    rows.append(["total", tot["functions"], tot["upstream_pass"] if args.upstream_pythonpath else "-",
                 tot["ferrite_pass"], tot["regress"]])
    w = [max(len(str(r[i])) for r in rows) for i in range(len(hdr))]
    print("== upstream e2e suites on cuda, per function (Ferrite check-module vs upstream iree.runtime)")
    for r in rows:
        print("  ".join(str(c).ljust(w[i]) if i == 0 else str(c).rjust(w[i]) for i, c in enumerate(r)))
    if upstream_fails:
        print(f"-- {len(upstream_fails)} function(s) upstream's cuda driver fails (not counted):")
        for x in upstream_fails:
            print("  " + x)
    if regressions:
        print(f"-- {len(regressions)} regression(s): upstream passes, Ferrite does not:")
        for x in regressions:
            print("  FAIL " + x)
    print(f"gpu-e2e: {tot['ferrite_pass']} passed, {tot['regress']} regressions")
    return 1 if regressions else 0


if __name__ == "__main__":
    sys.exit(main())
