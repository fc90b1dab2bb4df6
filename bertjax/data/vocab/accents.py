"""What BERT's accent stripping does to a corpus: the letters it merges into others (й → и, が → か, č → c, and the
vowel signs of Devanagari it drops), counted by script.

BERT's uncased WordPiece strips accents with lower-casing (NFD, then every Mn mark removed), which suits English
and silently alters other scripts. The vocab trainer and prepare count what it changes and say it once, with a
line per script and the setting that keeps the letters (`strip_accents=false`, transformers' own name).
"""

from __future__ import annotations

import collections
import functools
import re
import sys
import unicodedata


def stripped(text: str) -> str:
    """BERT's _run_strip_accents: NFD, then every nonspacing mark (Mn) dropped."""
    return "".join(c for c in unicodedata.normalize("NFD", text) if unicodedata.category(c) != "Mn")


@functools.cache
def _changed_chars() -> re.Pattern:
    """The code points lower-casing + stripping changes: letters with marks (in either case) and bare marks.
    ~0.5 s once per process, and only when a corpus has non-ASCII text."""
    found = []
    for code in range(0x80, sys.maxunicode + 1):
        c = chr(code)
        category = unicodedata.category(c)
        if category == "Mn" or (category[0] == "L" and stripped(c.lower()) != c.lower()):
            found.append(re.escape(c))
    return re.compile("[" + "".join(found) + "]")


def script_of(char: str) -> str:
    """A character's script as its Unicode name begins (LATIN, CYRILLIC, HIRAGANA, ...), title-cased;
    "Combining" for the generic marks (U+0300...)."""
    return unicodedata.name(char, "UNKNOWN").split(" ")[0].title()


class AccentCounter:
    """Counts the characters stripping changes in the texts it is shown, by script, with one example each."""

    def __init__(self) -> None:
        self.by_char: collections.Counter[str] = collections.Counter()

    def add(self, text: str, times: int = 1) -> None:
        if text.isascii():  # no ASCII character has a mark: the common case costs one C call
            return
        for char, n in collections.Counter(_changed_chars().findall(text)).items():
            self.by_char[char] += n * times

    def update(self, by_char: dict[str, int]) -> None:
        self.by_char.update(by_char)

    @property
    def total(self) -> int:
        return sum(self.by_char.values())

    def by_script(self) -> dict[str, int]:
        scripts: collections.Counter[str] = collections.Counter()
        for char, n in self.by_char.items():
            scripts[script_of(char)] += n
        return dict(scripts.most_common())

    def warning(self, who: str, how_to_keep: str) -> str:
        """One line: how many characters were changed, by script with the commonest change of each, and how to
        keep them; "" when nothing was changed."""
        if not self.by_char:
            return ""
        example: dict[str, str] = {}
        for char, _ in self.by_char.most_common():
            script = script_of(char)
            if script not in example:
                low = char.lower()
                example[script] = f"{low}→{stripped(low) or '(dropped)'}"
        parts = ", ".join(f"{script} {n:,} ({example[script]})" for script, n in self.by_script().items())
        return (
            f"{who}: warning: stripping accents (BERT's uncased rule, with do_lower_case) changed "
            f"{self.total:,} characters of the corpus: {parts}; they merge with other letters in the vocab, the "
            f"records and the export; to keep them, {how_to_keep}."
        )
