"""The training corpus agrees with serving token for token; a smoke training run (needs torch: the
`train` extra, installed in .venv-train by .ci/run) trains, exports and serves a tiny model."""

from __future__ import annotations

import importlib.util
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from service.engine.base import SamplingParams, TokenBitmask
from service.engine.compact import load_compact, sha256_file
from service.engine.config import read_config
from service.engine.model_dir import HARMONY_VOCAB_SIZE
from service.engine.onnx_engine import OnnxEngine
from service.engine.sampling import bitmask_to_bool
from service.prompting.base import ItemStarted
from service.training.config import TrainConfig
from service.training.corpus import Renderer, make_samples
from service.training.stats import number_tokens, rarest_token_counts, salient_number_counts

HAS_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = pytest.mark.skipif(
    not HAS_TORCH, reason="torch is not installed: the smoke training runs in .venv-train (pip install '.[train]')"
)
TINY = TrainConfig(
    seed=3, samples=24, steps=4, batch_size=4, warmup=2, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1,
    head_dim=16, intermediate_size=64, threads=1,
)  # fmt: skip


def test_completions_are_what_the_server_constrains_and_parses() -> None:
    renderer = Renderer()
    fmt = renderer.fmt
    samples = make_samples(11, 60)
    assert {s.kind for s in samples} == {"answer", "call", "after_tool"}
    for sample in samples:
        prompt = renderer.prompt(sample)
        assert prompt == fmt.render(sample.request)  # the server's own rendering
        completion = renderer.completion(sample.completion)
        constraint = fmt.constraint_for(sample.request)
        parser = fmt.new_parser()
        started = []
        for token in completion:
            allowed = constraint.allowed_token_ids()
            if isinstance(allowed, TokenBitmask):
                assert bitmask_to_bool(allowed, token + 1)[token]
            else:
                assert allowed is None or token in set(allowed.tolist())
            constraint.accept(token)
            started += [c for c in parser.feed(token) if isinstance(c, ItemStarted)]
        assert completion[-1] in fmt.stop_token_ids()
        kinds = [c.kind for c in started]
        if sample.kind == "call":
            assert kinds == ["reasoning", "function_call"] and started[1].name == sample.tool
        else:
            assert kinds == ["reasoning", "message"]


def test_held_out_prompts_differ_from_training_prompts() -> None:
    train = {json.dumps(s.request.items) for s in make_samples(1, 300)}
    held_out = [json.dumps(s.request.items) for s in make_samples(424242, 300)]
    assert sum(h in train for h in held_out) < 30  # only short generic turns repeat


def test_the_number_token_proxy_counts_tool_values_by_their_rarest_token() -> None:
    enc = Renderer().fmt.encoding
    assert number_tokens("42.07 and 642") == [enc.encode(n)[0] for n in ("42", "07", "642")]
    train, held_out = make_samples(1, 3000), make_samples(424242, 300)
    counts = salient_number_counts(train)
    numeric = [s for s in held_out if s.kind == "after_tool" and number_tokens(s.salient or "")]
    rarest = rarest_token_counts(train, held_out)
    assert len(rarest) == len(numeric) > 0
    for sample, count in zip(numeric, rarest, strict=True):
        assert count == min(counts[t] for t in number_tokens(sample.salient or ""))
    # The shipped corpus writes prices and rates with three-digit tokens: some held-out ones never occur.
    assert any(len(enc.decode([t])) == 3 for t in counts) and min(rarest) == 0


@needs_torch
def test_smoke_training_is_deterministic_and_exports_a_servable_model(tmp_path: Path) -> None:
    from service.training.export import export
    from service.training.train import train

    first = train(TINY, progress=False, log=lambda _msg: None)
    again = train(TINY, progress=False, log=lambda _msg: None)
    assert first.weights.keys() == again.weights.keys()
    for name, w in first.weights.items():
        np.testing.assert_array_equal(w, again.weights[name], err_msg=name)
    assert np.isfinite(first.metrics["final_loss"])

    manifest_path, onnx_dir = export(first, tmp_path / "out")
    manifest = json.loads(manifest_path.read_text())
    artifact = manifest_path.parent / manifest["artifact"]
    assert sha256_file(artifact) == manifest["sha256"]
    assert manifest["training"]["steps"] == TINY.steps
    compact = load_compact(artifact, manifest["sha256"])
    assert compact.weights["model.embed_tokens.weight"].shape == (compact.vocab_ids.size + 1, TINY.hidden_size)

    meta = read_config(onnx_dir)
    assert meta.decoder.vocab_size == HARMONY_VOCAB_SIZE and meta.extra["chat_format"] == "harmony"
    engine = OnnxEngine(onnx_dir, intra_op_threads=1)
    renderer = Renderer()
    sample = make_samples(5, 1)[0]
    engine.add_sequence("s", renderer.prompt(sample), SamplingParams(max_new_tokens=8, seed=1))
    out = []
    while engine.active_sequence_ids():
        out += [t.token_id for t in engine.step().values()]
    allowed = set(compact.target_ids.tolist())
    assert out and all(t in allowed for t in out)  # ids the model never wrote get no probability mass


@needs_torch
def test_the_same_weights_are_written_with_the_same_hash(tmp_path: Path) -> None:
    from service.training.export import write_artifact
    from service.training.train import train

    model = train(replace(TINY, steps=1), progress=False, log=lambda _msg: None)
    a = json.loads(write_artifact(model, tmp_path / "a").read_text())["sha256"]
    b = json.loads(write_artifact(model, tmp_path / "b").read_text())["sha256"]
    assert a == b
