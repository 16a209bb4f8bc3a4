"""Training configuration (no torch here: the CLI reads the defaults without the train extra)."""

from __future__ import annotations

from dataclasses import dataclass

from service.engine.config import DecoderConfig


@dataclass(frozen=True)
class TrainConfig:
    seed: int = 1
    samples: int = 16_000
    steps: int = 2400
    batch_size: int = 16
    lr: float = 3e-3
    min_lr: float = 1e-4
    warmup: int = 100
    weight_decay: float = 0.01
    hidden_size: int = 128
    num_layers: int = 3
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 32
    intermediate_size: int = 384
    unk_rate: float = 0.01  # prompt tokens replaced by UNK, so unseen user text is not out of distribution
    threads: int = 1
    # Loss weight of the completion tokens that write a tool output's salient value (in the analysis
    # and the final answer). 1.0 (off) trains every completion token alike: the shipped model's loss.
    # 8.0 was tried once (docs/models.md, model card): tool value 44.6% vs 41.5%, tool decision 82.0% vs 87.3%.
    copy_weight: float = 1.0
    # Copy drills added to the corpus (drills.make_drills: lookups in a user turn, after-tool contrast
    # pairs), drawn from their own seed; 0 trains on the corpus alone.
    drills: int = 0
    # Repeat drills (drills.make_repeats: random numbers listed, then repeated back in order): short
    # samples that train the continuation copy of multi-token numbers; 0 trains without them.
    repeats: int = 0
    # Train the output head tied to the input embedding (one table). The exported model stays untied (the
    # head is a copy of the table): serving is unchanged. Tied, a copy circuit maps a token's embedding to
    # its own logit for every token at once, which an untied head must learn row by row.
    tie_embeddings: bool = False
    # Steps of an induction warm-up before the corpus (train.induction_batch: random lists of writable
    # tokens written twice, the second copy trained): the "what followed this token last time" circuit
    # that copying a multi-token number needs, taught alone first; 0 starts on the corpus.
    induction_steps: int = 0
    # After the warm-up, one more induction step after every K corpus steps (extra steps: the corpus still
    # gets `steps`), so that the list copy is kept while the corpus is learnt; 0: none.
    induction_every: int = 0
    # Lists per interleaved induction sample (the warm-up always writes one list twice: cued lists from
    # the start did not form the circuit in 800 steps). 1: one list written twice. K > 1: up to K lists
    # that share a few tokens, then one of them again, cued by its first token (no other list starts with
    # it); a shared token's successor then follows only from the tokens before it, as a number's digits
    # after a "." that other numbers in the context hold too.
    induction_lists: int = 1
    # Every layer attends to the last `attention_window` positions (the engine's sliding window): trained on
    # prompts of a few thousand tokens, the model computes the same at any position, so it serves
    # `max_position` tokens; the corpus's prompts (under 400 tokens) see all of theirs. 0: full attention
    # over a 4,096-token context (the shipped model).
    attention_window: int = 0
    max_position: int = 16384
    # The ids the model may write: the corpus's, then the standard library's most frequent (writable.py) up
    # to this many, so that arguments could copy names and commands it never saw in training; 0: the
    # corpus's alone (the shipped model). docs/models.md: 16,384 were tried and the copy did not form.
    writable_ids: int = 0
    # Codex-shaped coding-agent samples (agentic.py), as a share of `samples`, half of them behind a long
    # developer prompt (with a window set); 0: none (the shipped model).
    agentic_share: float = 0.0

    def decoder(self, vocab_size: int) -> DecoderConfig:
        return DecoderConfig(
            vocab_size=vocab_size,
            hidden_size=self.hidden_size,
            num_layers=self.num_layers,
            num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            intermediate_size=self.intermediate_size,
            max_position=self.max_position if self.attention_window else 4096,
            rope_theta=10000.0,
            rms_norm_eps=1e-5,
            tie_embeddings=False,
            attention_window=self.attention_window,
            bos_token_id=199998,
            eos_token_id=200002,
        )


DEFAULT_TRAIN_CONFIG = TrainConfig()
