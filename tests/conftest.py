pytest_plugins = ["slurm_ddp.testing"]
