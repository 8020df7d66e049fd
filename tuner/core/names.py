"""Names people read: workload, device and token names look like exactly one string.

Two names that differ only in what a reader cannot see (``gpt-small`` with a Latin ``e``
and with a Cyrillic ``е``; with and without a zero-width space) would sit side by side
on the dashboard and in every list, and a question would reach whichever was asked. So a
name is refused, with a one-line error that says what to type instead, when it has:

1. a character that is invisible or controls the text: Unicode categories Cc (control,
   a newline among them, which would also forge a line of the access log), Cf (format:
   zero-width space and joiners, bidirectional overrides), Zl and Zp (line and
   paragraph separators), Co (private use) and Cn (unassigned);
2. a compatibility form that NFKC normalisation folds into another character
   (fullwidth ``ｇｐｔ``, mathematical ``𝐠𝐩𝐭``, a no-break space, ``™``): the error gives
   the plain form to type;
3. letters of two scripts, except Latin beside the East Asian scripts (Han, Hiragana,
   Katakana, Hangul, Bopomofo), which Unicode's "highly restrictive" profile (UTS #39)
   also allows and whose letters do not pass for Latin ones. A letter's script is the
   first word of its Unicode name (``CYRILLIC SMALL LETTER IE``), which the standard
   library has; digits, punctuation, symbols and combining marks belong to no script.

This is a rule on one name, not a search for look-alikes among stored names: a name in
one script that happens to look like another (all-Cyrillic ``асе``) is accepted, and a
reader who needs to tell such rows apart has their keys. Plain ASCII without control
characters, nearly every name, passes without a look at each character.
"""

from __future__ import annotations

import unicodedata

_HIDDEN = frozenset({"Cc", "Cf", "Zl", "Zp", "Co", "Cn"})
# First words of the Unicode names of East Asian letters (and their iteration and
# prolonged-sound marks), which may stand beside Latin ones.
_EAST_ASIAN = frozenset(
    {"CJK", "IDEOGRAPHIC", "HIRAGANA", "KATAKANA", "KATAKANA-HIRAGANA", "HANGUL", "BOPOMOFO"}
)


def _described(char: str) -> str:
    name = unicodedata.name(char, "")
    return f"U+{ord(char):04X}" + (f" {name}" if name else "")


def _script(char: str) -> str | None:
    if not unicodedata.category(char).startswith("L"):
        return None  # digits, punctuation, symbols and marks go with any script
    return unicodedata.name(char, "?").split(" ", 1)[0]


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot be told from another that looks the same, or None when it can
    (see the module's docstring); the reason completes ``the name ...``."""
    if name.isascii() and name.isprintable():
        return None
    for position, char in enumerate(name):
        if unicodedata.category(char) in _HIDDEN:
            return (
                f"has an invisible or control character ({_described(char)}) at position "
                f"{position}: type the name without it"
            )
    plain = unicodedata.normalize("NFKC", name)
    if plain != name:
        return f"has characters with a plain form that looks the same: write it as {plain!r}"
    scripts: dict[str, str] = {}  # script -> its first letter in the name
    for char in name:
        script = _script(char)
        if script is not None:
            scripts.setdefault(script, char)
    if len(scripts) > 1 and not set(scripts) <= _EAST_ASIAN | {"LATIN"}:
        shown = ", ".join(
            f"{script.title()} ({_described(char)})" for script, char in scripts.items()
        )
        return f"mixes letters of scripts that can look alike, {shown}: write it in one script"
    return None


def check_name(name: str) -> str:
    """``name`` unchanged, or a ``ValueError`` saying what to type instead."""
    problem = name_problem(name)
    if problem is not None:
        raise ValueError(problem)
    return name
