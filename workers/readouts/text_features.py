"""Views of a text that keep one kind of evidence only, for the label gate's classifiers
(torch-free, scikit-learn): its formatting alone (:func:`shape_of`) or its words alone
(:func:`content_words`), each with a vectorizer fitted on the train split that gives
proportions, so a linear reader cannot read the length off them; and everything but the
content at once (:class:`NuisanceVectorizer`: length, formatting and the first and last tokens).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy.sparse import csr_matrix, hstack
from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS, CountVectorizer, TfidfVectorizer

_SHAPE = re.compile(r"[^\W\d_]+|\d+|\n|[^\S\n]+|.", re.UNICODE)
_WORD = re.compile(r"[a-z]{2,}")


def _word_shape(word: str) -> str:
    if word.islower():
        return "a"
    if word.isupper():
        return "U" if len(word) > 1 else "C"
    if word[0].isupper() and word[1:].islower():
        return "C"
    return "M"


def shape_of(text: str) -> str:
    """The formatting of ``text``, one symbol per word, number, blank run or punctuation mark.

    Every word becomes one letter for its case pattern (``a`` lower, ``C`` capitalised, ``U``
    all capitals, ``M`` mixed), every run of digits ``0``, every run of spaces ``_`` and every
    line break ``N``; punctuation and symbols stay. "Oak (Quercus alba), 1753." reads
    ``C_(C_a),_0.``: no word, and no word's length, survives.
    """
    out = []
    for piece in _SHAPE.findall(text):
        if piece[0].isalpha():
            out.append(_word_shape(piece))
        elif piece[0].isdigit():
            out.append("0")
        elif piece == "\n":
            out.append("N")
        elif piece.isspace():
            out.append("_")
        else:
            out.append(piece)
    return "".join(out)


def content_words(text: str) -> list[str]:
    """Lower-cased alphabetic words of >= 2 letters, English stop words removed: no punctuation,
    case, digit or line break survives."""
    return [w for w in _WORD.findall(text.lower()) if w not in ENGLISH_STOP_WORDS]


def formatting_vectorizer() -> TfidfVectorizer:
    """Character 1-3-grams of :func:`shape_of`, as proportions (TF-IDF, l1).

    Proportions (here and in :func:`content_vectorizer`): a linear reader then sees a weighted
    mean over the text's words, and the length does not come in by the back door (l2-normalised
    or raw counts let it read the length off the entries' size or sum: on a label that is pure
    length, content words alone then reach 100%).
    """
    return TfidfVectorizer(preprocessor=shape_of, analyzer="char", ngram_range=(1, 3),
                           lowercase=False, norm="l1")


def content_vectorizer() -> TfidfVectorizer:
    """Bag of :func:`content_words`, as proportions (TF-IDF, l1)."""
    return TfidfVectorizer(analyzer=content_words, norm="l1")


def lsa_vectorizer(min_df: int = 2) -> TfidfVectorizer:
    """The unsupervised ceiling's text view: every word (stop words out), TF-IDF, sublinear."""
    return TfidfVectorizer(analyzer=content_words, sublinear_tf=True, min_df=min_df)


FRAME_TOKENS = 2
"""The frame: the first and the last this-many tokens of an example, by position."""


def frame_features(tokens: Sequence[int], k: int = FRAME_TOKENS) -> list[str]:
    """``first{i}:{id}`` for the first ``k`` tokens and ``last{i}:{id}`` for the last ``k``
    (``last0`` the final token): the opening and closing formula, which no bag of shapes sees."""
    head = [f"first{i}:{t}" for i, t in enumerate(tokens[:k])]
    return head + [f"last{i}:{t}" for i, t in enumerate(list(tokens[::-1])[:k])]


class NuisanceVectorizer:
    """Length + formatting + frame in one feature matrix, fitted on ``(text, tokens)`` pairs.

    Length: (n, log n) of the token count, standardised on train. Formatting: the proportions
    of :func:`formatting_vectorizer`. Frame: one binary feature per (position, token) of
    :func:`frame_features`. What a reader of everything but the content gets: the label gate
    requires it to stay well below the content reader.
    """

    def __init__(self, k: int = FRAME_TOKENS) -> None:
        self.k = k

    def _length(self, pairs: Sequence[tuple[str, Sequence[int]]]) -> np.ndarray:
        n = np.array([len(tokens) for _, tokens in pairs], dtype=float)
        return np.column_stack([n, np.log1p(n)])

    def fit(self, pairs: Sequence[tuple[str, Sequence[int]]], y: Any = None) -> NuisanceVectorizer:
        length = self._length(pairs)
        self.mean_, self.scale_ = length.mean(0), length.std(0) + 1e-9
        self.formatting_ = formatting_vectorizer().fit([text for text, _ in pairs])
        self.frame_ = CountVectorizer(analyzer=lambda t: frame_features(t, self.k), binary=True,
                                      lowercase=False).fit([tokens for _, tokens in pairs])
        return self

    def transform(self, pairs: Sequence[tuple[str, Sequence[int]]]) -> Any:
        length = (self._length(pairs) - self.mean_) / self.scale_
        return hstack([csr_matrix(length), self.formatting_.transform([t for t, _ in pairs]),
                       self.frame_.transform([tokens for _, tokens in pairs])]).tocsr()

    def fit_transform(self, pairs: Sequence[tuple[str, Sequence[int]]], y: Any = None) -> Any:
        return self.fit(pairs).transform(pairs)
