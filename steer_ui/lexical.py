"""Lexical similarity between a generated answer and reference answers.

The TSV paper labels generated answers with BLEURT, which needs a model we do
not have offline.  We use ROUGE-L (the F-measure of the longest common
subsequence of word tokens) instead, and token F1 (bag-of-words overlap, the
SQuAD metric) as a second opinion.  Both work on lower-cased word tokens with
punctuation and English articles removed, so "The Eiffel Tower." and "eiffel
tower" match exactly.

Labelling rule (:func:`label_answer`): an answer is truthful when its best
ROUGE-L against the correct references beats its best ROUGE-L against the
incorrect ones; when there are no incorrect references, when it reaches
``threshold`` against the correct ones.
"""
from __future__ import annotations

import re
import unicodedata
from collections import Counter
from typing import Iterable, Sequence

_ARTICLES = {"a", "an", "the"}
_WORD = re.compile(r"[\w']+", re.UNICODE)
DEFAULT_THRESHOLD = 0.5


def tokens(text: str) -> list[str]:
    """Lower-cased word tokens without punctuation or articles."""
    text = unicodedata.normalize("NFKC", str(text or "")).lower()
    return [w.strip("'") for w in _WORD.findall(text) if w.strip("'") and w.strip("'") not in _ARTICLES]


def _lcs_length(a: Sequence[str], b: Sequence[str]) -> int:
    if not a or not b:
        return 0
    if len(a) < len(b):
        a, b = b, a
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b, 1):
            cur.append(prev[j - 1] + 1 if x == y else max(prev[j], cur[j - 1]))
        prev = cur
    return prev[-1]


def rouge_l(candidate: str, reference: str) -> float:
    """ROUGE-L F1 (β = 1) of ``candidate`` against ``reference``, in [0, 1]."""
    c, r = tokens(candidate), tokens(reference)
    lcs = _lcs_length(c, r)
    if lcs == 0:
        return 0.0
    precision, recall = lcs / len(c), lcs / len(r)
    return 2 * precision * recall / (precision + recall)


def token_f1(candidate: str, reference: str) -> float:
    """Bag-of-words F1 between the two texts, in [0, 1]."""
    c, r = Counter(tokens(candidate)), Counter(tokens(reference))
    common = sum((c & r).values())
    if common == 0:
        return 0.0
    precision, recall = common / sum(c.values()), common / sum(r.values())
    return 2 * precision * recall / (precision + recall)


METRICS = {"rouge_l": rouge_l, "token_f1": token_f1}


def best_match(candidate: str, references: Iterable[str], metric: str = "rouge_l") -> float:
    """The highest similarity of ``candidate`` to any reference (0 when there are none)."""
    fn = METRICS[metric]
    return max((fn(candidate, ref) for ref in references if str(ref).strip()), default=0.0)


def label_answer(answer: str, correct: Sequence[str], incorrect: Sequence[str] = (), metric: str = "rouge_l",
                 threshold: float = DEFAULT_THRESHOLD) -> tuple[int, float, float]:
    """(label, best similarity to correct, best to incorrect); label 1 = truthful, 0 = hallucinated."""
    to_correct = best_match(answer, correct, metric)
    to_incorrect = best_match(answer, incorrect, metric)
    if any(str(x).strip() for x in incorrect):
        label = int(to_correct > to_incorrect)
    else:
        label = int(to_correct >= threshold)
    return label, to_correct, to_incorrect


def split_references(value) -> list[str]:
    """References from a list or a TruthfulQA-style '; '-separated string."""
    if value is None:
        return []
    if isinstance(value, float) and value != value:  # NaN from pandas
        return []
    if isinstance(value, (list, tuple)):
        return [str(v).strip() for v in value if str(v).strip()]
    return [part.strip() for part in str(value).split(";") if part.strip()]
