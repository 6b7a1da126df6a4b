"""Prompt lookup: propose the tokens that followed the latest earlier occurrence of the
sequence's last n tokens (n from prompt_lookup_max down to prompt_lookup_min).

Answers that repeat their input (summaries, edits, extraction, code) continue what appeared
before, so the tokens after an earlier match are likely the next ones; proposing them costs
no model.
"""

from __future__ import annotations

import numpy as np


def propose_ngram(token_ids: list[int], k: int, n_max: int, n_min: int) -> list[int]:
    """Up to k tokens following the latest earlier occurrence of the longest suffix of
    token_ids of n_max..n_min tokens; [] when none recurs."""
    if k < 1 or len(token_ids) < n_min + 1:
        return []
    tokens = np.asarray(token_ids, dtype=np.int64)
    for n in range(min(n_max, len(tokens) - 1), n_min - 1, -1):
        suffix = tokens[-n:]
        # Windows starting at 0..len-n-1: every occurrence that ends before the suffix does.
        windows = np.lib.stride_tricks.sliding_window_view(tokens[:-1], n)
        hits = np.flatnonzero((windows == suffix).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n
            return tokens[start:start + k].tolist()
    return []
