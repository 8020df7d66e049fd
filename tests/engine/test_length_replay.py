"""``--seq-lens`` on every budget between two consecutive footprints of real workloads
(a GPT of the examples, and a GPT-2 and a Llama from transformers configs):
the searches of ``tuner profile --seq-lens`` replayed on curves measured once
(``tests/length_curves.py``, which ``bench/seqlen.py`` reports from too). Whatever the
budget, every length keeps its exact ``M*``, the fit across lengths is made (one more
probe where a right guess left a single peak), and the service's estimate
(:func:`tuner.core.lengths.estimate_length`) answers every length the CLI says it answers
(unless the fit cannot know its error), never above the true ``M*`` of a length left out."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.api.documents import sample_profile
from tests.length_curves import Curves, replay_budgets, replay_family, scan_lengths, true_max
from tuner.core.errors import BadInputError
from tuner.core.lengths import (
    EXTRAPOLATION,
    SHORTEST_FRACTION,
    estimate_length,
    fit_length_profiles,
)

DATA = Path(__file__).resolve().parent.parent / "data"
MODELS = {
    "gpt": ("examples.gpt:workload", {"vocab": 64, "dim": 16, "layers": 1, "heads": 2}),
    # Two transformers architectures, built from their configs (no download).
    "gpt2": ("tuner.hf:causal_lm", {"config": str(DATA / "tiny_gpt2.json")}),
    "llama": ("tuner.hf:causal_lm", {"config": str(DATA / "tiny_llama.json")}),
}


# Where the guess at the second length is right at some budget (so the search there
# measures M* alone and the fit needs a probe more). GPT-2's eager attention holds s²
# scores that the one-length guess does not scale for: it aims too high, and the search
# measures two sizes on its own.
RIGHT_GUESSES = {"gpt", "llama"}


@pytest.fixture(scope="module", params=list(MODELS))
def scanned(request: pytest.FixtureRequest) -> tuple[str, Curves]:
    target, options = MODELS[request.param]
    return request.param, scan_lengths(target, options, {16: 24, 32: 12, 64: 6})


@pytest.mark.slow
@pytest.mark.parametrize("headroom", [0.0, 0.05])
def test_every_budget_keeps_every_length_and_the_estimates_it_prints(
    scanned: tuple[str, Curves], headroom: float
) -> None:
    model, curves = scanned
    budgets = replay_budgets(curves)
    assert len(budgets) > 20
    template = sample_profile()
    extra_probes = 0
    for budget in budgets:
        profiles, notes = replay_family(curves, budget, template, headroom=headroom)
        found = [p.max_micro_batch_size for p in profiles]
        assert found == [true_max(curves[s], budget) for s in sorted(curves)], budget
        extra_probes += sum("one more probe" in note for note in notes)
        fitted = [p for p in profiles if p.max_micro_batch_size >= 1]
        if len(fitted) < 2:
            continue
        lengths = [p.workload.seq_len or 0 for p in fitted]
        try:
            fit = fit_length_profiles(fitted, lengths)
        except BadInputError:
            # Only where no length after the first fitted one had a size to spare.
            assert all(p.max_micro_batch_size == 1 for p in fitted[1:]), (budget, found)
            assert any("no fit across lengths" in note for note in notes), notes
            continue
        # The lengths the CLI prints as estimated (and a few between) are answered...
        lowest, highest = fit.seq_lens[0], fit.seq_lens[-1]
        every = [p.workload.seq_len or 0 for p in profiles]
        reach = (int(lowest * SHORTEST_FRACTION), int(highest * EXTRAPOLATION))
        for seq_len in (*reach, *(s for s in (24, 48) if reach[0] <= s <= reach[1])):
            if fit.held_out_error is None and seq_len not in every:
                # The fit passes through every point: it cannot know its error.
                with pytest.raises(BadInputError, match="cannot know its error"):
                    estimate_length(profiles, every, seq_len)
                continue
            answer = estimate_length(profiles, every, seq_len)
            shorter = [m for s, m in zip(every, found, strict=True) if s <= seq_len]
            assert answer.max_micro_batch_size <= min(shorter, default=answer.max_micro_batch_size)
        # ... and those past them get the range refusal, never a fit that cannot be made.
        with pytest.raises(BadInputError, match="too far from the measured lengths"):
            estimate_length(profiles, every, int(highest * EXTRAPOLATION) + 1)
    if headroom == 0.0 and model in RIGHT_GUESSES:  # no peak above M*: the fit needed probes
        assert extra_probes > 0


def test_a_length_left_out_is_estimated_at_most_its_true_m_star(
    scanned: tuple[str, Curves],
) -> None:
    """Each end length left out of the family in turn (16 from 32 and 64, 32 from 16 and
    64), at every budget: the estimate is never above the length's true ``M*``."""
    model, curves = scanned
    template = sample_profile()
    answered = equal = 0
    for held_out in (16, 32):
        family = {s: curve for s, curve in curves.items() if s != held_out}
        for budget in replay_budgets(curves):
            profiles, _ = replay_family(family, budget, template, headroom=0.0)
            every = [p.workload.seq_len or 0 for p in profiles]
            truth = true_max(curves[held_out], budget)
            try:
                answer = estimate_length(profiles, every, held_out)
            except BadInputError:
                continue  # refused (no fit, or one that cannot know its error)
            answered += 1
            equal += answer.max_micro_batch_size == truth
            assert answer.max_micro_batch_size <= truth, (held_out, budget)
    assert answered > 20
    # Exact wherever the fit's terms are the curve's. GPT-2's eager attention holds s²
    # scores that two lengths cannot tell from s: its error left out (20-25%) is the
    # margin, and the estimate is below the truth (measured: 10 of 48 exact).
    assert equal == answered or model == "gpt2", (equal, answered)
