"""StringNormalizer, natively: onnxruntime builds it on a C++ locale (en_US.UTF-8 unless the node
names one) and refuses to load the model where that locale is not installed, as in most containers;
scikit-learn's TfidfVectorizer converts to a graph that starts with one. Stop words go first (compared
case-folded unless is_case_sensitive), then the case change, one character at a time as
onnxruntime's towlower/towupper do (so 'ß' stays 'ß', where str.upper() would write 'SS')."""

from __future__ import annotations

import numpy as np

from ...errors import BadInput


def _per_char(text: str, change) -> str:
    if text.isascii():
        return change(text)
    return "".join(c if len(mapped := change(c)) != 1 else mapped for c in text)


_CHANGES = {"LOWER": str.lower, "UPPER": str.upper}


def string_normalizer(inputs, attrs, ctx):
    x = inputs[0]
    if not (x.ndim == 1 or (x.ndim == 2 and x.shape[0] == 1)) or x.shape[-1] == 0:
        raise BadInput(f"StringNormalizer takes [C] or [1, C] strings with C > 0, got shape {list(x.shape)}")
    words = [s.decode() if isinstance(s, bytes) else str(s) for s in x.reshape(-1).tolist()]
    stopwords = attrs.get("stopwords") or []
    if stopwords:
        if attrs.get("is_case_sensitive", 0):
            drop = set(stopwords)
            words = [w for w in words if w not in drop]
        else:
            drop = {_per_char(s, str.lower) for s in stopwords}
            words = [w for w in words if _per_char(w, str.lower) not in drop]
    change = _CHANGES.get(attrs.get("case_change_action", "NONE"))
    if change is not None:
        words = [_per_char(w, change) for w in words]
    y = np.array(words or [""], dtype=object)  # all dropped: one empty string, as onnxruntime
    return [y.reshape(1, -1) if x.ndim == 2 else y]


KERNELS = {
    ("", "StringNormalizer"): string_normalizer,
}
