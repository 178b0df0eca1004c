"""``python -m slurm_ddp.transformers SCRIPT [ARG...]``: run an unchanged Hugging Face ``Trainer`` script
with :class:`slurm_ddp.transformers.SlurmDDPCallback` in every ``transformers.Trainer`` it builds.

The runner behind ``python -m slurm_ddp.transformers`` (that module's ``__main__`` guard calls :func:`main`;
this module holds it so that the callback class is the one of the imported ``slurm_ddp.transformers``,
never a second copy in ``__main__``). As ``train.command``::

    train:
      command: python -m slurm_ddp.transformers run_clm.py --output_dir $SLURM_DDP_RUN_DIR/hf --save_steps 50

SCRIPT runs as ``python SCRIPT ARG...`` would run it (python(1)): as ``__main__``
(``runpy.run_path``), ``sys.argv`` = ``[SCRIPT, ARG...]``, the script's directory first on ``sys.path``
instead of the working directory that ``-m`` put there. ``-m MODULE [ARG...]`` instead of SCRIPT runs
a module as ``python -m MODULE`` would. The script's own code is untouched: after every
``Trainer.__init__`` (its subclasses' too: ``Seq2SeqTrainer``, TRL's trainers) the callback is added with
``Trainer.add_callback``, unless the script already passed one (no callback is added twice). For
slurm_ddp SCRIPT is the command's script (``config.SCRIPT_RUNNERS``): resolved against the job file's
directory, checked at submit and taken into the code snapshot like ``python SCRIPT``.

Exit status: the script's (an exception: a traceback and 1, as python's); 2 for a wrong call, with one
line saying how to call it. Imports Transformers (and so torch).
"""

from __future__ import annotations

import functools
import os
import runpy
import sys
from typing import Any, Callable, List, Optional

USAGE = "usage: python -m slurm_ddp.transformers SCRIPT [ARG...]  (or -m MODULE [ARG...])"

#: Set on the patched ``Trainer.__init__``: the patch is in place (``add_callback_to_every_trainer``).
_PATCHED = "_slurm_ddp_adds_callback"


def add_callback_to_every_trainer() -> Callable[[], None]:
    """Make every ``transformers.Trainer`` built from now on hold one ``SlurmDDPCallback``: after
    ``Trainer.__init__`` (subclasses call it too) one is added unless the trainer's callbacks already
    hold one (an instance the script passed, or the class: ``Trainer`` instantiates it). Returns a
    function that restores the original ``__init__``; calling this twice patches once."""
    import transformers

    from .transformers import SlurmDDPCallback

    trainer_cls: Any = transformers.Trainer
    original = trainer_cls.__init__
    if getattr(original, _PATCHED, False):
        return lambda: None

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        if not any(isinstance(cb, SlurmDDPCallback) for cb in self.callback_handler.callbacks):
            self.add_callback(SlurmDDPCallback())

    setattr(__init__, _PATCHED, True)
    trainer_cls.__init__ = __init__

    def restore() -> None:
        trainer_cls.__init__ = original

    return restore


def _usage_error(problem: str) -> None:
    print(f"python -m slurm_ddp.transformers: error: {problem}; {USAGE}", file=sys.stderr)
    raise SystemExit(2)


def main(argv: Optional[List[str]] = None) -> None:
    """Run ``argv`` (default ``sys.argv[1:]``: ``SCRIPT [ARG...]`` or ``-m MODULE [ARG...]``) as python
    would, with the callback in every ``Trainer``; returns when the script returns, raises its
    ``SystemExit``/exception. ``SystemExit(2)`` for a wrong call (no script, a script that is not a file)."""
    args = sys.argv[1:] if argv is None else list(argv)
    if not args or args[0] in ("-h", "--help"):
        if args:
            print(__doc__.split("\n\n")[0].replace("``", "") + "\n" + USAGE)
            raise SystemExit(0)
        _usage_error("no script given")
    if args[0] == "-m":
        if len(args) < 2 or not args[1] or args[1].startswith("-"):
            _usage_error("-m needs a module name")
        add_callback_to_every_trainer()
        sys.argv = [args[1], *args[2:]]  # run_module sets sys.argv[0] to the module's file, as -m does
        # sys.path[0] stays what python -m (the working directory) or slurm_ddp.runmodule (its snapshot) put there
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        return
    if args[0].startswith("-"):
        _usage_error(f"unknown option {args[0]!r} (python's options go before -m slurm_ddp.transformers)")
    script = args[0]
    if not os.path.exists(script):
        _usage_error(f"can't open file {script!r}: no such file")
    add_callback_to_every_trainer()
    # python SCRIPT puts the script's directory (symlinks resolved) first on sys.path; python -m put the
    # working directory there (its absolute path; '' in older versions), unless -P
    first = os.path.dirname(os.path.realpath(script))
    if sys.path and sys.path[0] in ("", os.getcwd()):
        sys.path[0] = first
    else:
        sys.path.insert(0, first)
    sys.argv = [script, *args[1:]]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":  # python -m slurm_ddp.transformers (its __main__ guard runs this module)
    main()
