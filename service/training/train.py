"""Train the built-in model: seeded, deterministic, on the completion tokens of the synthetic corpus."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from service.engine.config import DecoderConfig
from service.training.agentic import make_agentic_sample
from service.training.config import TrainConfig
from service.training.corpus import Renderer, make_samples
from service.training.drills import make_drills, make_repeats
from service.training.model import Decoder
from service.training.writable import writable_ids

DRILL_SEED_OFFSET = 1_000_003  # the drills' seed: far from the held-out seed (424242) and the corpus's
REPEAT_SEED_OFFSET = 2_000_003  # the repeat drills' seed
INDUCTION_SEED_OFFSET = 3_000_017  # the induction warm-up's lists
AGENTIC_SEED_OFFSET = 4_000_037  # the coding-agent samples (agentic.py)
UNK = 0  # compact index of every id the corpus never uses (inputs only: it is never a target)


@dataclass
class TrainedModel:
    """Weights over the compact vocabulary: compact index i >= 1 is Harmony id vocab_ids[i - 1]."""

    config: TrainConfig
    decoder: DecoderConfig  # compact vocab_size
    weights: dict[str, np.ndarray]
    vocab_ids: np.ndarray  # int32, sorted Harmony ids
    target_ids: np.ndarray  # int32, sorted Harmony ids the model may write
    metrics: dict[str, Any] = field(default_factory=dict)


@dataclass
class Corpus:
    sequences: list[np.ndarray]  # compact ids
    completion_start: list[int]  # index of the first completion token in each sequence
    copied: list[np.ndarray]  # bool per completion token: it writes the tool output's salient value
    vocab_ids: np.ndarray
    target_ids: np.ndarray


def build_corpus(
    seed: int,
    count: int,
    renderer: Renderer | None = None,
    drills: int = 0,
    repeats: int = 0,
    *,
    agentic: int = 0,
    window: int = 0,
    writable: int = 0,
) -> Corpus:
    """The corpus's `count` samples, then the drills and `agentic` coding-agent samples (each from its own seed),
    rendered; the writable ids extended to `writable` (writable.py). Half the agentic samples sit behind a long
    developer prompt of which only the tail is kept, a window and a bit more: with every layer windowed
    (`window` > 0), the trained tokens see what they would see thousands of tokens in."""
    renderer = renderer or Renderer()
    rendered = []
    copied = []
    extra = make_drills(seed + DRILL_SEED_OFFSET, drills) + make_repeats(seed + REPEAT_SEED_OFFSET, repeats)
    tails = [0] * (count + len(extra))
    agent_rng = np.random.default_rng(seed + AGENTIC_SEED_OFFSET)
    for _ in range(agentic):
        long_prompt = window > 0 and agent_rng.random() < 0.5
        tokens = (
            int(agent_rng.integers(window + 600, 3 * window + 600))
            if long_prompt
            else int(agent_rng.choice([0, 0, 80, 200]))
        )
        extra.append(make_agentic_sample(agent_rng, instruction_tokens=tokens).sample)
        tails.append(int(agent_rng.integers(window + 64, 2 * window + 1)) if long_prompt else 0)
    for sample, tail in zip(make_samples(seed, count) + extra, tails, strict=True):
        completion, marks = renderer.marked_completion(sample.completion, sample.salient)
        prompt = renderer.prompt(sample)
        rendered.append((prompt[-tail:] if tail else prompt, completion))
        copied.append(np.array(marks, dtype=bool))
    targets = writable_ids(np.array(sorted({t for _, c in rendered for t in c}), np.int32), writable)
    vocab = sorted({t for p, c in rendered for t in p + c} | set(targets.tolist()))
    index = {tid: i + 1 for i, tid in enumerate(vocab)}
    seqs = [np.array([index[t] for t in p + c], dtype=np.int64) for p, c in rendered]
    starts = [len(p) for p, _ in rendered]
    return Corpus(seqs, starts, copied, np.array(vocab, np.int32), targets)


def _batches(corpus: Corpus, cfg: TrainConfig, rng: np.random.Generator) -> list[list[int]]:
    """One epoch of batches, similar lengths together (less padding), in a seeded order."""
    order = rng.permutation(len(corpus.sequences))
    chunk = cfg.batch_size * 16
    batches: list[list[int]] = []
    for start in range(0, len(order), chunk):
        part = sorted(order[start : start + chunk].tolist(), key=lambda i: len(corpus.sequences[i]))
        batches += [part[j : j + cfg.batch_size] for j in range(0, len(part), cfg.batch_size)]
    return [batches[i] for i in rng.permutation(len(batches))]


def _tensors(
    corpus: Corpus, batch: list[int], cfg: TrainConfig, rng: np.random.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inputs, labels (-100: not trained) and each label's loss weight."""
    n = max(len(corpus.sequences[i]) for i in batch)
    ids = np.zeros((len(batch), n), dtype=np.int64)
    labels = np.full((len(batch), n), -100, dtype=np.int64)
    weights = np.ones((len(batch), n), dtype=np.float32)
    for row, i in enumerate(batch):
        seq, start = corpus.sequences[i], corpus.completion_start[i]
        inp = seq.copy()
        drop = rng.random(start) < cfg.unk_rate
        drop[:2] = False
        inp[:start][drop] = UNK
        ids[row, : len(seq)] = inp
        labels[row, start - 1 : len(seq) - 1] = seq[start:]  # predict each completion token
        weights[row, start - 1 : len(seq) - 1][corpus.copied[i]] = cfg.copy_weight
    return torch.from_numpy(ids), torch.from_numpy(labels), torch.from_numpy(weights)


