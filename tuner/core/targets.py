"""A workload's target, ``package.module:function``: the one place that says what one
looks like and splits it into the module to import and the name to take from it."""

from __future__ import annotations

from tuner.core.errors import WorkloadError


def split_target(target: str) -> tuple[str, str]:
    """``"examples.gpt:workload"`` → ``("examples.gpt", "workload")``.

    Every dotted part must be a name: importlib takes ``.mod`` as a relative import, and a
    part such as ``--upload`` must never reach a command line as anything but a target.
    """
    module, sep, attr = target.partition(":")
    if not sep or not attr.isidentifier() or not all(p.isidentifier() for p in module.split(".")):
        raise WorkloadError(
            f"target {target!r} must look like package.module:function, e.g. examples.mlp:workload"
        )
    return module, attr
