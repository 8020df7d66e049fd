"""Profile one workload at several sequence lengths in one search, each length aimed by
the lengths before it.

Lengths are profiled shortest first. The first is a plain search. Each later one starts
from a predicted ``M*`` (:func:`tuner.engine.search.hinted_search`), so a good guess costs
two probes:

- after one length ``s₀`` with answer ``M₀``: the bytes per sample above the resident
  weights, gradients and optimizer state and the memory outside torch ``R`` grow with
  the length,
  ``per_sample(s) = (peak(M₀) − R) / M₀ · s / s₀``, and ``M* ≈ ⌊(budget − R) / per_sample(s)⌋``;
- after two or more: the fit ``peak(m, s) ≈ a₀ + a₁·s + b·m·s + c·m·s²`` through their
  probes near the boundary (:mod:`tuner.core.lengths`),
  ``M* ≈ ⌊(budget − peak(0, s)) / (b·s + c·s²)⌋``.

The guess aims at the prediction itself, without the margin an estimate keeps: a guess one
too high costs nothing (it fails, ``M* = guess − 1`` fits: two probes) while one too low
costs more (``guess + 1`` fits too, and the search goes on). It never exceeds a shorter
length's ``M*``: a longer sequence never fits more.

The fit needs three peaks near the boundary that separate its terms, and a right guess
measures only one at its length (``guess`` fits, ``guess + 1`` runs out of memory and
leaves no peak). An estimate also needs the fit's error, learned by leaving each point out
of it in turn (:func:`tuner.core.lengths.held_out_error`), which a length with one peak
does not allow unless three lengths or more have been measured around it. So the first
length, where its search left a single peak near its boundary, and any later length,
whenever the lengths measured so far cannot be fitted or the fit cannot know its error
and that length has a single peak, takes one more probe, the smallest size within a
factor of two below its ``M*`` (it fits: the cheapest probe that helps), which always
separates them. When no such size exists (``M* = 1``), later lengths are
aimed from one length, as the first is. Each of these is said through ``report``.

Every profile is the workload's own at its length (its own workload key), with
``workload.seq_len`` and the ``workload.length_family`` they share
(:func:`tuner.engine.fingerprint.length_family_key`).
"""

from __future__ import annotations

import importlib
import inspect
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from functools import partial
from typing import Any

from tuner.core.errors import BadInputError, WorkloadError
from tuner.core.lengths import boundary_points, fit_length_profiles, fit_lengths
from tuner.core.results import ProbeSettings, Profile
from tuner.engine.backends import Backend
from tuner.engine.fingerprint import length_family_key, workload_document
from tuner.engine.outcome import DEFAULT_HEADROOM, DEFAULT_SIZE_CAP, ProbeObserver
from tuner.engine.profiler import profile_workload
from tuner.engine.search import PredictFn, ProbeFn, SearchOutcome, hinted_search, run_search
from tuner.engine.workload import Workload, load_workload

LengthObserver = Callable[[int], AbstractContextManager[ProbeObserver | None]]


def check_seq_lens(seq_lens: Iterable[Any]) -> list[int]:
    """The distinct lengths, shortest first; refused unless two or more positive ints."""
    lengths: set[int] = set()
    for seq_len in seq_lens:
        if type(seq_len) is not int or seq_len < 1:
            raise BadInputError(
                f"sequence length {seq_len!r} is not a positive whole number: give lengths "
                "like 256,512,1024"
            )
        lengths.add(seq_len)
    if len(lengths) < 2:
        raise BadInputError(
            "give two or more different sequence lengths (e.g. 256,512,1024); for one "
            "length profile it alone with -o seq_len=N"
        )
    return sorted(lengths)


def target_builder(target: str, options: Mapping[str, object]) -> Callable[[int], Workload]:
    """Loads ``target`` with ``seq_len=s`` added to ``options``."""
    if "seq_len" in options:
        raise BadInputError(
            "give the lengths once: --seq-lens profiles each of them, so leave out -o seq_len="
        )

    def build(seq_len: int) -> Workload:
        try:
            return load_workload(target, {**options, "seq_len": seq_len})
        except WorkloadError:
            # Asked once load_workload has imported the target (from the current folder).
            if not _takes_seq_len(target):
                raise WorkloadError(
                    f"{target} takes no seq_len option: give its factory a seq_len keyword "
                    "that sets the length of every sample, or profile without --seq-lens"
                ) from None
            raise

    return build