INDUCTION_BATCH = 64  # lists per induction step: short sequences, so a larger batch costs little
INDUCTION_LENGTHS = (4, 32)  # tokens per list, inclusive


def induction_batch(
    writable: np.ndarray, rng: np.random.Generator, size: int = INDUCTION_BATCH
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random lists of writable compact ids, each written twice; the second copy's tokens but its
    first are trained. Nothing memorised predicts them: only looking up the token that followed the
    current one in the first copy does (an induction head), as the rest of a multi-token number does."""
    lengths = rng.integers(INDUCTION_LENGTHS[0], INDUCTION_LENGTHS[1] + 1, size=size)
    rows = []
    for length in lengths.tolist():
        seq = rng.choice(writable, size=length)
        rows.append((np.concatenate([seq, seq]), length))
    return _ending_in_repeats(rows)


def _ending_in_repeats(rows: list[tuple[np.ndarray, int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids, labels, weights) of sequences that each end in a repeat of `repeat` tokens, zero-padded to the
    longest: each repeat's tokens but its first are the labels (the position before names the next one)."""
    n = max(seq.size for seq, _ in rows)
    ids = np.zeros((len(rows), n), dtype=np.int64)
    labels = np.full((len(rows), n), -100, dtype=np.int64)
    for row, (seq, repeat) in enumerate(rows):
        ids[row, : seq.size] = seq
        labels[row, seq.size - repeat : seq.size - 1] = seq[seq.size - repeat + 1 :]
    return torch.from_numpy(ids), torch.from_numpy(labels), torch.ones((len(rows), n), dtype=torch.float32)


CUED_LENGTHS = (4, 16)  # tokens per list when several are written (train.cued_lists_batch)
CUED_SHARED = 3  # tokens the lists of one sample share
CUED_SHARED_RATE = 0.3  # how often a list's token (but its first) is one of the shared ones


def cued_lists_batch(
    writable: np.ndarray, rng: np.random.Generator, lists: int, size: int = INDUCTION_BATCH
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each sample: 1 to `lists` random lists that share a few tokens, then one of them again, the
    repeat's tokens but its first trained. Its first token starts no other list, so it tells which list
    is repeated; after a shared token, only the tokens before it say what comes next."""
    rows: list[tuple[np.ndarray, int]] = []
    for _ in range(size):
        count = int(rng.integers(1, lists + 1))
        shared = rng.choice(writable, size=CUED_SHARED, replace=False)
        starts = rng.choice(np.setdiff1d(writable, shared), size=count, replace=False)
        written = []
        for start in starts.tolist():
            body = rng.choice(writable, size=int(rng.integers(CUED_LENGTHS[0], CUED_LENGTHS[1] + 1)) - 1)
            swap = rng.random(body.size) < CUED_SHARED_RATE
            body[swap] = rng.choice(shared, size=int(swap.sum()))
            written.append(np.concatenate([[start], body]))
        repeated = written[int(rng.integers(count))]
        rows.append((np.concatenate([*written, repeated]), repeated.size))
    return _ending_in_repeats(rows)


def lists_batch(
    writable: np.ndarray, rng: np.random.Generator, lists: int, size: int = INDUCTION_BATCH
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """An induction step's batch: one list written twice per sample, or cued lists (TrainConfig.induction_lists)."""
    if lists <= 1:
        return induction_batch(writable, rng, size)
    return cued_lists_batch(writable, rng, lists, size)


def induction_accuracy(model: Decoder, writable: np.ndarray, bias: torch.Tensor, seed: int, lists: int = 1) -> float:
    """Greedy next-token accuracy on the trained positions of held-out induction lists."""
    ids, labels, _ = lists_batch(writable, np.random.default_rng(seed), lists, size=256)
    mask = labels != -100
    with torch.no_grad():
        predicted = (model.logits_at(ids, mask) + bias).argmax(-1)
    return float((predicted == labels[mask]).float().mean())


def _loss(
    logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor, cfg: TrainConfig
) -> tuple[torch.Tensor, float]:
    """(the loss to minimise, the plain mean loss over completion tokens, for the progress bar and metrics).

    With a copy weight, each token's loss is scaled by its weight and the sum divided by the number of
    completion tokens (not by the weights' sum): the other tokens train exactly as without weights."""
    flat = logits.view(-1, logits.size(-1))
    if cfg.copy_weight == 1.0:  # the unweighted loss, computed exactly as for the shipped model
        loss = F.cross_entropy(flat, labels.view(-1), ignore_index=-100)
        return loss, loss.item()
    per_token = F.cross_entropy(flat, labels.view(-1), ignore_index=-100, reduction="none")
    count = (labels != -100).sum()
    return (per_token * weights.view(-1)).sum() / count, (per_token.sum() / count).item()


def total_steps(cfg: TrainConfig) -> int:
    """Optimizer steps in all: the warm-up, the corpus's, and the induction steps interleaved with them."""
    interleaved = cfg.steps // cfg.induction_every if cfg.induction_every > 0 else 0
    return cfg.induction_steps + cfg.steps + interleaved


def is_induction_step(step: int, cfg: TrainConfig) -> bool:
    """The warm-up's steps, then every (induction_every + 1)-th step: K corpus steps, one induction step."""
    if step < cfg.induction_steps:
        return True
    k = cfg.induction_every
    return k > 0 and (step - cfg.induction_steps) % (k + 1) == k


def _lr(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up, then cosine decay over every step (induction warm-up and corpus alike)."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    t = (step - cfg.warmup) / max(1, total_steps(cfg) - cfg.warmup)
    return float(cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1 + np.cos(np.pi * min(1.0, t))))


def train(cfg: TrainConfig, *, progress: bool = True, log: Callable[[str], None] = print) -> TrainedModel:
    started = time.monotonic()
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    log(
        f"rendering {cfg.samples} synthetic conversations, {cfg.drills} copy drills, {cfg.repeats} repeat "
        f"drills and {round(cfg.agentic_share * cfg.samples)} coding-agent turns (seed {cfg.seed})"
    )
    corpus = build_corpus(
        cfg.seed,
        cfg.samples,
        drills=cfg.drills,
        repeats=cfg.repeats,
        agentic=round(cfg.agentic_share * cfg.samples),
        window=cfg.attention_window,
        writable=cfg.writable_ids,
    )
    vocab_size = len(corpus.vocab_ids) + 1
    decoder = cfg.decoder(vocab_size)
    max_len = max(len(s) for s in corpus.sequences)
    log(f"compact vocabulary {vocab_size} ids ({len(corpus.target_ids)} writable), longest sequence {max_len}")
    model = Decoder(decoder, max_len=max_len, tie_embeddings=cfg.tie_embeddings)
    # Ids the corpus never writes get no probability mass, in training as in the exported model.
    index = {int(t): i + 1 for i, t in enumerate(corpus.vocab_ids)}
    bias = torch.full((vocab_size,), float("-inf"))
    bias[[index[int(t)] for t in corpus.target_ids]] = 0.0
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    other = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": other, "weight_decay": 0.0}],
        lr=cfg.lr,
        betas=(0.9, 0.95),
    )
    rng = np.random.default_rng(cfg.seed)
    batches: list[list[int]] = []
    smooth: float | None = None
    losses: list[float] = []
    tokens = listed = 0
    writable = np.array([index[int(t)] for t in corpus.target_ids], dtype=np.int64)
    induction_rng = np.random.default_rng(cfg.seed + INDUCTION_SEED_OFFSET)
    held_out_lists = cfg.seed + INDUCTION_SEED_OFFSET + 1  # the lists induction_accuracy measures on
    total = total_steps(cfg)
    bar = tqdm(range(total), desc="training", disable=not progress, unit="step")
    model.train()
    for step in bar:
        listing = is_induction_step(step, cfg)
        if listing:
            lists = 1 if step < cfg.induction_steps else cfg.induction_lists  # the warm-up: one list each
            ids, labels, weights = lists_batch(writable, induction_rng, lists)
        else:
            if not batches:
                batches = _batches(corpus, cfg, rng)
            ids, labels, weights = _tensors(corpus, batches.pop(), cfg, rng)
        for group in opt.param_groups:
            group["lr"] = _lr(step, cfg)
        trained = labels != -100
        logits = model.logits_at(ids, trained) + bias
        loss, value = _loss(logits, labels[trained], weights[trained], cfg)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step + 1 == cfg.induction_steps:
            copied = induction_accuracy(model, writable, bias, held_out_lists)
            log(f"induction warm-up done: held-out lists copied {copied:.1%} token by token")
        if listing:  # the lists' loss and tokens are not the corpus's: kept apart
            listed += int(trained.sum())
            continue
        losses.append(value)
        tokens += int(trained.sum())
        smooth = value if smooth is None else 0.98 * smooth + 0.02 * value
        bar.set_postfix(loss=f"{smooth:.4f}", lr=f"{_lr(step, cfg):.1e}")
    bar.close()
    weights = {name: t.detach().float().numpy().copy() for name, t in model.state_dict().items()}
    metrics = {
        "final_loss": float(np.mean(losses[-50:])),
        "steps": cfg.steps,
        "induction_steps": cfg.induction_steps,
        "induction_every": cfg.induction_every,
        "induction_lists": cfg.induction_lists,
        "induction_copy_accuracy": induction_accuracy(model, writable, bias, held_out_lists, cfg.induction_lists),
        "completion_tokens_trained": tokens,
        "induction_tokens_trained": listed,
        "train_seconds": round(time.monotonic() - started, 1),
        "torch_version": torch.__version__,
    }
    log(f"trained {total} steps in {metrics['train_seconds']}s, loss {metrics['final_loss']:.4f}")
    return TrainedModel(cfg, decoder, weights, corpus.vocab_ids, corpus.target_ids, metrics)
