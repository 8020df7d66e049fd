"""The optional parts of the distribution (its extras) and the one line that installs each.

The package is installed from a clone of the repository (it is not on a package index), so
the line is the editable install run at the clone's root. A command whose extra is missing
says so in one line and exits 2 (:class:`MissingExtraError` is bad input), instead of a
``ModuleNotFoundError`` traceback.
"""

from __future__ import annotations

from importlib.util import find_spec

from tuner.core.errors import BadInputError

__all__ = ["EXTRA_MODULES", "MissingExtraError", "install_line", "missing_modules", "require"]

# The top-level modules each extra brings that the code imports, in the order checked.
# psycopg is left out of `server`: only a postgresql:// store needs it.
EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    "torch": ("torch",),
    "server": ("fastapi", "uvicorn", "sqlalchemy", "alembic", "jinja2", "limits"),
    "hf": ("transformers", "peft"),
    "integrations": ("transformers", "lightning"),
    "docs": ("mkdocs", "material", "mkdocstrings"),
}


class MissingExtraError(BadInputError):
    """A feature needs an extra of the distribution that is not installed."""

    code = "missing_extra"


def install_line(extra: str) -> str:
    """``pip install -e '.[EXTRA]'``: what installs ``extra``, run at the clone's root."""
    if extra not in EXTRA_MODULES:
        raise ValueError(f"no extra named {extra!r}; extras: {', '.join(EXTRA_MODULES)}")
    return f"pip install -e '.[{extra}]'"


def missing_modules(extra: str, modules: tuple[str, ...] | None = None) -> list[str]:
    """The modules of ``extra`` (or only ``modules`` of it) that cannot be imported here.

    Looked up without importing them, so the check costs no start-up time."""
    wanted = EXTRA_MODULES[extra] if modules is None else modules
    absent = []
    for name in wanted:
        try:
            found = find_spec(name) is not None
        except (ImportError, ValueError):  # a parent that fails, or a module left half-made
            found = False
        if not found:
            absent.append(name)
    return absent


def require(extra: str, *, feature: str, modules: tuple[str, ...] | None = None) -> None:
    """Raise :class:`MissingExtraError` naming ``extra`` and its install line when one of its
    modules (or of ``modules``) is missing; ``feature`` is what needs it (``tuner serve``)."""
    absent = missing_modules(extra, modules)
    if absent:
        raise MissingExtraError(
            f"{feature} needs the {extra} extra ({', '.join(absent)} not installed): "
            f"{install_line(extra)} in your clone of microbatch-tuner"
        )
