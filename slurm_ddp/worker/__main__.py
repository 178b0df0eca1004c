"""``python -m slurm_ddp.worker --run-dir DIR``: run one rank of the job in DIR.

Exit statuses: 0 finished; 75 stopped for preemption (checkpoint committed); 2 bad input;
1 a failure (the last line of the rank's log names the rank, host and cause).
"""

import argparse
import gc
import os
import socket
import sys

from ..entrypoint import run_main


def _where() -> str:
    return f"rank {os.environ.get('SLURM_PROCID', '?')} on {os.environ.get('SLURMD_NODENAME') or socket.gethostname()}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m slurm_ddp.worker", description=__doc__)
    parser.add_argument("--run-dir", required=True, help="run directory holding config.yaml")
    args = parser.parse_args(argv)

    def train() -> int:
        # No cyclic garbage collection while the rank starts up (torch, DDP, the task's model and data):
        # slurm_ddp.worker.runtime.end_startup_gc turns it back on (Trainer.run), and says why.
        gc.disable()
        from .train import main as train_main

        return train_main(args.run_dir)

    # the task's code failing keeps its traceback and ends with one line (report_crash)
    return run_main("slurm_ddp worker", train, where=_where, report_crash=True)


if __name__ == "__main__":
    sys.exit(main())
