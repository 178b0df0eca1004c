"""``python -m slurm_ddp`` is ``slurm-ddp``."""

import sys

from .cli import main

sys.exit(main())
