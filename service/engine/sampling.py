"""Token selection: greedy, or temperature / top-k / top-p with a draw that is a pure function of
(seed, token index), so a resumed run samples exactly what an uninterrupted run would have.

Reported logprobs are from the model's own distribution: log-softmax of the raw logits at
temperature 1, before penalties, top-k/top-p and the constraint mask.

Order of operations: raw logits -> frequency/presence penalties (from the counts of tokens generated
so far) -> constraint mask (an id array or a packed bitmask) -> greedy or temperature/top-k/top-p draw.
A mask that allows few tokens (a grammar, a header) is applied by sampling over the allowed ids alone:
the same distribution in the same id order, so the same draw as masking the whole vocabulary up to
float rounding, and always the same draw for the same inputs (what resume needs).
"""

from __future__ import annotations

import numpy as np

from service.engine.base import AllowedTokens, SamplingParams, TokenBitmask, TokenOutput
from service.engine.compact import UNSEEN_LOGIT

# For top-p, first look for the nucleus among the tokens with at least these fractions of the best
# token's probability; fall back to sorting everything.
_NUCLEUS_CUTOFFS = (1e-3, 1e-6)
_BLOCK = 1024


def draw_uniform(seed: int, token_index: int) -> float:
    """The one uniform number in [0, 1) used to pick token `token_index` of a sequence seeded `seed`."""
    return float(np.random.default_rng([seed % (1 << 64), token_index]).random())


# Constraints hand the same large allowed-id array every step (e.g. "any ordinary token" in a
# Harmony message body): turn each into an additive 0/-inf bias once instead of scattering 200k ids.
# The same array also gets a 0/1 float32 twin: at temperature 1 the draw's weights are the log-softmax's
# exp times it (see sample).
_BIAS_CACHE_MIN = 4096
_bias_cache: dict[tuple[int, bool], tuple[np.ndarray, np.ndarray]] = {}


def _cached_over_vocab(allowed: np.ndarray, vocab: int, flags: bool) -> np.ndarray:
    """Over the whole vocabulary, for the allowed ids: 1/0 (`flags`) or 0/-inf (the additive bias)."""
    key = (id(allowed), flags)
    cached = _bias_cache.get(key)
    if cached is not None and cached[0] is allowed and cached[1].shape[0] == vocab:
        return cached[1]
    out = np.full(vocab, 0.0 if flags else -np.inf, dtype=np.float32)
    out[allowed] = 1.0 if flags else 0.0
    if len(_bias_cache) >= 32:
        _bias_cache.clear()
    _bias_cache[key] = (allowed, out)  # holding `allowed` keeps its id from being reused
    return out


def _mask_bias(allowed: np.ndarray, vocab: int) -> np.ndarray:
    return _cached_over_vocab(allowed, vocab, flags=False)


def _allowed_flags(allowed: AllowedTokens, vocab: int) -> np.ndarray | None:
    """1 (or True) for each allowed id of a whole-vocabulary mask, 0 elsewhere; None for a short id array
    (masked by a copy, see _apply_mask)."""
    if isinstance(allowed, TokenBitmask):
        return bitmask_to_bool(allowed, vocab)
    allowed = np.asarray(allowed, dtype=np.int64)
    return _cached_over_vocab(allowed, vocab, flags=True) if allowed.size >= _BIAS_CACHE_MIN else None


def _exp_shifted(logits: np.ndarray) -> tuple[int, float, np.ndarray]:
    """(argmax, max, exp(logits - max)): the log-softmax's pass over the vocabulary, and at temperature 1
    with nothing penalized also the draw's weights (the same float32 values)."""
    best = int(np.argmax(logits))
    m = float(logits[best])
    e = logits - np.float32(m)
    return best, m, np.exp(e, out=e)  # in place: one fresh vocabulary-sized array, not two


def _top_n(values: np.ndarray, n: int) -> np.ndarray:
    """Indices of the n largest values, best first, ties by lower index (deterministic)."""
    n = min(n, values.shape[0])
    part = np.argpartition(-values, n - 1)[:n] if n < values.shape[0] else np.arange(values.shape[0])
    part = np.sort(part)
    return part[np.argsort(-values[part], kind="stable")]


