"""Byte quantities: parsing what people type and printing what people read."""

from __future__ import annotations

import re

from tuner.core.errors import BadInputError

_UNITS: dict[str, int] = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}
_QUANTITY = re.compile(r"^\s*(?P<number>\d+(?:\.\d+)?|\.\d+)\s*(?P<unit>[a-zA-Z]*)\s*$")


def parse_bytes(text: str) -> int:
    """Parse ``"2GiB"``, ``"512 MiB"``, ``"1.5GB"`` or ``"1000000"`` into a positive byte count."""
    match = _QUANTITY.match(text)
    unit = match.group("unit").lower() if match else ""
    if match is None or unit not in _UNITS:
        raise BadInputError(
            f"cannot read memory size {text!r}: write a positive number with an optional unit, "
            "for example 512MiB, 2GiB or 1.5GB"
        )
    value = int(float(match.group("number")) * _UNITS[unit])
    if value <= 0:
        raise BadInputError(f"memory size {text!r} must be positive, for example 512MiB or 2GiB")
    return value


def format_bytes(count: float | None) -> str:
    """Render a byte count with a binary unit, three significant figures: ``1.50 GiB``."""
    if count is None:
        return "-"
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.3g} {unit}"
        value /= 1024
    return f"{value:.3g} TiB"


def limited_name(name: str, limit_bytes: int | None) -> str:
    """A device's name with the memory limit it runs under, so that each limit (its own
    device, with its own key) reads apart from the others: ``x86_64 (128 MiB limit)``."""
    return name if limit_bytes is None else f"{name} ({format_bytes(limit_bytes)} limit)"
