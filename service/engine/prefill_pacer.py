"""How many prompt tokens an engine step prefills while other sequences are decoding.

A step that prefills part of a newcomer's prompt delays every decoding stream's next token by that part's
time. The token budget (SERVICE_PREFILL_CHUNK_TOKENS) bounds the part in tokens, which on a small CPU and
a large model still means most of a second: a 128-token prompt on the Qwen2.5-0.5B shape fits the
default budget of 256 whole, and costs the running streams ~0.5–1.4 s on two AVX2 cores. With a ratio
set, the pacer also bounds it in time while anyone decodes: a step's prefill costs about `ratio` decode
steps, from the measured seconds of a decode step and of a prompt token. A stream's longest token gap
then stays within about (1 + ratio) times its usual one, and a newcomer takes a few more steps to its
first token. Alone (nobody decoding) a newcomer gets the whole token budget.

Only the chunking changes, never what is sampled: on graphs that may be cut anywhere every chunk
boundary gives the same bits, and the fixed chunk grid of other graphs does not depend on the budget
(OnnxEngine._next_run).
"""

from __future__ import annotations

# Off by default (SERVICE_PREFILL_STALL_RATIO): a trade, measured in docs/configuration.md. With a few streams it
# roughly halves their longest gaps for ~20% on a newcomer's first token; when newcomers keep waiting (a
# saturated server), every step then carries its share of prefill and fewer runs decode together.
DEFAULT_STALL_RATIO = 0.0
# Below this, a prefill run costs mostly its read of the weights (as a decode step does): smaller runs
# would stall the streams about as long for much less of the prompt.
MIN_PREFILL_RUN = 32
_SMOOTHING = 0.5  # weight of the newest measure (decode steps grow and shrink with the batch)


class PrefillPacer:
    """Measures decode steps and prefill runs, and says how many prompt tokens a step may prefill."""

    def __init__(self, ratio: float, *, floor: int = MIN_PREFILL_RUN) -> None:
        self.ratio = ratio  # 0: the token budget alone
        self.floor = floor
        self.decode_seconds: float | None = None  # one decode run of the whole batch
        self.prefill_seconds_per_token: float | None = None
        self.paced_steps = 0  # steps whose prefill the pacer held below the token budget (a metric)

    def observe_decode(self, seconds: float) -> None:
        self.decode_seconds = _smooth(self.decode_seconds, seconds)

    def observe_prefill(self, tokens: int, seconds: float) -> None:
        if tokens >= 2:  # a replayed token (a 1-token run) costs what a decode step does, not a prompt token
            self.prefill_seconds_per_token = _smooth(self.prefill_seconds_per_token, seconds / tokens)

    def budget(self, tokens: int, *, decoding: bool) -> int:
        """Prompt tokens this step may prefill, `tokens` being the token budget."""
        if not decoding or self.ratio <= 0 or self.decode_seconds is None or not self.prefill_seconds_per_token:
            return tokens
        paced = max(self.floor, int(self.ratio * self.decode_seconds / self.prefill_seconds_per_token))
        if paced >= tokens:
            return tokens
        self.paced_steps += 1
        return paced


def _smooth(previous: float | None, value: float) -> float:
    return value if previous is None else previous + _SMOOTHING * (value - previous)
