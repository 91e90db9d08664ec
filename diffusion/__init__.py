"""enginefarm.diffusion: the numpy half of the Stable Diffusion runtime (schedulers and tokenizers).

Import-light on purpose: numpy only. torch is never imported, and the `tokenizers` package (the `diffusion` extra)
only when a tokenizer is loaded.
"""

from __future__ import annotations

from .images import read_png, write_png
from .pipeline import Pipeline
from .schedulers import ALIASES, SCHEDULERS, Scheduler, SchedulerConfig, dynamic_shift_mu, make_scheduler
from .tokenizer import ClipTokenizer, T5Tokenizer

__all__ = [
    "ALIASES",
    "SCHEDULERS",
    "ClipTokenizer",
    "Pipeline",
    "Scheduler",
    "SchedulerConfig",
    "T5Tokenizer",
    "dynamic_shift_mu",
    "make_scheduler",
    "read_png",
    "write_png",
]
