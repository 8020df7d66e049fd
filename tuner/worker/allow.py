"""Which jobs a worker runs: its owner's allow-list of workload targets.

A job's target is code the worker imports and calls, as the worker's own user, and anyone
with a ``write`` token may queue a job. So the worker runs only the targets its owner
named with ``tuner worker --allow PATTERN`` (or ``TUNER_WORKER_ALLOW``), and refuses the
rest before anything imports them. A pattern is

- a module prefix, ``examples``: the module ``examples`` and every module under it
  (``examples.gpt``), but not ``examples_evil``;
- a glob on the module (``fnmatch``, case-sensitive as imports are), ``team_*.models``;
- with a colon, a glob on the whole target, ``examples.gpt:workload``.

``*`` allows everything: any ``write`` token may then run any code on the host.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from fnmatch import fnmatchcase

from tuner.core.errors import BadInputError, WorkloadError
from tuner.core.targets import split_target

FLAG = "--allow"
# Names, dots, a colon and the glob characters: nothing else can match a target.
_PATTERN = re.compile(r"^[\w.*?\[\]!:]+$")
_GLOB = frozenset("*?[")


@dataclass(frozen=True)
class AllowList:
    """The targets a worker may run (see the module's docstring for the patterns)."""

    patterns: tuple[str, ...]

    @classmethod
    def parse(cls, patterns: Iterable[str]) -> AllowList:
        """The list from ``--allow`` flags or ``TUNER_WORKER_ALLOW`` (comma-separated
        items are split); BadInputError for a pattern that can match no target."""
        items = tuple(p.strip() for text in patterns for p in text.split(",") if p.strip())
        for pattern in items:
            if not _PATTERN.match(pattern) or pattern.count(":") > 1:
                raise BadInputError(
                    f"{FLAG} {pattern!r} is not a module prefix or glob: give e.g. "
                    f"{FLAG} examples, {FLAG} 'mypkg.*' or {FLAG} examples.gpt:workload"
                )
        return cls(items)

    def allows(self, target: str) -> bool:
        """Whether ``target`` (``package.module:function``) matches a pattern; a target
        of any other shape never does."""
        try:
            module, _ = split_target(target)
        except WorkloadError:
            return False
        return any(_matches(pattern, module, target) for pattern in self.patterns)

    def refusal(self, target: str, *, worker: str) -> str:
        """The one line a refused job fails with."""
        allowed = ", ".join(self.patterns) or "nothing"
        return (
            f"target {target!r} is not allowed on worker {worker!r}, which runs only "
            f"{allowed}: its owner may allow it with `tuner worker {FLAG} PATTERN`"
        )


def _matches(pattern: str, module: str, target: str) -> bool:
    if ":" in pattern:
        return fnmatchcase(target, pattern)
    if _GLOB.intersection(pattern):
        return fnmatchcase(module, pattern)
    return module == pattern or module.startswith(f"{pattern}.")
