#!/usr/bin/env python3
"""Issue 27's LLM bench: SmolLM2-135M-Instruct (Q4_1 .gguf), time to first
token for a 128-token prompt and decode tokens/s over 128 greedy tokens, with
each process's peak RSS, for

- Ferrite (`ferrite generate --benchmark`, the release CLI) and upstream
  `iree.runtime` (examples/llm/upstream_loop.py) on the same vmfb, per device;
- llama.cpp (`llama-cpp-python`, built from its sdist: CPU) on the same .gguf;
- PyTorch eager (`transformers` loading the same .gguf with `gguf_file=`, which
  dequantizes it to f32; a plain greedy loop over its KV cache).

Each run is a fresh process doing one generation (no warm-up: what a user
sees), the runtimes interleaved round by round. Every peer's greedy ids are
compared with Ferrite's: the table reports how many leading ids agree.
Writes JSON and a PNG to --out.

    .venv/bin/python scripts/bench-llm.py [--devices local-sync,local-task] [--threads N]
        [--peers ferrite,upstream,llama.cpp,torch] [--rounds 1]
        [--prompt_tokens 128] [--max_tokens 128] [--out build/bench-llm]
        [--ferrite target/release/ferrite]
    .venv/bin/python scripts/bench-llm.py --devices cuda     (GPU machine: Ferrite and
        upstream on build/llm/smollm2-cuda.vmfb, built by examples/llm/build_cuda.py when
        missing; PyTorch on cuda when its build has CUDA)

`--threads N` (default: all cores) is local-task's worker count for both IREE
runtimes (`local-task://?workers=N`, upstream's --task_topology_group_count),
llama.cpp's n_threads and torch.set_num_threads; local-sync is one thread.
Missing peers are installed into this Python environment first, saying so:
llama-cpp-python[server] (about 10 minutes to build on 2 cores), torch and
transformers and accelerate (PyTorch's wheel, with its CUDA libraries on Linux),
matplotlib.
"""

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LLM_DIR = ROOT / "examples" / "llm"
sys.path.insert(0, str(LLM_DIR))

import assets  # noqa: E402

CPU_DEVICES = ("local-sync", "local-task")
ALL_PEERS = ("ferrite", "upstream", "llama.cpp", "torch")
# Leading greedy ids compared with Ferrite's.
AGREE_FIRST = 16


# ------------------------------------------------------------ installs


def _pip_install(what, packages, why):
    print(f"bench-llm: installing {what} into {sys.prefix} ({why})", file=sys.stderr, flush=True)
    env = dict(os.environ)
    env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 2))
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", *packages], env=env)
    if r.returncode != 0:
        sys.exit(f"bench-llm: pip install {' '.join(packages)} failed; install it by hand or leave the peer out"
                 " with --peers")


def ensure_peer_packages(peers, allow_install):
    need = []
    if "llama.cpp" in peers and not _importable("llama_cpp"):
        need.append(("llama-cpp-python", ["llama-cpp-python[server]"],
                     "built from its sdist with the CPU backend: about 10 minutes on 2 cores"))
    if "torch" in peers and not all(map(_importable, ("torch", "transformers", "accelerate"))):
        # transformers loads a .gguf only with accelerate installed.
        need.append(("torch, transformers and accelerate", ["torch", "transformers", "accelerate"],
                     "PyTorch's Linux wheel brings its CUDA libraries: a few GB"))
    if "upstream" in peers and not _importable("iree.runtime"):
        need.append(("iree.runtime", ["iree-base-runtime==3.13.0"], "upstream's runtime, the pinned version"))
    if "torch" in peers and not _importable("gguf"):
        need.append(("gguf", ["gguf"], "transformers reads .gguf files with it"))
    for what, pkgs, why in need:
        if not allow_install:
            sys.exit(f"bench-llm: {what} is missing and --no_install was given")
        _pip_install(what, pkgs, why)


def _importable(module):
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


# ------------------------------------------------------------ peers (each in its own process)