def _nucleus_threshold(p: np.ndarray, top_p: float) -> float:
    """The probability of the token at which the best-first cumulative mass first reaches top_p.

    Tokens with p >= this form the nucleus (ties at the edge all stay in). The answer is that of a
    float64 running sum over all values sorted best first; the values >= a cutoff are a prefix of that
    order, so when their mass already reaches top_p their (short) sort gives the same answer."""
    target = top_p * float(p.sum(dtype=np.float64))
    best = float(p.max())
    for fraction in _NUCLEUS_CUTOFFS:
        head = p[p >= np.float32(best * fraction)]
        if head.shape[0] * 4 > p.shape[0]:
            break  # a flat distribution: sort everything
        desc = np.sort(head)[::-1]
        mass = np.cumsum(desc, dtype=np.float64)
        if mass[-1] >= target:
            return float(desc[min(int(np.searchsorted(mass, target, side="left")), desc.shape[0] - 1)])
    # Sort the values (not indices), which is cheap even for a 200k vocabulary.
    desc = np.sort(p)[::-1]
    cut = min(int(np.searchsorted(np.cumsum(desc, dtype=np.float64), target, side="left")), desc.shape[0] - 1)
    return float(desc[cut])


def _inverse_cdf(p: np.ndarray, u: float) -> int:
    """The first index whose cumulative weight exceeds u * total, via per-block float64 sums (a float64
    cumsum over the whole vocabulary costs milliseconds). Blocks are _BLOCK long, the last one zero-padded:
    the sums are part of the draw, so their rounding must never change."""
    n = p.shape[0]
    full = n - n % _BLOCK
    sums = p[:full].reshape(-1, _BLOCK).sum(axis=1, dtype=np.float64)
    if full < n:
        tail = np.zeros(_BLOCK, dtype=np.float64)
        tail[: n - full] = p[full:]
        sums = np.append(sums, tail.sum())
    block_cdf = np.cumsum(sums)
    target = u * block_cdf[-1]
    b = min(int(np.searchsorted(block_cdf, target, side="right")), block_cdf.shape[0] - 1)
    before = block_cdf[b - 1] if b > 0 else 0.0
    inner = np.cumsum(p[b * _BLOCK : (b + 1) * _BLOCK], dtype=np.float64) + before
    j = b * _BLOCK + min(int(np.searchsorted(inner, target, side="right")), _BLOCK - 1)
    if j >= n or p[j] == 0.0:  # rounding put the target on a zero-weight tail
        j = int(np.flatnonzero(p[: min(j + 1, n)])[-1]) if np.any(p[: min(j + 1, n)]) else int(np.flatnonzero(p)[0])
    return int(j)


def _choose(logits: np.ndarray, params: SamplingParams, u: float) -> int:
    """Inverse-CDF draw (in token-id order) over the temperature/top-k/top-p filtered distribution."""
    scaled = logits / np.float32(params.temperature)
    return _choose_weights(np.exp(scaled - scaled.max()), params, u)


def _choose_weights(p: np.ndarray, params: SamplingParams, u: float) -> int:
    """The draw from weights exp(scaled - max(scaled)); top-k/top-p zero entries of `p` in place."""
    if 0 < params.top_k < p.shape[0]:
        kth = np.partition(p, p.shape[0] - params.top_k)[p.shape[0] - params.top_k]
        p[p < kth] = 0.0
    if params.top_p < 1.0:
        p[p < _nucleus_threshold(p, params.top_p)] = 0.0
    return _inverse_cdf(p, u)


def apply_penalties(logits: np.ndarray, params: SamplingParams, counts: dict[int, int] | None) -> np.ndarray:
    """OpenAI's presence/frequency penalties over `counts` (token id -> times generated); a new array."""
    if not counts or (params.frequency_penalty == 0.0 and params.presence_penalty == 0.0):
        return logits
    ids = np.fromiter(counts.keys(), dtype=np.int64, count=len(counts))
    times = np.fromiter(counts.values(), dtype=np.float32, count=len(counts))
    out = logits.copy()
    out[ids] -= np.float32(params.presence_penalty) + np.float32(params.frequency_penalty) * times
    return out


def bitmask_to_bool(mask: TokenBitmask, vocab: int) -> np.ndarray:
    """Unpack llguidance's bit layout (little-endian words, bit i = token 32*j+i) to a bool per token."""
    bits = np.unpackbits(np.ascontiguousarray(mask.words, dtype="<u4").view(np.uint8), bitorder="little")
    if bits.shape[0] < vocab:
        bits = np.concatenate([bits, np.zeros(vocab - bits.shape[0], dtype=np.uint8)])
    return bits[:vocab].view(np.bool_)


# When a constraint allows at most this fraction of the vocabulary, sampling runs over the allowed
# ids alone (the same distribution in the same id order, without touching 200k masked-out logits).
_COMPACT_FRACTION = 8


