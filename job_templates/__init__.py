"""Jinja2 templates of the job scripts slurm_ddp renders (package data; see slurm_ddp.render)."""
