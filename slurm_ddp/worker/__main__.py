"""``python -m slurm_ddp.worker --run-dir DIR``: run one rank of the job in DIR."""

import argparse
import sys

from ..errors import SlurmDDPError


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m slurm_ddp.worker", description=__doc__)
    parser.add_argument("--run-dir", required=True, help="run directory holding config.yaml")
    args = parser.parse_args(argv)
    try:
        from .train import main as train_main

        return train_main(args.run_dir)
    except SlurmDDPError as e:
        print(f"slurm_ddp worker: error: {e}", file=sys.stderr, flush=True)
        return e.exit_code


if __name__ == "__main__":
    sys.exit(main())