def _compact_ids(allowed: AllowedTokens, vocab: int) -> np.ndarray | None:
    """The sorted allowed ids when they are few (compact path), else None (mask the whole vocabulary)."""
    if isinstance(allowed, TokenBitmask):
        words = np.ascontiguousarray(allowed.words, dtype="<u4")
        nonzero = np.flatnonzero(words)
        if nonzero.size * 32 > 4 * vocab // _COMPACT_FRACTION:  # surely dense: skip the exact count
            return None
        bits = np.unpackbits(words[nonzero].view(np.uint8), bitorder="little").reshape(-1, 32).view(np.bool_)
        ids = (nonzero[:, None] * 32 + np.arange(32))[bits]
        ids = ids[ids < vocab]
    else:
        ids = np.asarray(allowed, dtype=np.int64)
        if ids.size * _COMPACT_FRACTION > vocab:
            return None
        ids = np.unique(ids)
    if ids.size == 0:
        raise ValueError("constraint allows no token")
    return ids if ids.size * _COMPACT_FRACTION <= vocab else None


def _apply_mask(logits: np.ndarray, allowed: AllowedTokens) -> np.ndarray:
    if isinstance(allowed, TokenBitmask):
        keep = bitmask_to_bool(allowed, logits.shape[0])
        if not keep.any():
            raise ValueError("constraint allows no token")
        masked = np.full_like(logits, -np.inf)
        np.copyto(masked, logits, where=keep)
        return masked
    allowed = np.asarray(allowed, dtype=np.int64)
    if allowed.size == 0:
        raise ValueError("constraint allows no token")
    if allowed.size >= _BIAS_CACHE_MIN:
        return np.asarray(logits + _mask_bias(allowed, logits.shape[0]))  # the same values as the copy below, faster
    masked = np.full_like(logits, -np.inf)
    masked[allowed] = logits[allowed]
    return masked


def _keeps(flags: np.ndarray | None, token: int) -> bool:
    return flags is not None and bool(flags[token])


def sample(
    logits: np.ndarray,
    params: SamplingParams,
    token_index: int,
    allowed: AllowedTokens | None = None,
    counts: dict[int, int] | None = None,
    support: np.ndarray | None = None,
) -> TokenOutput:
    """Pick one token from `logits` (vocab,). `allowed` (token ids or a packed bitmask) masks everything
    else out; `counts` (token id -> times generated so far) feeds the frequency/presence penalties.
    `support` (ascending ids) declares that every other id's logit is UNSEEN_LOGIT (a compact head): the draw
    then runs over those ids alone where that is the same distribution (see _narrowed).

    Greedy when temperature == 0. finish_reason is left for the engine to set."""
    if support is not None:
        narrowed = _narrowed(logits, params, allowed, counts, support)
        if narrowed is not None:
            out = _sample(*narrowed, params, token_index)
            return TokenOutput(
                token_id=int(support[out.token_id]),
                logprob=out.logprob,
                top_logprobs=tuple((int(support[i]), lp) for i, lp in out.top_logprobs),
            )
    return _sample(np.asarray(logits, dtype=np.float32), allowed, counts, params, token_index)


# exp(x) is exactly 0 in float32 below about -103.97 (denormals included): a margin past it.
_NO_MASS_MARGIN = 110.0
_narrowed_ids: dict[tuple[int, int], tuple[np.ndarray, np.ndarray, np.ndarray | None]] = {}


