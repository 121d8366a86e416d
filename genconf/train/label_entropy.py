"""The entropy of a run's labels' unigram distribution: the loss a model reaches that learns which tokens
are common but nothing from its inputs. `genconf verify` holds a run without a golden curve below it
(genconf.run.loss_rule): a run whose labels are shuffled or misaligned cannot get there.

Computed from the data the run trained on (config.json's `data`): for genconf's synthetic bigram stream
exactly (the expected label distribution over the sequence positions, by propagating the first token's
uniform distribution through the chain), for a token file from the windows the run read.
"""

from __future__ import annotations

import math

import numpy as np

from genconf.train.data import MemmapTokens, SyntheticTokens, source_from

MAX_WINDOWS = 4096
"""Token-file windows read at most (evenly spaced over those the run used)."""


def _entropy_nats(p: np.ndarray) -> float:
    p = p[p > 0]
    return float(-(p * np.log(p)).sum())


def synthetic_label_entropy_nats(source: SyntheticTokens, seq_length: int) -> float:
    """Labels are positions 1..seq of each sample; position 0 is uniform and each step moves through the
    chain's table (one of `branching` successors, uniformly). Exact expected marginal, averaged over positions."""
    v, b = source.states, source.branching
    table = source._table().ravel()
    pi = np.full(v, 1.0 / v)
    total = np.zeros(v)
    for position in range(1, seq_length + 1):
        nxt = np.bincount(table, weights=np.repeat(pi / b, b), minlength=v)
        if np.abs(nxt - pi).sum() < 1e-13:  # converged: the remaining positions all have this distribution
            total += (seq_length - position + 1) * nxt
            break
        pi = nxt
        total += pi
    return _entropy_nats(total / seq_length)


def file_label_entropy_nats(source: MemmapTokens, seq_length: int, num_samples: int, vocab_size: int) -> float:
    """Plug-in entropy of the labels in the windows the run read (at most MAX_WINDOWS of them, evenly spaced),
    with the Miller-Madow correction (+(bins - 1) / 2N) for the plug-in estimate's downward bias."""
    indices = np.unique(np.linspace(0, max(0, num_samples - 1), min(num_samples, MAX_WINDOWS)).astype(np.int64))
    counts = np.zeros(max(vocab_size, 1), dtype=np.int64)
    for i in indices:
        labels = source.sample(int(i), seq_length + 1)[1:]
        counts += np.bincount(labels, minlength=counts.size)[:counts.size]
    n = int(counts.sum())
    bins = int((counts > 0).sum())
    return _entropy_nats(counts / n) + (bins - 1) / (2 * n)


def label_entropy_nats(config: dict) -> float | None:
    """From a run's config.json: the labels' unigram entropy in nats, None when the data cannot be read."""
    data = config.get("data") or {"kind": "synthetic"}
    model, plan, train = config["model"], config["plan"], config["train"]
    vocab, seq = int(model["vocab_size"]), int(plan["seq_length"])
    kind = data.get("kind", "synthetic")
    if kind == "synthetic":
        return synthetic_label_entropy_nats(source_from(data, vocab, int(train.get("seed", 1234))), seq)
    if kind == "memmap":
        try:
            source = MemmapTokens(path=data["path"], dtype=data.get("dtype", "uint16"))
        except Exception:  # the file moved or is unreadable: no floor, the trend test still applies
            return None
        samples = int(plan["gbs"]) * int(train["train_steps"])
        value = file_label_entropy_nats(source, seq, samples, vocab)
        return value if math.isfinite(value) else None
    return None
