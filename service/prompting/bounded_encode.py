"""Tokenizing untrusted text in bounded native calls.

openai-harmony's BPE (tiktoken's) is quadratic in the length of one pre-token, and it holds the GIL
throughout: 120 KB of one character took 21 s in one call, during which no other thread of the process
(the event loop included) runs. So text is encoded in pieces of at most `MAX_PIECE_CHARS` characters, each
one short native call; between calls other threads get the GIL.

A piece ends where the o200k pre-tokenizer certainly starts a new pre-token whatever follows: before a space
that follows a non-space, or after a newline that a non-space other than `/` follows. Cutting there gives
exactly the ids of encoding the whole text at once (tests compare them). Only a stretch of more than
`MAX_PIECE_CHARS` characters with no such place (a long run of one character, a huge unbroken token) is cut
inside, which can tokenize that stretch differently from the reference tokenizer; the ids still decode to
exactly the same text, and natural text never has such stretches. Pieces depend only on the text, so the
ids are deterministic (a resumed run rebuilds the same prompt).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

# The cost of a piece grows with the square of its UTF-8 bytes: 500 ASCII characters or 300 others (an emoji is
# 4 bytes) encode in about 0.1-0.5 ms (a run of 1,000 costs 0.4 ms, of 120,000 21 s).
MAX_PIECE_CHARS = 500
MAX_NON_ASCII_PIECE_CHARS = 300

# Punctuation that is neither a letter, a mark, a number nor the apostrophe of a contraction (ASCII, CJK and
# fullwidth, general punctuation): no pre-token holds a letter or a number followed by one of these.
_PUNCT = r"!-&(-/:-@\[-`{-~\u2010-\u2027\u2030-\u205e\u3000-\u3004\u3008-\u3020\u3030\u303d-\u303f" + (
    r"\uff01-\uff0f\uff1a-\uff20\uff3b-\uff40\uff5b-\uff65"
)
# The end of a prefix that is a pre-token boundary in any text: a non-space then a space; a newline then a
# non-space that cannot continue the newline's pre-token (`[\r\n/]*` after punctuation); a letter or number
# then punctuation; a digit then an ASCII letter. Greedy `.+` finds the last such place in a window, in one
# C-level scan.
_LAST_BOUNDARY = re.compile(
    rf"(?s:.+)(?:(?<=\S)(?= )|(?<=\n)(?=[^\s/])|(?<=[^\W_])(?=[{_PUNCT}])|(?<=\d)(?=[A-Za-z]))"
)


def pieces(text: str, max_chars: int = MAX_PIECE_CHARS) -> Iterator[str]:
    """`text` cut into consecutive pieces of at most `max_chars` characters (fewer where they are not ASCII),
    at pre-token boundaries where one lies within reach."""
    start = 0
    narrow = min(max_chars, MAX_NON_ASCII_PIECE_CHARS)
    while len(text) - start > narrow:
        end = start + max_chars
        if not text[start:end].isascii():
            end = start + narrow
        if end >= len(text):
            break
        match = _LAST_BOUNDARY.match(text, start, end + 1)  # lookahead may read text[end]
        cut = match.end() if match is not None else end
        yield text[start:cut]
        start = cut
    yield text[start:]


def encode_in_pieces(encode: Callable[[str], list[int]], text: str, max_chars: int = MAX_PIECE_CHARS) -> list[int]:
    """encode(text), one bounded call per piece (see the module docstring)."""
    ids: list[int] = []
    for piece in pieces(text, max_chars):
        ids += encode(piece)
    return ids
