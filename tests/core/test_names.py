"""The rule on names people read (tuner.core.names), character class by character class."""

from __future__ import annotations

import pytest

from tuner.core.names import name_problem


@pytest.mark.parametrize(
    "name",
    ["gpt-small", "x86_64 (512 MiB limit)", "naïve-bayes", "модель-2", "gpt 日本語 モデル", "асе"],
)
def test_names_in_one_script_are_accepted(name: str) -> None:
    assert name_problem(name) is None


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("gpt-sm\u0430ll", "Cyrillic (U+0430 CYRILLIC SMALL LETTER A)"),
        ("\u03b1-sweep", "Greek (U+03B1 GREEK SMALL LETTER ALPHA)"),
        ("gpt\u200bsmall", "(U+200B ZERO WIDTH SPACE) at position 3"),
        ("gpt\u2060small", "U+2060 WORD JOINER"),
        ("gpt\u2028small", "U+2028 LINE SEPARATOR"),
        ("ci\n", "(U+000A) at position 2"),
        ("gpt\u00a0small", "write it as 'gpt small'"),
        ("\U0001d420pt", "write it as 'gpt'"),
        ("Core\u2122", "write it as 'CoreTM'"),
    ],
)
def test_names_that_could_pass_for_another_are_refused_saying_what_to_type(
    name: str, says: str
) -> None:
    problem = name_problem(name)
    assert problem is not None
    assert says in problem
    assert "\n" not in problem
