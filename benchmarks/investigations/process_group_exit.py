"""How often a finished gloo worker aborts at exit (SIGABRT, "terminate called without an active exception",
pytorch/pytorch#190489) with and without `modeling.callbacks.leave_process_group` before it returns.

    python benchmarks/investigations/process_group_exit.py --runs 40 --processes 4

Each run is one `torchrun --standalone` launch of this file as a worker: 20 all_reduces, a barrier, then exit,
with or without leaving the process group first. A launch fails when any worker aborts.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

LEAVE_ENV = "PROCESS_GROUP_EXIT_LEAVE"


def worker() -> None:
    import torch
    import torch.distributed as dist

    from modeling.callbacks import leave_process_group

    dist.init_process_group("gloo")
    values = torch.ones(1000)
    for _ in range(20):
        dist.all_reduce(values)
    dist.barrier()
    if os.environ[LEAVE_ENV] == "1":
        leave_process_group()


def failed_launches(runs: int, processes: int, leave: bool) -> int:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes)]
    env = {**os.environ, LEAVE_ENV: "1" if leave else "0"}
    failed = 0
    for _ in range(runs):
        result = subprocess.run([*command, __file__, "--worker"], env=env, capture_output=True, text=True)
        failed += result.returncode != 0
    return failed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker()
    for leave in (True, False):
        failed = failed_launches(args.runs, args.processes, leave)
        print(f"leave_process_group={leave}: {failed} of {args.runs} launches of {args.processes} workers aborted")


if __name__ == "__main__":
    main()
