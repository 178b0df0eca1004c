"""The shared DDP worker (``python -m slurm_ddp.worker --run-dir DIR``), one process per task.

Imports torch. ``slurm_ddp.worker.runtime`` holds the public pieces a user's own training
script can reuse; ``slurm_ddp.worker.train`` composes them into the worker.
"""
