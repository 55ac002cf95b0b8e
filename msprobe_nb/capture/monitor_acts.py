"""One step's queued blocks as the monitor commits them: activations seen several times in the step become one
row each (numpy only, on the host copies)."""
from __future__ import annotations

from collections.abc import Iterator

import numpy as np

__all__ = ["combined"]


def combined(layout: list, host: list[np.ndarray], float_stats: list[str]) -> Iterator[tuple]:
    """(kind, names, extra, host arrays) per block; activations seen several times in the step (a module
    called twice, micro-batches) become one row: their aggregates as if the outputs were concatenated."""
    acts: dict[str, list] = {}
    for kind, names, extra, slots in layout:
        arrays = {k: host[i] for k, i in slots.items()}
        if kind in ("act", "act_grad"):
            acts.setdefault(kind, []).append((names, extra, arrays))
        else:
            yield kind, names, extra, arrays
    for kind, blocks in acts.items():
        names = [n for b in blocks for n in b[0]]
        numel = np.concatenate([b[1]["numel"] for b in blocks]).astype(np.float64)
        fl = np.concatenate([b[2]["floats"] for b in blocks]).astype(np.float64)
        co = np.concatenate([b[2]["counts"] for b in blocks]) if "counts" in blocks[0][2] else None
        order = list(dict.fromkeys(names))
        at = {n: i for i, n in enumerate(order)}
        idx = np.fromiter((at[n] for n in names), np.int64, len(names))
        k = len(order)
        out = np.zeros((k, len(float_stats)))
        for j, s in enumerate(float_stats):
            col = fl[:, j]
            if s == "norm":
                acc = np.zeros(k)
                np.add.at(acc, idx, col ** 2)
                out[:, j] = np.sqrt(acc)
            elif s == "min":
                acc = np.full(k, np.inf)
                np.minimum.at(acc, idx, col)
                out[:, j] = acc
            elif s == "max":
                acc = np.full(k, -np.inf)
                np.maximum.at(acc, idx, col)
                out[:, j] = acc
            else:  # mean, weighted by the number of values
                acc, n = np.zeros(k), np.zeros(k)
                np.add.at(acc, idx, col * numel)
                np.add.at(n, idx, numel)
                out[:, j] = acc / n
        arrays = {"floats": out}
        if co is not None:
            cacc = np.zeros((k, co.shape[1]), np.int64)
            np.add.at(cacc, idx, co)
            arrays["counts"] = cacc
        tot = np.zeros(k, np.int64)
        np.add.at(tot, idx, numel.astype(np.int64))
        yield kind, order, {"numel": tot}, arrays