def _takes_seq_len(target: str) -> bool:
    module_name, _, attr = target.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
        parameters = inspect.signature(factory).parameters.values()
    except (ImportError, AttributeError, TypeError, ValueError):
        return True  # not loadable: load_workload's own message says what is wrong
    return any(p.name == "seq_len" or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


def profile_lengths(
    build: Callable[[int], Workload],
    seq_lens: Iterable[int],
    backend: Backend,
    *,
    headroom: float = DEFAULT_HEADROOM,
    strategy: str = "model",
    size_cap: int = DEFAULT_SIZE_CAP,
    settings: ProbeSettings | None = None,
    observe: LengthObserver | None = None,
    world_size: int = 1,
    report: Callable[[str], None] | None = None,
) -> list[Profile]:
    """One profile per length of ``build(seq_len)``, shortest first, linked as a family.

    ``observe(seq_len)`` (optional) gives the observer of that length's probes, as a
    context entered around its search (the CLI's live display); ``report`` (optional)
    hears, in one line each, when a length took a probe for the fit or the fit fell back.
    With ``strategy="bisect"`` every length bisects from 1 and no guess is used.
    """
    lengths = check_seq_lens(seq_lens)
    documents: list[dict[str, Any]] = []
    profiles: list[Profile] = []
    for seq_len in lengths:
        workload = build(seq_len)
        if workload.parallel.distributed:
            raise BadInputError(
                f"{workload.name} is declared {workload.parallel.mode}: profile each length "
                "on its own (-o seq_len=N) with --world-size"
            )
        documents.append(workload_document(workload, workload.build_optimizer()))
        if len(documents) > 1:  # before probing: a length that cannot join costs nothing
            length_family_key(documents)
        search = partial(
            search_length,
            earlier=list(profiles),
            seq_len=seq_len,
            strategy=strategy,
            report=report,
        )
        with observe(seq_len) if observe is not None else nullcontext() as observer:
            profile = profile_workload(
                workload,
                backend,
                headroom=headroom,
                strategy=strategy,
                size_cap=size_cap,
                settings=settings,
                observer=observer,
                world_size=world_size,
                search=search,
            )
        profiles.append(_at_length(profile, seq_len, None))
    family = length_family_key(documents)
    return [_at_length(p, length, family) for p, length in zip(profiles, lengths, strict=True)]


def search_length(
    probe: ProbeFn,
    *,
    cap: int,
    budget_bytes: int,
    earlier: Sequence[Profile],
    seq_len: int,
    strategy: str = "model",
    report: Callable[[str], None] | None = None,
    predict: PredictFn | None = None,
) -> SearchOutcome:
    """The search of one length after ``earlier`` ones (profiles carrying their seq_len):
    aimed by them (model strategy), then one more probe when the fit across the lengths
    needs it (the module's docstring says when and which). ``predict`` (a dry run of this
    length) aims the first length and every aim after a guess."""
    say = report or (lambda _: None)
    if strategy == "model" and earlier:
        guess, basis = _guess(earlier, seq_len)
        if basis:
            say(f"seq_len {seq_len}: aimed from one length: {basis}")
        outcome = hinted_search(
            probe, cap=cap, budget_bytes=budget_bytes, guess=guess, predict=predict
        )
    else:
        outcome = run_search(strategy, probe, cap=cap, budget_bytes=budget_bytes, predict=predict)
    before = _fit_points(earlier)
    found = outcome.max_micro_batch_size
    if found >= 1 and not earlier and len(_points(outcome, seq_len)) < 2:
        # The first length: with one peak it could never be left out of the fit.
        size = _size_for_fit(outcome)
        if size is not None:
            say(
                f"seq_len {seq_len}: one more probe, at {size}, so that the fit across "
                f"lengths has two peaks at this length (one near M* {found} so far)"
            )
            return SearchOutcome(found, [*outcome.probes, probe(size)])
    if found < 1 or not before or _fit_is_complete(before, _points(outcome, seq_len)):
        return outcome
    size = _size_for_fit(outcome)
    if size is not None:
        outcome = SearchOutcome(found, [*outcome.probes, probe(size)])
        if _separable([*before, *_points(outcome, seq_len)]):
            say(
                f"seq_len {seq_len}: one more probe, at {size}, so that the fit across "
                f"lengths has two peaks at this length (the guess {found} was right)"
            )
            return outcome
    say(
        f"seq_len {seq_len}: no fit across lengths yet (too few peaks near the boundary, "
        f"M* {found}); later lengths are aimed from one length"
    )
    return outcome


def _points(outcome: SearchOutcome, seq_len: int) -> list[tuple[int, int, int]]:
    return boundary_points(outcome.probes, outcome.max_micro_batch_size, seq_len)


def _fit_points(profiles: Sequence[Profile]) -> list[tuple[int, int, int]]:
    return [
        point
        for p in profiles
        if p.max_micro_batch_size >= 1
        for point in boundary_points(p.probes, p.max_micro_batch_size, _seq_len(p))
    ]


def _fit_is_complete(before: list[tuple[int, int, int]], here: list[tuple[int, int, int]]) -> bool:
    """Whether the points so far need no probe more at this length: the fit can be made,
    and it knows its error (each point can be left out of it) or a second peak here would
    not teach it (this length has two already)."""
    points = [*before, *here]
    if not _separable(points):
        return False
    return len(here) >= 2 or fit_lengths(points).held_out_error is not None


def _separable(points: list[tuple[int, int, int]]) -> bool:
    try:
        fit_lengths(points)
    except BadInputError:
        return False
    return True


def _size_for_fit(outcome: SearchOutcome) -> int | None:
    """The smallest size not yet measured within a factor of two below ``M*`` (it fits, so
    it is the cheapest probe that gives this length a second peak near the boundary)."""
    found = outcome.max_micro_batch_size
    measured = {p.micro_batch_size for p in outcome.probes}
    return next((m for m in range(max(1, math.ceil(found / 2)), found) if m not in measured), None)


def guess_max_micro_batch(profiles: Sequence[Profile], seq_len: int) -> int:
    """The predicted ``M*`` at ``seq_len`` from profiles at shorter lengths (each carrying
    its ``workload.seq_len``); the formulas are in the module's docstring."""
    return _guess(profiles, seq_len)[0]


def _guess(profiles: Sequence[Profile], seq_len: int) -> tuple[int, str]:
    """The guess, and why it comes from one length when two or more were measured (an
    empty reason otherwise)."""
    found = [p for p in profiles if p.max_micro_batch_size >= 1]
    if not found:
        return 1, ""  # nothing fit at a shorter length: probe 1 to say so at this one
    bound = min(p.max_micro_batch_size for p in found)
    budget = found[-1].budget_bytes
    reason = ""
    if len(found) >= 2:
        try:
            fit = fit_length_profiles(found, [_seq_len(p) for p in found])
        except BadInputError:
            reason = "the lengths before it measured too few peaks near the boundary to fit"
        else:
            per_sample = fit.per_sample_bytes(seq_len)
            if per_sample > 0:
                return min(bound, int((budget - fit.predict(0, seq_len)) // per_sample)), ""
            reason = "the fit has peaks that do not grow with the micro batch"
    return min(bound, _scaled_guess(found[-1], seq_len)), reason


def _scaled_guess(profile: Profile, seq_len: int) -> int:
    """From one length: the bytes per sample above the resident parts, scaled by length
    (the tokens per micro batch kept instead when the probe has no breakdown)."""
    found, measured_len = profile.max_micro_batch_size, _seq_len(profile)
    probe = profile.probe_at(found)
    if probe is None or probe.footprint_bytes is None or probe.breakdown is None:
        return found * measured_len // seq_len
    # Memory outside torch (a CUDA context) stays what it was, as the resident parts do.
    fixed = probe.breakdown.resident_bytes + probe.non_torch_bytes
    per_sample = max(probe.footprint_bytes - fixed, 1) / found * seq_len / measured_len
    return int((profile.budget_bytes - fixed) // per_sample)


def _seq_len(profile: Profile) -> int:
    seq_len = profile.workload.seq_len
    if seq_len is None:
        raise ValueError("a profile of the family must carry its seq_len")
    return seq_len


def _at_length(profile: Profile, seq_len: int, family: str | None) -> Profile:
    workload = profile.workload.model_copy(update={"seq_len": seq_len, "length_family": family})
    return profile.model_copy(update={"workload": workload})
