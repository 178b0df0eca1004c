"""The local supervisor's echo of rank 0: a live bar on a terminal, plain lines elsewhere."""

import io

from lib import require_module

from slurm_ddp.backends.local import _Progress

STEP = "2026-11-22T05:30:39 rank0 INFO step 10/100 loss 1.9355 31.6 steps/s eta 3 s\n"


class _TTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_terminal_gets_a_bar_and_the_other_lines() -> None:
    require_module("tqdm", "the live progress bar")
    out = _TTY()
    p = _Progress(out)
    p.line("rank0 INFO hello\n")
    p.line(STEP)
    p.line(STEP.replace("step 10/100", "step 20/100"))
    p.line("rank0 INFO eval at step 20\n")
    p.close()
    text = out.getvalue()
    assert "rank0 INFO hello\n" in text and "eval at step 20" in text
    assert "step 20/100" in text and "loss 1.9355" in text and "\r" in text
    assert STEP not in text  # the step lines became the bar


def test_log_file_or_pipe_gets_plain_lines_without_carriage_returns() -> None:
    out = io.StringIO()
    p = _Progress(out)
    p.line("rank0 INFO hello\n")
    p.line(STEP)
    p.close()
    assert out.getvalue() == "rank0 INFO hello\n" + STEP
