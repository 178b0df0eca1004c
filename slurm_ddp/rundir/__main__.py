"""``python -m slurm_ddp.rundir requeue-decision ...``: the batch shell's requeue decision
(:func:`slurm_ddp.rundir.requeue.main`); ``recovery-start`` / ``recovery-nodes`` / ``recovery-release`` / ``recovery-decision``: its in-job recovery
from a lost or hung node (:func:`slurm_ddp.rundir.recovery.main`)."""

import sys

if sys.argv[1:2] in (["recovery-start"], ["recovery-nodes"], ["recovery-release"], ["recovery-decision"]):
    from .recovery import main
else:
    from .requeue import main

sys.exit(main())
