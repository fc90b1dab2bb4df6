"""Raw text as the corpus reader needs it: a file that is not text fails in one sentence, and an
over-long line is cut into sentences short enough for an instance.

    check_text_head(path, first_64_kib)          # NotTextError on NUL bytes or mostly non-UTF-8 bytes
    sentences, rest = cut_sentences(text, 1000, final=False)   # `rest` goes in front of the next piece
"""

from __future__ import annotations

import re

# Only the start of a file is looked at: a binary file shows itself there, and a multi-GB corpus costs
# one extra read of 64 KiB, not a pass over the file.
SNIFF_BYTES = 64 * 1024
# Text in a legacy 8-bit encoding with a few accents (Latin-1 French, German) has a few per cent of its
# bytes undecodable: it is read, the bytes become U+FFFD and the lines are counted in replaced_lines.
# Random bytes and binaries have ~50% undecodable bytes and Cyrillic or Greek in a legacy code page ~70%,
# which would train on U+FFFD alone: above 30% the file is refused and must be re-encoded.
MAX_UNDECODABLE_SHARE = 0.30

# A sentence end inside an over-long line: . ! ? (and closing quotes or brackets) before whitespace, or
# a CJK full stop. A regex, not sentencex: it is for lines with no line breaks at all, where a wrong cut
# after "Dr." costs little, and it runs over multi-GB lines at regex speed.
_SENTENCE_END = re.compile(r"[.!?][\"'”’»)\]]*\s+|[。！？][」』”’）)]*")


class NotTextError(ValueError):
    """A corpus file that is not text (a binary, random bytes, UTF-16, a legacy code page)."""


def incomplete_utf8_tail(data: bytes) -> int:
    """Bytes at the end of `data` that begin a UTF-8 character not finished yet (0 to 3)."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 == 0x80:  # continuation byte: the lead byte is further back
            continue
        if byte >> 5 == 0b110:
            need = 2
        elif byte >> 4 == 0b1110:
            need = 3
        elif byte >> 3 == 0b11110:
            need = 4
        else:
            need = 1
        return back if need > back else 0
    return 0


def check_text_head(path: str, head: bytes, decompressed: bool = False) -> None:
    """Raises NotTextError, naming `path`, when the first SNIFF_BYTES of a file are not UTF-8 text."""
    where = f"the first {SNIFF_BYTES // 1024} KiB {'it decompresses to' if decompressed else 'of it'}"
    if b"\0" in head:
        raise NotTextError(
            f"{path} is not text (NUL bytes in {where}): pass plain-text files, UTF-8 with one "
            "sentence per line and a blank line between documents (re-encode UTF-16 as UTF-8)."
        )
    if len(head) >= SNIFF_BYTES:  # a character cut off by the 64 KiB boundary is not an error
        head = head[: len(head) - incomplete_utf8_tail(head)]
    undecodable = head.decode("utf-8", errors="replace").count("\ufffd")
    if head and undecodable > MAX_UNDECODABLE_SHARE * len(head):
        raise NotTextError(
            f"{path} is not UTF-8 text ({undecodable / len(head):.0%} of the bytes in {where} "
            "are not UTF-8): re-encode it as UTF-8 (e.g. iconv -f latin1 -t utf-8), or pass "
            "plain-text files."
        )


def _cut_long(text: str, max_chars: int, pieces: list[str], keep_rest: bool) -> str:
    """Appends to `pieces` cuts of `text` of at most max_chars, each at the last whitespace that fits or,
    with none, at max_chars; returns what is left when keep_rest (at most max_chars, unstripped), else ""."""
    pos, n = 0, len(text)
    while n - pos > max_chars:
        limit = pos + max_chars
        cut = max(text.rfind(" ", pos + 1, limit + 1), text.rfind("\t", pos + 1, limit + 1))
        if cut <= pos:
            cut = limit
        piece = text[pos:cut].strip()
        if piece:
            pieces.append(piece)
        pos = cut
    if keep_rest:
        return text[pos:]
    piece = text[pos:].strip()
    if piece:
        pieces.append(piece)
    return ""


def cut_sentences(text: str, max_chars: int, final: bool = True) -> tuple[list[str], str]:
    """Cuts text into stripped sentences of at most max_chars: at every sentence end, then a longer
    sentence at whitespace, then anywhere. With final=False the text goes on in a next piece: the end
    after the last cut (at most max_chars, unstripped) is returned, to be put in front of that piece, so
    that a sentence or a word across the boundary stays whole; with final=True it is ""."""
    pieces: list[str] = []
    pos = 0
    for match in _SENTENCE_END.finditer(text):
        _cut_long(text[pos : match.end()], max_chars, pieces, keep_rest=False)
        pos = match.end()
    rest = _cut_long(text[pos:], max_chars, pieces, keep_rest=not final)
    return pieces, rest
