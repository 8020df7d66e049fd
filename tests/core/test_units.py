"""Byte quantities: what people type on the command line and what the tables print."""

from __future__ import annotations

import pytest

from tuner.core.errors import BadInputError
from tuner.core.units import format_bytes, parse_bytes


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2GiB", 2 * 1024**3),
        ("512 MiB", 512 * 1024**2),
        ("1.5GB", 1_500_000_000),
        ("1000000", 1_000_000),
        ("1", 1),
        ("64kib", 64 * 1024),
        ("3 kB", 3000),
        ("1TiB", 1024**4),
        ("2 t", 2 * 1000**4),
        ("  7B  ", 7),
        (".5KiB", 512),
    ],
)
def test_parse_bytes_accepts_units_spaces_and_plain_numbers(text: str, expected: int) -> None:
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["0", "0GiB", "0.0MB", "0.4"])
def test_parse_bytes_rejects_zero_with_a_hint(text: str) -> None:
    # 0.4 bytes truncates to nothing: a limit of zero bytes is no limit anyone means.
    with pytest.raises(BadInputError, match="positive"):
        parse_bytes(text)


@pytest.mark.parametrize(
    "text", ["-1", "-2GiB", "abc", "", "GiB", "1.2.3GB", "2 GiB extra", "1e9", "12 parsecs", "5XB"]
)
def test_parse_bytes_rejects_negatives_garbage_and_unknown_units(text: str) -> None:
    with pytest.raises(BadInputError) as info:
        parse_bytes(text)
    # The message quotes what was typed and shows a form that works.
    assert repr(text) in info.value.message
    assert "512MiB" in info.value.message
    assert info.value.code == "bad_input"


@pytest.mark.parametrize(
    ("count", "expected"),
    [
        (None, "-"),
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1 KiB"),
        (1536, "1.5 KiB"),
        (512 * 1024**2, "512 MiB"),
        (int(1.5 * 1024**3), "1.5 GiB"),
        (3 * 1024**4, "3 TiB"),
        (2048 * 1024**4, "2.05e+03 TiB"),
    ],
)
def test_format_bytes_uses_binary_units_and_three_figures(
    count: float | None, expected: str
) -> None:
    assert format_bytes(count) == expected


def test_format_bytes_round_trips_through_parse_bytes_for_whole_units() -> None:
    for text in ("512 MiB", "2 GiB", "8 KiB"):
        assert format_bytes(parse_bytes(text)) == text
