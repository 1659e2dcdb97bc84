"""A datatrove ``WordTokenizer`` that splits words exactly like Crucible (``ops.curation.text.tokens``).

Lives in its own module (imported by name through PYTHONPATH=benchmarks) so that datatrove's
forkserver workers can unpickle it. Runs in ``.venv-bench`` and so must not import Crucible: the token
rule is copied from ``ops/curation/text.py`` (``TOKEN_PATTERN``; NFKC + lowercase + whitespace collapse).
"""

from __future__ import annotations

import re
import unicodedata

from datatrove.utils.word_tokenizers import WordTokenizer

TOKEN_PATTERN = r"\\[A-Za-z]+|\w+|[^\w\s]"  # == ops.curation.text.TOKEN_PATTERN
_TOKEN = re.compile(TOKEN_PATTERN)
_WS = re.compile(r"\s+")


class CrucibleTokenizer(WordTokenizer):
    """LaTeX commands, runs of word characters, single symbols of the NFKC-lowercased text."""

    def __init__(self):
        super().__init__("crucible")

    def word_tokenize(self, text: str) -> list[str]:
        return _TOKEN.findall(_WS.sub(" ", unicodedata.normalize("NFKC", text).lower()).strip())

    def sent_tokenize(self, text: str) -> list[str]:
        return [text]

    def span_tokenize(self, text: str) -> list[tuple[int, int]]:
        return [(0, len(text))]