def _peak_rss_mb():
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def worker_upstream(a):
    import iree.runtime as rt

    if a.device == "local-task":
        rt.flags.parse_flags(f"--task_topology_group_count={a.threads}")
    import upstream_loop

    m = upstream_loop.UpstreamModel(a.gguf, a.device, vmfb=a.vmfb)
    if a.loop == "same" and m.has_device_greedy():
        # Ferrite's loop for such a program: the token chosen on the device
        # and each step queued before the last one is read.
        ids, ttft, dec = m.greedy_device(a.prompt, a.max_tokens)
    else:
        ids, _, ttft, dec = m.greedy(a.prompt, a.max_tokens)
    return {"ids": ids, "ttft_ms": ttft * 1e3, "decode_tok_s": (a.max_tokens - 1) / dec}


def worker_llama_cpp(a):
    from llama_cpp import Llama

    llm = Llama(model_path=str(a.gguf), n_ctx=a.prompt_tokens + a.max_tokens + 16, n_batch=512,
                n_threads=a.threads, n_threads_batch=a.threads, n_gpu_layers=0, verbose=False)
    ids = []
    t0 = time.perf_counter()
    t1 = None
    for tok in llm.generate(a.prompt, temp=0.0, top_k=1, repeat_penalty=1.0, reset=True):
        ids.append(int(tok))
        if t1 is None:
            t1 = time.perf_counter()
        if len(ids) == a.max_tokens:
            break
    t2 = time.perf_counter()
    return {"ids": ids, "ttft_ms": (t1 - t0) * 1e3, "decode_tok_s": (a.max_tokens - 1) / (t2 - t1),
            "version": __import__("llama_cpp").__version__}


def worker_torch(a):
    import inspect

    import torch
    import transformers

    torch.set_num_threads(a.threads)
    dev = "cuda" if a.device == "cuda" else "cpu"
    if dev == "cuda" and not torch.cuda.is_available():
        sys.exit(f"this torch ({torch.__version__}) has no usable CUDA device")
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(Path(a.gguf).parent), gguf_file=Path(a.gguf).name, dtype=torch.float32).to(dev).eval()

    def sync():
        if dev == "cuda":
            torch.cuda.synchronize()

    # The KV cache object is updated in place by each call; transformers
    # renamed its argument (past_key_values -> cache), so take what this
    # version has. Prefill computes only the last position's logits, as
    # the IREE program's does.
    params = inspect.signature(model.forward).parameters
    cache = transformers.DynamicCache(config=model.config)
    kw = {"cache" if "cache" in params else "past_key_values": cache, "use_cache": True}
    if "logits_to_keep" in params:
        kw["logits_to_keep"] = 1
    ids = []
    with torch.inference_mode():
        sync()
        t0 = time.perf_counter()
        out = model(torch.tensor([a.prompt], device=dev), **kw)
        nxt = int(out.logits[0, -1].argmax())
        t1 = time.perf_counter()
        ids.append(nxt)
        for _ in range(a.max_tokens - 1):
            out = model(torch.tensor([[nxt]], device=dev), **kw)
            nxt = int(out.logits[0, -1].argmax())  # reads the token back each step
            ids.append(nxt)
        t2 = time.perf_counter()
    return {"ids": ids, "ttft_ms": (t1 - t0) * 1e3, "decode_tok_s": (a.max_tokens - 1) / (t2 - t1),
            "version": f"torch {torch.__version__}, transformers {transformers.__version__}"}


WORKERS = {"upstream": worker_upstream, "llama.cpp": worker_llama_cpp, "torch": worker_torch}


