"""The phases of one optimizer step, in order; a step's peak falls in one of them."""

from __future__ import annotations

from typing import Literal, get_args

PeakPhase = Literal["forward", "backward", "optimizer"]
PEAK_PHASES: tuple[str, ...] = get_args(PeakPhase)
