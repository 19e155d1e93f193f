"""Which language a text is in, for `POST /detect` and `source: "auto"`: py3langid (its model ships in its wheel,
numpy only), restricted as LibreTranslate restricts its detector to the languages it has loaded: here, the
languages the served models translate from or into. benchmarks/language_identifiers.py measured it against lingua
(docs/serving.md has the figures).

A detection is LibreTranslate's: {"confidence": 0 to 100, "language": code}, the likeliest first. A text with no
letter in it is no language: the first of the languages, with confidence 0, as LibreTranslate answers it.
"""

from __future__ import annotations

import copy
import functools
import threading

from mt.errors import ApiError

DETECT_CHARS = 1000  # of each text: plenty to tell a language, and it bounds the time a request takes
CANDIDATES = 3  # detections per text, as LibreTranslate answers


@functools.cache
def full_model():
    """py3langid's identifier of every language it knows, loaded once a process (1-2 s)."""
    try:
        from py3langid.langid import MODEL_FILE, LanguageIdentifier
    except ImportError:
        raise ApiError(501, "language detection (/detect, source auto) needs py3langid, which is not installed on "
                            "this server: pip install 'mt[serve]' (or pip install py3langid); or give source") from None
    return LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)


class Detector:
    """The identifier of the languages `served` (the models' sources and targets), loaded when first asked."""

    def __init__(self, served: set[str]):
        self.served, self.identifier, self.lock = served, None, threading.Lock()

    def load(self):
        with self.lock:
            if self.identifier is None:
                full = full_model()
                known = sorted(self.served & set(full.labels))
                if not known:
                    raise ApiError(501, f"no language detection for this server's languages "
                                        f"({', '.join(sorted(self.served))}): the identifier knows none of them; "
                                        f"give source")
                identifier = copy.copy(full)  # set_languages replaces its tables, leaving the shared model's be
                identifier.set_languages(known)
                self.languages, self.identifier = known, identifier
        return self.identifier

    def detect(self, text: str) -> list[dict]:
        """The likeliest languages of `text` (its first DETECT_CHARS characters), best first."""
        identifier = self.load()
        text = text[:DETECT_CHARS]
        if not any(ch.isalpha() for ch in text):
            return [{"confidence": 0.0, "language": self.languages[0]}]
        ranked = identifier.rank(text)[:CANDIDATES]
        return [{"confidence": round(100 * p, 1), "language": code} for code, p in ranked
                if round(100 * p, 1) > 0 or code == ranked[0][0]]

    def detect_together(self, texts: list[str]) -> list[dict]:
        """The likeliest languages of `texts` taken together, as LibreTranslate answers a list: each language's
        confidence averaged over the texts, weighted by their length."""
        found: dict[str, float] = {}
        weights = [max(1, len(text[:DETECT_CHARS])) for text in texts]
        for text, weight in zip(texts, weights, strict=True):
            for one in self.detect(text):
                found[one["language"]] = found.get(one["language"], 0.0) + one["confidence"] * weight
        ranked = sorted(found.items(), key=lambda item: item[1], reverse=True)[:CANDIDATES]
        return [{"confidence": round(total / sum(weights), 1), "language": code} for code, total in ranked]
