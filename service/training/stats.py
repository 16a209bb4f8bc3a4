"""A cheap proxy for how well the model can copy tool values: how often the training corpus shows each
number token as a tool output's salient value (before training, no model needed).

A value is copied token by token, so what matters is its rarest token. The held-out prompts' numeric
values are scored by that rarest token's count in the training corpus.

    python -m service.training.stats [--samples 16000] [--seed 1] [--held-out-seed 424242]
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from typing import Any

import numpy as np

from service.training.corpus import make_samples
from service.training.sample import Sample
from service.vocab import load_harmony


def number_tokens(value: str) -> list[int]:
    """The token ids of `value` that are digits (o200k writes digits in groups of one to three)."""
    enc = load_harmony()
    return [t for t in enc.encode(value, allowed_special=set()) if enc.decode([t]).strip().isdigit()]


def salient_number_counts(samples: list[Sample]) -> Counter[int]:
    """How often each number token occurs in the salient values of the samples' tool outputs."""
    counts: Counter[int] = Counter()
    for sample in samples:
        if sample.kind == "after_tool" and sample.salient is not None:
            counts.update(number_tokens(sample.salient))
    return counts


def rarest_token_counts(train: list[Sample], held_out: list[Sample]) -> list[int]:
    """For each held-out numeric salient value, the training count of its rarest number token."""
    counts = salient_number_counts(train)
    rarest: list[int] = []
    for sample in held_out:
        if sample.kind == "after_tool" and sample.salient is not None and (tokens := number_tokens(sample.salient)):
            rarest.append(min(counts[t] for t in tokens))
    return rarest


def report(seed: int, samples: int, held_out_seed: int, held_out: int) -> dict[str, Any]:
    train = make_samples(seed, samples)
    counts = salient_number_counts(train)
    rarest = np.array(rarest_token_counts(train, make_samples(held_out_seed, held_out)))
    enc = load_harmony()
    return {
        "distinct_number_tokens": len(counts),
        "longest_number_token_digits": max((len(enc.decode([t]).strip()) for t in counts), default=0),
        "held_out_numeric_values": int(rarest.size),
        "rarest_token_count_median": float(np.median(rarest)) if rarest.size else None,
        "rarest_token_count_min": int(rarest.min()) if rarest.size else None,
        "share_rarest_at_most_5": round(float((rarest <= 5).mean()), 3) if rarest.size else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--samples", type=int, default=16_000)
    parser.add_argument("--held-out-seed", type=int, default=424242)
    parser.add_argument("--held-out", type=int, default=300)
    args = parser.parse_args()
    print(json.dumps(report(args.seed, args.samples, args.held_out_seed, args.held_out), indent=2))


if __name__ == "__main__":
    main()
