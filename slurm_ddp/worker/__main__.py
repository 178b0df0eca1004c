"""``python -m slurm_ddp.worker --run-dir DIR``: run one rank of the job in DIR.

Exit statuses: 0 finished; 75 stopped for preemption (checkpoint committed); 2 bad input;
1 a failure (the last line of the rank's log names the rank, host and cause).
"""

import argparse
import os
import socket
import sys
import traceback

from ..errors import SlurmDDPError


def _where() -> str:
    return f"rank {os.environ.get('SLURM_PROCID', '?')} on {os.environ.get('SLURMD_NODENAME') or socket.gethostname()}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m slurm_ddp.worker", description=__doc__)
    parser.add_argument("--run-dir", required=True, help="run directory holding config.yaml")
    args = parser.parse_args(argv)
    try:
        from .train import main as train_main

        return train_main(args.run_dir)
    except SlurmDDPError as e:
        print(f"slurm_ddp worker: error: {_where()}: {e}", file=sys.stderr, flush=True)
        return e.exit_code
    except Exception as e:  # the task's code failed: keep the traceback, end with one line
        traceback.print_exc()
        print(f"slurm_ddp worker: error: {_where()} failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