def worker_main(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("peer")
    ap.add_argument("--gguf", type=Path)
    ap.add_argument("--device")
    ap.add_argument("--vmfb", type=Path)
    ap.add_argument("--threads", type=int)
    ap.add_argument("--prompt", type=lambda s: [int(x) for x in s.split(",")])
    ap.add_argument("--max_tokens", type=int)
    ap.add_argument("--loop", choices=["same", "host"], default="same")
    a = ap.parse_args(argv)
    a.prompt_tokens = len(a.prompt)
    r = WORKERS[a.peer](a)
    r["peak_rss_mb"] = _peak_rss_mb()
    print(json.dumps(r))


def run_worker(peer, args, device, vmfb, prompt, loop="same"):
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", peer, f"--gguf={args.gguf}",
           f"--device={device}", f"--vmfb={vmfb}", f"--threads={args.threads}",
           "--prompt=" + ",".join(map(str, prompt)), f"--max_tokens={args.max_tokens}", f"--loop={loop}"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{peer} on {device} failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def run_ferrite(args, device, vmfb, prompt, host_sampling=False):
    """The CLI in its own process; its peak RSS from wait4's usage.
    `host_sampling`: FERRITE_LLM_PIPELINE=0 (tokens chosen on the host even
    when the program has decode_greedy)."""
    dev = f"local-task://?workers={args.threads}" if device == "local-task" else device
    cmd = [str(args.ferrite), "generate", f"--gguf={args.gguf}", "--prompt_ids=" + ",".join(map(str, prompt)),
           f"--max_tokens={args.max_tokens}", "--ignore_eos", "--output_ids", "--benchmark", f"--device={dev}"]
    # The vmfb file upstream loads, not the copy built into the binary: the
    # same program for both whatever the binary was built from.
    cmd.append(f"--module={vmfb}")
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        env = dict(os.environ, FERRITE_LLM_PIPELINE="0") if host_sampling else None
        p = subprocess.Popen(cmd, stdout=out, stderr=err, env=env)
        _, status, usage = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if p.returncode != 0:
        raise RuntimeError(f"ferrite on {device} failed ({p.returncode}):\n{stderr[-3000:]}")
    ttft = float(re.search(r"time to first token: ([\d.]+) ms", stderr).group(1))
    tok_s = float(re.search(r"decode: ([\d.]+) tokens/s", stderr).group(1))
    return {"ids": [int(s) for s in stdout.split()], "ttft_ms": ttft, "decode_tok_s": tok_s,
            "peak_rss_mb": usage.ru_maxrss / 1024}


# ------------------------------------------------------------ main


def leading_agreement(a, b):
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def plot(results, out, prompt_tokens):
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        _pip_install("matplotlib", ["matplotlib"], "for the bench's PNG")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = results["summary"]
    labels = [f"{r['runtime'].replace('upstream ', '')}\n{r['device']}" for r in runs]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for ax, key, title in ((axes[0], "ttft_ms", f"time to first token ({prompt_tokens}-token prompt), ms"),
                           (axes[1], "decode_tok_s", "decode tokens/s (greedy)"),
                           (axes[2], "peak_rss_mb", "peak RSS, MB")):
        ax.bar(range(len(runs)), [r[key] for r in runs],
               color=[{"ferrite": "C0", "upstream iree.runtime": "C1", "llama.cpp": "C2"}.get(r["runtime"].split(",")[0], "C3")
                      for r in runs])
        ax.set_xticks(range(len(runs)), labels, fontsize=7, rotation=30)
        ax.set_title(title, fontsize=9)
    fig.suptitle(f"SmolLM2-135M Q4_1, {results['threads']} threads, {results['cpus']} cores "
                 f"({results['when']})", fontsize=9)
    fig.tight_layout()
    fig.savefig(out / "bench-llm.png", dpi=100)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        return worker_main(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--devices", "--device", default="local-sync,local-task",
                    help="comma-separated: local-sync, local-task, cuda")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--peers", default=",".join(ALL_PEERS))
    ap.add_argument("--rounds", type=int, default=1, help="interleaved rounds; the table shows each run's median")
    ap.add_argument("--prompt_tokens", type=int, default=128)
    ap.add_argument("--max_tokens", type=int, default=128)
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "bench-llm")
    ap.add_argument("--ferrite", type=Path, default=ROOT / "target" / "release" / "ferrite")
    ap.add_argument("--cuda_vmfb", type=Path, default=ROOT / "build" / "llm" / "smollm2-cuda.vmfb")
    ap.add_argument("--no_install", action="store_true", help="fail instead of installing a missing peer")
    args = ap.parse_args()
    devices = [d for d in args.devices.split(",") if d]
    peers = [p for p in args.peers.split(",") if p]
    bad = [p for p in peers if p not in ALL_PEERS] + [d for d in devices if d not in (*CPU_DEVICES, "cuda")]
    if bad:
        sys.exit(f"bench-llm: unknown peer or device {bad}")
    if "ferrite" not in peers:
        sys.exit("bench-llm: ferrite is the reference of the comparison; keep it in --peers")
    if not args.ferrite.exists():
        sys.exit(f"bench-llm: {args.ferrite} is missing: cargo build --release -p ferrite-cli (or --ferrite PATH)")
    ensure_peer_packages(peers, not args.no_install)
    # Run a private copy: a rebuild of target/release during the bench (a
    # shared checkout) must not change the binary between rounds.
    tmp = Path(tempfile.mkdtemp(prefix="bench-llm-"))
    binary = tmp / "ferrite"
    shutil.copy2(args.ferrite, binary)
    binary_info = {"path": str(args.ferrite), "mtime": time.strftime("%Y-%m-%d %H:%M:%S",
                   time.gmtime(args.ferrite.stat().st_mtime)) + " UTC",
                   "sha256": hashlib.sha256(binary.read_bytes()).hexdigest()[:16]}
    args.ferrite = binary
    args.gguf = assets.ensure()
    if "cuda" in devices and not args.cuda_vmfb.exists():
        import build_cuda

        build_cuda.build(args.cuda_vmfb)
    # A fixed prompt: ordinary vocabulary ids cycled.
    base = [504, 3575, 282, 4649, 314, 7042, 30, 378, 3575, 282, 8590, 314]
    prompt = [base[i % len(base)] for i in range(args.prompt_tokens)]
    results = {"model": args.gguf.name, "gguf_mb": args.gguf.stat().st_size / 2**20,
               "prompt_tokens": args.prompt_tokens, "max_tokens": args.max_tokens, "threads": args.threads,
               "ferrite_binary": binary_info, "cpus": os.cpu_count(), "rounds": args.rounds,
               "kv_cache_mb": 30 * 2 * 2048 * 3 * 64 * 4 / 2**20, "agree_first": AGREE_FIRST, "runs": []}

    # (runtime, device) in the order each round runs them: per device Ferrite
    # then upstream, the device-independent CPU peers once after the CPU devices.
    # On cuda the program has decode_greedy: both runtimes choose tokens on
    # the device with steps queued ahead (the default, "ferrite" and
    # "upstream iree.runtime"), and each is also run choosing them on the
    # host ("..., host sampling"): the loop the CPU programs run.
    plan = []
    for d in devices:
        plan.append(("ferrite", d))
        if d == "cuda":
            plan.append(("ferrite, host sampling", d))
        if "upstream" in peers:
            plan.append(("upstream iree.runtime", d))
            if d == "cuda":
                plan.append(("upstream iree.runtime, host sampling", d))
        if "torch" in peers and d == "cuda":
            plan.append(("torch", "cuda"))
    if any(d in CPU_DEVICES for d in devices):
        plan += [(p, "cpu") for p in ("llama.cpp", "torch") if p in peers]
    reference = {}  # Ferrite's greedy ids per device (cpu peers: any CPU device's)
    for rnd in range(args.rounds):
        for runtime, device in plan:
            vmfb = args.cuda_vmfb if device == "cuda" else LLM_DIR / "smollm2.vmfb"
            if runtime.startswith("ferrite"):
                r = run_ferrite(args, device, vmfb, prompt, host_sampling="host sampling" in runtime)
                reference.setdefault(device, r["ids"])
                if device in CPU_DEVICES:
                    reference.setdefault("cpu", r["ids"])
            else:
                worker = "upstream" if runtime.startswith("upstream") else runtime
                try:
                    r = run_worker(worker, args, device, vmfb, prompt,
                                   loop="host" if "host sampling" in runtime else "same")
                except RuntimeError as e:
                    # A peer that cannot run here (PyTorch without CUDA on
                    # the GPU machine, ...) is reported, not fatal.
                    print(f"round {rnd} {device:10s} {runtime:22s} FAILED: {e}", flush=True)
                    results["runs"].append({"runtime": runtime, "device": device, "round": rnd, "error": str(e)})
                    continue
            ids = r.pop("ids")
            ref = reference.get(device)
            r.update(runtime=runtime, device=device, round=rnd,
                     threads=1 if device == "local-sync" else args.threads,
                     agree=leading_agreement(ids, ref) if ref else None, identical_ids=ids == ref,
                     first_ids=ids[:AGREE_FIRST])
            results["runs"].append(r)
            print(f"round {rnd} {device:10s} {runtime:22s} ttft {r['ttft_ms']:8.1f} ms  decode "
                  f"{r['decode_tok_s']:7.2f} tok/s  peak RSS {r['peak_rss_mb']:7.1f} MB  "
                  f"leading ids equal to ferrite's: {r['agree']}/{len(ids)}", flush=True)

    # Medians over rounds, and Ferrite's ratio to each peer on its device
    # (CPU peers: against Ferrite on local-task, the multi-threaded device).
    import statistics

    summary = []
    for runtime, device in plan:
        rs = [r for r in results["runs"] if (r["runtime"], r["device"]) == (runtime, device) and "error" not in r]
        if not rs:
            continue
        s = {k: statistics.median(r[k] for r in rs) for k in ("ttft_ms", "decode_tok_s", "peak_rss_mb")}
        s.update(runtime=runtime, device=device, threads=rs[0]["threads"], agree=min(r["agree"] for r in rs),
                 identical_ids=all(r["identical_ids"] for r in rs), version=rs[0].get("version"))
        summary.append(s)
    for s in summary:
        fdev = s["device"] if s["device"] != "cpu" else ("local-task" if "local-task" in devices else "local-sync")
        f = next(x for x in summary if x["runtime"] == "ferrite" and x["device"] == fdev)
        s["ferrite_decode_speedup"] = f["decode_tok_s"] / s["decode_tok_s"]
        s["ferrite_ttft_ratio"] = f["ttft_ms"] / s["ttft_ms"]
        s["compared_with_ferrite_on"] = fdev
    results["summary"] = summary
    results["when"] = time.strftime("%Y-%m-%d %H:%M:%S")
    git = subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"], capture_output=True, text=True)
    results["commit"] = git.stdout.strip() or "unknown"

    print(f"\nSmolLM2-135M Q4_1, prompt {args.prompt_tokens} tokens, {args.max_tokens} greedy tokens, "
          f"--threads {args.threads}, {os.cpu_count()} cores, median of {args.rounds} round(s); ferrite "
          f"binary of {binary_info['mtime']} (sha256 {binary_info['sha256']}), checkout {results['commit']}")
    print("| runtime | device | threads | TTFT ms | decode tok/s | peak RSS MB | ferrite decode x | "
          f"leading ids = ferrite's (of {args.max_tokens}) |")
    print("|---|---|---|---|---|---|---|---|")
    for s in summary:
        speed = "—" if s["runtime"] == "ferrite" else f"{s['ferrite_decode_speedup']:.2f}x ({s['compared_with_ferrite_on']})"
        print(f"| {s['runtime']} | {s['device']} | {s['threads']} | {s['ttft_ms']:.1f} | {s['decode_tok_s']:.2f} | "
              f"{s['peak_rss_mb']:.0f} | {speed} | {'all' if s['identical_ids'] else s['agree']} |")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench-llm.json").write_text(json.dumps(results, indent=2))
    plot(results, args.out, args.prompt_tokens)
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"bench-llm: wrote {args.out}/bench-llm.json and bench-llm.png", file=sys.stderr)


if __name__ == "__main__":
    main()
