#!/usr/bin/env python3
"""Where one SmolLM2 decode step's time goes on Ferrite (issue 27): a
per-dispatch profile of one decode step, grouped by kind.

    .venv/bin/python scripts/profile-decode-step.py [--device=local-task] [--gguf=PATH]
        [--prompt_len=16] [--warmup=8] [--steps=1] [--output=F.ireeprof] [--top=12]

Loads examples/llm/smollm2.vmfb with the `.gguf` through `ferrite.runtime`
(the loop of examples/llm/upstream_loop.py --runtime=ferrite), prefills a
prompt, runs `--warmup` decode steps, then records `--steps` decode steps
with `HalDevice.begin_profiling("queue-events,host-execution,dispatch-events")`
into an `.ireeprof` bundle, reads it back with the pinned `iree-profile
dispatch --format=jsonl` and prints the top dispatches by share of the
step's wall time (the `decode` call, timed by the host around it) and the
same time grouped by kind: the Q4_1 matrix-vector products, attention (the
scores against the KV cache, softmax, the weighted sum of values), norms
(RMS norm reductions) and elementwise kernels (rotary embedding, SiLU
gating, residual adds, cache writes). The kind of each export comes from
its name as the compiler gives it (`decode_dispatch_N_<kind>_<shape>`),
see `kind_of`. The rest of the step's wall time is split into the gaps
between dispatches inside the command buffer's execution and the time
outside it (VM, submission, the Python call, the copy of the logits).
Recording costs a few microseconds per dispatch (docs/status.md, issue 28),
which the wall time includes.
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
VMFB = ROOT / "examples" / "llm" / "smollm2.vmfb"
GGUF = ROOT / ".cache" / "llm" / "SmolLM2-135M-Instruct.Q4_1.gguf"


def iree_profile():
    for c in (Path(sys.executable).parent / "iree-profile", ROOT / ".venv" / "bin" / "iree-profile"):
        if c.exists():
            return str(c)
    sys.exit("iree-profile (the pinned iree-base-runtime) is not installed: scripts/setup-venv.sh")


def kind_of(key):
    """The kind of a dispatch from its export name, which the compiler
    makes `<function>_dispatch_N_<core op>_<shapes>_<element types>`:
    kernels reading i8 operands read Q4_1 blocks (the matrix-vector
    products; the one over the 49152-entry vocabulary is the LM head);
    shapes with the dynamic KV length `D` are attention (scores, softmax
    reductions, the weighted sum of values); a reduction over the model
    width 576 alone is an RMS norm; `elementwise` kernels are the rotary
    embedding, SiLU gating, residual adds and scaling."""
    k = key.split("_dispatch_", 1)[-1]
    parts = k.split("_")
    op = "_".join(parts[1:])
    if "xi8" in op:
        return "LM head" if "49152" in op else "Q4_1 matvec"
    if any("D" in p for p in parts[2:3]) or "xD" in op:
        return "attention"
    if op.startswith("reduction_576_"):
        return "norm"
    if op.startswith("elementwise"):
        return "elementwise"
    return "other"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="local-task")
    ap.add_argument("--gguf", default=str(GGUF))
    ap.add_argument("--vmfb", default=str(VMFB))
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--prompt_len", type=int, default=16)
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--steps", type=int, default=1, help="decode steps recorded")
    ap.add_argument("--output", default="decode-step.ireeprof")
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--json", help="also write the grouped figures here")
    args = ap.parse_args()
    if not Path(args.gguf).exists():
        sys.exit(f"{args.gguf}: no such file (scripts/run-example.sh llm fetches it into .cache/llm)")

    import ferrite.runtime as rt

    config = rt.Config(args.device)
    index = rt.ParameterIndex()
    index.load(str(args.gguf))
    params = rt.create_io_parameters_module(config.vm_instance, index.create_provider(scope="model"))
    hal = rt.create_hal_module(config.vm_instance, config.device)
    module = rt.VmModule.mmap(config.vm_instance, str(args.vmfb))
    ctx = rt.SystemContext(vm_modules=[params, hal, module], config=config)
    m = ctx.modules.smollm2
    m.init_cache(int(args.context))

    prompt = np.arange(1, args.prompt_len + 1, dtype=np.int32)
    token = int(np.argmax(m.prefill(prompt, 0).to_host()))
    pos = args.prompt_len
    for _ in range(args.warmup):
        token = int(np.argmax(m.decode(token, pos).to_host()))
        pos += 1

    out = os.path.abspath(args.output)
    step_ns = []
    config.device.begin_profiling("queue-events,host-execution,dispatch-events", out)
    for _ in range(args.steps):
        t0 = time.perf_counter_ns()
        logits = m.decode(token, pos).to_host()
        step_ns.append(time.perf_counter_ns() - t0)
        token = int(np.argmax(logits))
        pos += 1
    config.device.end_profiling()

    text = subprocess.run([iree_profile(), "dispatch", "--dispatch_events", "--format=jsonl", out],
                          capture_output=True, text=True, check=True).stdout
    rows = [json.loads(l) for l in text.splitlines()]
    summary = next(r for r in rows if r["type"] == "dispatch_summary")
    durations = {}
    for r in rows:
        if r["type"] == "host_dispatch_event":
            durations.setdefault(r["key"], []).append(r["duration_ns"])
    # Per export: its count, total and median time. On a busy machine a
    # dispatch whose thread lost the CPU takes a time slice longer; the
    # median times the count is the export's typical cost per step.
    groups = [{"key": k, "count": len(d), "total_ns": sum(d),
               "typical_ns": sorted(d)[len(d) // 2] * len(d)} for k, d in durations.items()]
    wall = sum(step_ns)
    total = sum(g["total_ns"] for g in groups)
    typical = sum(g["typical_ns"] for g in groups)
    count = sum(g["count"] for g in groups)
    print(f"bundle: {out}")
    print(f"device {args.device}, {args.steps} decode step(s) from position {args.prompt_len + args.warmup}: "
          f"wall {wall / args.steps / 1e6:.2f} ms/step, {count // args.steps} dispatches/step "
          f"(iree-profile: {summary['valid_host_dispatches']} valid), "
          f"dispatch time {total / args.steps / 1e6:.2f} ms/step ({100 * total / wall:.1f}% of wall), "
          f"typical (medians) {typical / args.steps / 1e6:.2f} ms/step")
    by_kind = {}
    for g in groups:
        c = by_kind.setdefault(kind_of(g["key"]), [0, 0, 0, 0])
        c[0] += g["total_ns"]
        c[1] += g["typical_ns"]
        c[2] += g["count"]
        c[3] += 1
    print("by kind: measured time and share of the step's wall time; typical (medians) and share of the typical dispatch time:")
    for k, (ns, typ, n, exports) in sorted(by_kind.items(), key=lambda kv: -kv[1][1]):
        print(f"  {k:<15} {ns / args.steps / 1e3:8.1f} us/step {100 * ns / wall:5.1f}%   "
              f"{typ / args.steps / 1e3:8.1f} us/step {100 * typ / typical:5.1f}%   "
              f"{n // args.steps:4d} dispatches {exports:3d} exports")
    # The rest of the step: inside the command buffer's execution but
    # between dispatches (barriers, stage changes, threads waking), and
    # outside it (the VM, the submission, the Python call and the copy of
    # the logits to the host).
    queue = subprocess.run([iree_profile(), "queue", "--format=jsonl", out],
                           capture_output=True, text=True, check=True).stdout
    execute = sum(r["duration_ns"] for r in map(json.loads, queue.splitlines())
                  if r.get("type") == "host_execution_event" and r.get("op") == "execute")
    for what, ns in (("gaps in execute", execute - total), ("outside execute", wall - execute)):
        print(f"  {what:<15} {ns / args.steps / 1e3:8.1f} us/step {100 * ns / wall:5.1f}%")
    if args.top:
        print(f"top {args.top} exports by typical time (measured, share of wall; typical, share):")
    for g in sorted(groups, key=lambda g: -g["typical_ns"])[: args.top]:
        print(f"  {g['total_ns'] / args.steps / 1e3:8.1f} us/step {100 * g['total_ns'] / wall:5.1f}%   "
              f"{g['typical_ns'] / args.steps / 1e3:8.1f} us/step {100 * g['typical_ns'] / typical:5.1f}%   "
              f"x{g['count'] // args.steps:<3d} {kind_of(g['key']):<12} {g['key']}")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "device": args.device, "wall_ns_per_step": wall / args.steps,
            "dispatch_ns_per_step": total / args.steps, "execute_ns_per_step": execute / args.steps,
            "typical_ns_per_step": typical / args.steps,
            "by_kind": {k: {"measured_ns": v[0] / args.steps, "typical_ns": v[1] / args.steps}
                        for k, v in by_kind.items()},
            "groups": [dict(g, kind=kind_of(g["key"])) for g in groups],
        }, indent=1))


if __name__ == "__main__":
    main()