def _narrowed(
    logits: np.ndarray,
    params: SamplingParams,
    allowed: AllowedTokens | None,
    counts: dict[int, int] | None,
    support: np.ndarray,
) -> tuple[np.ndarray, AllowedTokens | None, dict[int, int] | None] | None:
    """(logits, allowed, counts) over `support`'s positions, or None where the draw must see the whole vocabulary.

    Over the whole vocabulary an id outside `support` (logit UNSEEN_LOGIT) weighs exp((UNSEEN_LOGIT - m) / T),
    m the best allowed logit: exactly 0 when m is far enough above UNSEEN_LOGIT, and then drawing over the
    support's ids in id order is the same draw (the same weights, in the same order, the zeros left out) and
    the same logprobs (the zeros add nothing to the normalizer). Not so when the mask allows no supported id
    (a grammar forcing a token the model never writes), or asks more top_logprobs than the support holds: the
    whole vocabulary then. A mask of few ids is drawn over those ids already (_compact_ids): left as it is."""
    if support.shape[0] < max(params.top_logprobs, 1):
        return None
    vocab = logits.shape[0]
    if allowed is not None and _compact_ids(allowed, vocab) is not None:
        return None
    narrow_logits = np.asarray(logits, dtype=np.float32)[support]
    narrow_allowed: AllowedTokens | None = None
    keep: np.ndarray | None = None
    if isinstance(allowed, TokenBitmask):
        words = np.ascontiguousarray(allowed.words, dtype="<u4")
        word = support >> 5
        inside = word < words.shape[0]
        keep = np.zeros(support.shape[0], dtype=np.bool_)
        keep[inside] = (words[word[inside]] >> (support[inside] & 31).astype(np.uint32)) & 1 == 1
        narrow_allowed = TokenBitmask(_pack_bits(keep))
    elif allowed is not None:
        ids = np.asarray(allowed)
        key = (id(ids), id(support))
        cached = _narrowed_ids.get(key)
        if cached is None or cached[0] is not ids or cached[1] is not support:
            if len(_narrowed_ids) >= 32:
                _narrowed_ids.clear()
            flags = np.zeros(vocab, dtype=np.bool_)
            flags[ids] = True
            positions = np.flatnonzero(flags[support])
            cached = (ids, support, positions if positions.size else None)
            _narrowed_ids[key] = cached  # holding both arrays keeps their ids from being reused
        if cached[2] is None:
            return None
        narrow_allowed = cached[2]
    narrow_counts = None
    if counts:
        generated = np.fromiter(counts.keys(), dtype=np.int64, count=len(counts))
        at = np.minimum(np.searchsorted(support, generated), support.shape[0] - 1)
        narrow_counts = {int(a): counts[int(i)] for a, i in zip(at, generated, strict=True) if support[a] == i}
    penalized = apply_penalties(narrow_logits, params, narrow_counts)
    if keep is not None:
        if not keep.any():
            return None
        best = float(penalized[keep].max())
    elif isinstance(narrow_allowed, np.ndarray):
        best = float(penalized[narrow_allowed].max())
    else:
        best = float(penalized.max())
    headroom = best - UNSEEN_LOGIT  # of the best allowed logit over every unsupported id's
    if headroom <= 0.0 or (params.temperature > 0.0 and headroom / params.temperature < _NO_MASS_MARGIN):
        return None
    return narrow_logits, narrow_allowed, narrow_counts


def _pack_bits(keep: np.ndarray) -> np.ndarray:
    """llguidance's layout for a bool per token: little-endian uint32 words, bit i of word j = token 32*j+i."""
    padded = np.zeros(-(-keep.shape[0] // 32) * 32, dtype=np.bool_)
    padded[: keep.shape[0]] = keep
    return np.packbits(padded, bitorder="little").view("<u4")


def _sample(
    logits: np.ndarray,
    allowed: AllowedTokens | None,
    counts: dict[int, int] | None,
    params: SamplingParams,
    token_index: int,
) -> TokenOutput:
    raw = logits
    masked = apply_penalties(raw, params, counts)
    penalized = masked is not raw
    subset = _compact_ids(allowed, raw.shape[0]) if allowed is not None else None
    # raw / 1 == raw, so at temperature 1 the draw's weights exp(masked - max(masked)) are exactly e, with 0
    # (exp(-inf)) where a whole-vocabulary mask (a Harmony body's "any ordinary token") rules ids out, as long
    # as it keeps the best token: e times the mask's 0/1 flags, no masked copy of the vocabulary. (A mask that
    # rules the first best id out takes the general path, which computes the same weights.)
    plain = params.temperature == 1.0 and not penalized and subset is None
    want_logprobs = params.logprobs or params.top_logprobs > 0
    lse: float | None = None
    if plain or want_logprobs:  # otherwise (greedy, other temperatures) e serves only the logprob
        best, m, e = _exp_shifted(raw)
        if want_logprobs:
            lse = m + float(np.log(e.sum(dtype=np.float64)))  # before the draw, which may zero entries of e
    flags = _allowed_flags(allowed, raw.shape[0]) if plain and allowed is not None else None
    if plain and (allowed is None or _keeps(flags, best)):
        if flags is not None:
            np.multiply(e, flags, out=e)
        token = _choose_weights(e, params, draw_uniform(params.seed, token_index))
    else:
        if subset is not None:
            masked = masked[subset]  # index j of the subset is token subset[j]
        elif allowed is not None:
            masked = _apply_mask(masked, allowed)
        if params.temperature <= 0.0:
            token = int(np.argmax(masked))
        else:
            token = _choose(masked, params, draw_uniform(params.seed, token_index))
    if subset is not None:
        token = int(subset[token])
    logprob = None if lse is None else float(raw[token]) - lse
    top: tuple[tuple[int, float], ...] = ()
    if lse is not None and params.top_logprobs > 0:
        ids = _top_n(raw, params.top_logprobs)
        top = tuple((int(i), float(raw[i]) - lse) for i in ids)
    return TokenOutput(token_id=token, logprob=logprob, top_logprobs=top)
