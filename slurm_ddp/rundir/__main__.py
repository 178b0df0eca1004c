"""``python -m slurm_ddp.rundir requeue-decision ...``: the batch shell's requeue decision
(:func:`slurm_ddp.rundir.requeue.main`)."""

import sys

from .requeue import main

sys.exit(main())
