"""Run by tests/dist/test_relaunch.py under ``torchrun --max-restarts 1``: on the first
start rank 1 kills itself after an all-reduce and rank 0 fails in the next one (publishing
its failure); on the restart rank 0 comes late, so rank 1 would read the first start's
keys first if the starts shared a namespace. Prints each start's generation and sum."""

import os
import signal
import time

import torch
import torch.distributed as dist

import sarcompile as sc

restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
if restart == 1 and os.environ["RANK"] == "0":
    time.sleep(2)
rank, world_size = sc.init()
x = torch.ones(1)
dist.all_reduce(x)
if restart == 0:
    if rank == 1:
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGKILL)
    dist.all_reduce(x)  # rank 0: its peer is gone
print(f"start {restart} rank {rank}: sum {x.item():.0f}", flush=True)
sc.shutdown()
