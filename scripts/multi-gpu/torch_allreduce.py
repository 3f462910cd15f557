"""NCCL's own all-reduce bus bandwidth through PyTorch, for comparison with
Ferrite's (scripts/test-multi-gpu.sh): 1 GiB of f32 over every visible GPU,
one process per GPU, 5 warm-up and 20 timed all-reduces.

busbw = 2 (n-1)/n * bytes / time (NCCL's definition). Prints
`torch all_reduce 1GiB f32 N GPUs: time_ms=.. algbw_GBps=.. busbw_GBps=..`.
"""

import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

BYTES = 1 << 30
ITERS = 20


def rank_main(rank: int, world: int, port: int) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    x = torch.ones(BYTES // 4, dtype=torch.float32, device="cuda")
    for _ in range(5):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    dist.barrier()
    t = time.perf_counter()
    for _ in range(ITERS):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t) / ITERS
    worst = torch.tensor([dt], device="cuda")
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    if rank == 0:
        dt = worst.item()
        algbw = BYTES / dt / 1e9
        busbw = algbw * 2 * (world - 1) / world
        print(
            f"torch all_reduce 1GiB f32 {world} GPUs: time_ms={dt * 1e3:.3f} "
            f"algbw_GBps={algbw:.1f} busbw_GBps={busbw:.1f}",
            flush=True,
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    world = torch.cuda.device_count()
    mp.spawn(rank_main, args=(world, 29611), nprocs=world)
