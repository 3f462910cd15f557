"""The generate loop on upstream IREE's Python runtime (`iree.runtime`,
iree-base-runtime 3.13) over the same program and `.gguf` as Ferrite's, so
both runtimes are compared on identical programs: greedy ids, logits and
timings.

    .venv/bin/python examples/llm/upstream_loop.py --prompt_ids=1,2,3 [--max_tokens=16] [--device=local-task] [--context=2048]
        [--vmfb=PATH] [--runtime=iree|ferrite]

The KV cache is allocated for `context` positions by the program's
`init_cache` entry point, as Ferrite's loop does.
"""

import argparse
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
VMFB = HERE / "smollm2.vmfb"
DEFAULT_CONTEXT = 2048


class UpstreamModel:
    def __init__(self, gguf_path, device="local-sync", vmfb=VMFB, context=DEFAULT_CONTEXT, runtime=None):
        """`context`: KV cache positions (None: leave the program's initial
        one-position cache, as a host that forgets init_cache would);
        `runtime`: a module with iree.runtime's API (default iree.runtime;
        ferrite.runtime runs the same loop on Ferrite)."""
        if runtime is None:
            import iree.runtime as runtime
        rt = runtime

        config = rt.Config(device)
        index = rt.ParameterIndex()
        index.load(str(gguf_path))
        params = rt.create_io_parameters_module(config.vm_instance, index.create_provider(scope="model"))
        hal = rt.create_hal_module(config.vm_instance, config.device)
        module = rt.VmModule.mmap(config.vm_instance, str(vmfb))
        self.ctx = rt.SystemContext(vm_modules=[params, hal, module], config=config)
        self.rt = rt
        self.config = config
        self.module = module
        self.m = self.ctx.modules.smollm2
        if context is not None:
            self.m.init_cache(int(context))
        self.context = int(self.m.context_length())

    def prefill(self, ids):
        return self.m.prefill(np.asarray(ids, dtype=np.int32), 0).to_host()

    def decode(self, token, pos):
        return self.m.decode(int(token), int(pos)).to_host()

    def has_device_greedy(self):
        """Whether the program has `decode_greedy` (the cuda program)."""
        return self.module.lookup_function("decode_greedy") is not None

    def greedy_device(self, prompt_ids, n, ahead=1):
        """`greedy` through the program's `decode_greedy` (async-external:
        the step's state [token, position] stays on the device, the token
        is the device's argmax): the loop of ferrite_llm::pipeline, written
        against iree.runtime's API. Step k + 1 is invoked on step k's state
        and signal fence, `ahead` steps before step k's token is read.
        Returns (ids, time to first token, decode seconds)."""
        rt = self.rt
        dev = self.config.device
        fn = self.module.lookup_function("decode_greedy")
        t0 = time.perf_counter()
        logits = self.prefill(prompt_ids)
        ids = [int(np.argmax(logits))]
        ttft = time.perf_counter() - t0
        t1 = time.perf_counter()
        state = dev.allocator.allocate_buffer_copy(
            memory_type=rt.MemoryType.DEVICE_LOCAL, allowed_usage=rt.BufferUsage.DEFAULT, device=dev,
            buffer=np.array([ids[0], len(prompt_ids)], dtype=np.int32), element_type=rt.HalElementType.SINT_32)
        sem = dev.create_semaphore(0)
        after = rt.HalFence.create_at(sem, 0)
        queued = []
        nxt = 1
        while len(ids) < n:
            while len(queued) <= ahead and nxt < n:
                done = rt.HalFence.create_at(sem, nxt)
                args = rt.VmVariantList(4)
                args.push_ref(state)
                args.push_int(len(prompt_ids) + nxt - 1)
                args.push_ref(after)
                args.push_ref(done)
                res = rt.VmVariantList(1)
                self.ctx.vm_context.invoke(fn, args, res)
                state = res.get_as_object(0, rt.HalBufferView)
                queued.append((state, done))
                after = done
                nxt += 1
            view, done = queued.pop(0)
            done.wait()
            got = rt.DeviceArray(dev, view).to_host()
            ids.append(int(got[0]))
        return ids, ttft, time.perf_counter() - t1

    def greedy(self, prompt_ids, n, keep_logits=False):
        """Greedy ids after the prompt (no EOS stop), the logits each was
        picked from (when asked), time to first token and decode seconds."""
        t0 = time.perf_counter()
        logits = self.prefill(prompt_ids)
        ids, all_logits = [], []
        pos = len(prompt_ids)
        ttft = None
        t1 = None
        for i in range(n):
            if i > 0:
                if t1 is None:
                    t1 = time.perf_counter()
                logits = self.decode(ids[-1], pos)
                pos += 1
            nxt = int(np.argmax(logits))
            if i == 0:
                ttft = time.perf_counter() - t0
            ids.append(nxt)
            if keep_logits:
                all_logits.append(logits)
        decode_s = time.perf_counter() - t1 if t1 is not None else 0.0
        return ids, (np.array(all_logits) if keep_logits else None), ttft, decode_s


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompt_ids", required=True)
    ap.add_argument("--max_tokens", type=int, default=16)
    ap.add_argument("--device", default="local-sync")
    ap.add_argument("--gguf")
    ap.add_argument("--context", type=int, default=DEFAULT_CONTEXT,
                    help="KV cache positions (0: skip init_cache, for programs built before it existed)")
    ap.add_argument("--vmfb", default=str(VMFB), help="the program (default: the committed one)")
    ap.add_argument("--runtime", choices=["iree", "ferrite"], default="iree",
                    help="iree.runtime (default) or ferrite.runtime running this same loop")
    ap.add_argument("--loop", choices=["host", "device"], default="host",
                    help="host: decode + argmax on the host (default); device: the program's decode_greedy")
    args = ap.parse_args()
    sys.path.insert(0, str(HERE))
    import assets
    import importlib

    rt = importlib.import_module(f"{args.runtime}.runtime")
    m = UpstreamModel(args.gguf or assets.ensure(), args.device, vmfb=args.vmfb,
                      context=args.context or None, runtime=rt)
    prompt = [int(s) for s in args.prompt_ids.split(",")]
    if args.loop == "device":
        ids, ttft, dec = m.greedy_device(prompt, args.max_tokens)
    else:
        ids, _, ttft, dec = m.greedy(prompt, args.max_tokens)
    print(" ".join(map(str, ids)))
    print(f"ttft {ttft * 1e3:.1f} ms, decode {(args.max_tokens - 1) / dec if dec else 0:.2f} tok/s", file=sys.stderr)


if __name__ == "__main__":
    main()
