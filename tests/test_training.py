"""The training corpus agrees with serving token for token; a smoke training run (needs torch: the
`train` extra, installed in .venv-train by .ci/run) trains, exports and serves a tiny model."""

from __future__ import annotations

import importlib.util
import json
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from service.engine.base import SamplingParams
from service.engine.compact import load_compact, sha256_file
from service.engine.config import read_config
from service.engine.model_dir import HARMONY_VOCAB_SIZE
from service.engine.onnx_engine import OnnxEngine
from service.training.config import TrainConfig
from service.training.corpus import Renderer, make_samples
from service.training.drills import make_drills, make_repeats
from service.training.stats import number_tokens, rarest_token_counts, salient_number_counts
from tests.corpus_helpers import started_items

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
    samples = make_samples(11, 30)
    assert {s.kind for s in samples} == {"answer", "call", "after_tool"}
    for sample in samples:
        prompt = renderer.prompt(sample)
        assert prompt == fmt.render(sample.request)  # the server's own rendering
        completion = renderer.completion(sample.completion)
        started = started_items(fmt, sample.request, completion)
        assert completion[-1] in fmt.stop_token_ids()
        kinds = [c.kind for c in started]
        if sample.kind == "call":
            assert kinds == ["reasoning", "function_call"] and started[1].name == sample.tool
        else:
            assert kinds == ["reasoning", "message"]


def test_copy_drills_render_as_served_and_contrast_pairs_differ_only_in_the_tool_output() -> None:
    renderer = Renderer()
    drills = make_drills(7, 60)
    assert len(drills) == 60 and {d.kind for d in drills} == {"answer", "after_tool"}
    for drill in drills:
        assert renderer.prompt(drill) == renderer.fmt.render(drill.request)
        assert renderer.completion(drill.completion)[-1] in renderer.fmt.stop_token_ids()
    lookups = [d for d in drills if d.kind == "answer"]
    for drill in lookups:  # the answer copies one of the numbers the user stated
        content = drill.request.items[-1]["content"]
        user = content if isinstance(content, str) else content[0]["text"]
        number = re.search(r"-?\d+(?:[.:]\d+)?", drill.completion[-1].text)
        assert number is not None
        assert f" {number.group()}." in user or f" {number.group()} " in user
    after = [d for d in drills if d.kind == "after_tool"]
    pairs = [(a, b) for a, b in zip(after, after[1:], strict=False) if a.request.items[:-1] == b.request.items[:-1]]
    assert len(pairs) >= 5
    for a, b in pairs:
        assert a.request.items[-1]["output"] != b.request.items[-1]["output"] or a.salient == b.salient
        assert a.salient is not None and b.salient is not None
        assert a.salient in a.completion[-1].text and b.salient in b.completion[-1].text
    assert make_samples(1, 50) == make_samples(1, 50)  # drills draw from their own generator


def test_repeat_drills_answer_with_the_users_numbers_in_order() -> None:
    renderer = Renderer()
    repeats = make_repeats(3, 40)
    assert repeats == make_repeats(3, 40) and len({r.request.items[0]["content"][0]["text"] for r in repeats}) == 40
    for drill in repeats:
        assert renderer.prompt(drill) == renderer.fmt.render(drill.request) and not drill.request.tools
        assert renderer.completion(drill.completion)[-1] in renderer.fmt.stop_token_ids()
        user = drill.request.items[0]["content"][0]["text"]
        listed = user.split(": ", 1)[1]
        assert len(re.findall(r"-?\d+", listed)) >= 2
        assert drill.completion[-1].channel == "final" and listed + "." in drill.completion[-1].text


def test_the_copy_mask_marks_exactly_the_tool_value_tokens() -> None:
    renderer = Renderer()
    decode = renderer.fmt.encoding.decode
    after_tool = [s for s in make_samples(11, 200) if s.kind == "after_tool"]
    assert {s.salient.isdigit() for s in after_tool if s.salient} == {True, False}  # numbers and words
    for sample in make_samples(11, 200):
        ids, marks = renderer.marked_completion(sample.completion, sample.salient)
        assert ids == renderer.completion(sample.completion)
        if sample.kind != "after_tool":
            assert not any(marks)
            continue
        value = sample.salient or ""
        # Each marked run of tokens decodes to the value (a leading space aside), once in the analysis and
        # at least once in the final answer, and no other token is marked.
        runs: list[list[int]] = []
        run: list[int] = []
        for tid, marked in zip(ids, marks, strict=True):
            if marked:
                run.append(tid)
            elif run:
                runs, run = [*runs, run], []
        assert len(runs) >= 2 and [decode(r).strip() for r in runs] == [value] * len(runs)
        final = len(renderer.text(sample.completion[-1].text))
        final_start = ids.index(renderer.ret) - final  # the final message's text ends just before <|return|>
        assert sum(marks) == sum(len(r) for r in runs)
        assert any(marks[:final_start]) and any(marks[final_start:])  # in the analysis and in the answer
    # Text that is not ASCII takes the prefix-decoding path.
    text = "Zürich is 12 degrees in Zürich."
    body = renderer.text(text)
    pieces = [decode([t]) for t, m in zip(body, renderer.value_marks(text, body, "Zürich"), strict=True) if m]
    assert "".join(pieces).split() == ["Zürich", "Zürich"]


@needs_torch
def test_the_copy_weight_scales_only_the_value_tokens_loss() -> None:
    import torch

    from service.training.train import _loss, _tensors, build_corpus

    corpus = build_corpus(11, 40)
    batch = [i for i, c in enumerate(corpus.copied) if c.any()][:3]
    assert batch
    cfg = replace(TINY, copy_weight=8.0)
    ids, labels, weights = _tensors(corpus, batch, cfg, np.random.default_rng(0))
    assert int((weights == 8.0).sum()) == sum(int(corpus.copied[i].sum()) for i in batch)
    assert bool((labels[weights == 8.0] != -100).all())
    logits = torch.randn(*ids.shape, len(corpus.vocab_ids) + 1)
    weighted, plain = _loss(logits, labels, weights, cfg)
    unweighted, same = _loss(logits, labels, weights, replace(cfg, copy_weight=1.0))
    assert plain == pytest.approx(same) == pytest.approx(unweighted.item())
    per_token = torch.nn.functional.cross_entropy(
        logits.view(-1, logits.size(-1)), labels.view(-1), ignore_index=-100, reduction="none"
    )
    count = int((labels != -100).sum())
    expected = (per_token.sum() + 7.0 * per_token[weights.view(-1) == 8.0].sum()) / count
    assert weighted.item() == pytest.approx(expected.item(), rel=1e-5)


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


@needs_torch
def test_a_head_trained_tied_is_exported_as_a_copy_of_the_embedding(tmp_path: Path) -> None:
    from service.training.export import write_artifact
    from service.training.train import train

    tied = train(replace(TINY, steps=2, tie_embeddings=True, repeats=8), progress=False, log=lambda _msg: None)
    np.testing.assert_array_equal(tied.weights["lm_head.weight"], tied.weights["model.embed_tokens.weight"])
    untied = train(replace(TINY, steps=2), progress=False, log=lambda _msg: None)
    assert not np.array_equal(untied.weights["lm_head.weight"], untied.weights["model.embed_tokens.weight"])
    manifest = json.loads(write_artifact(tied, tmp_path / "tied").read_text())
    assert manifest["training"]["tie_embeddings"] is True and manifest["training"]["repeats"] == 8
    assert manifest["decoder"]["tie_embeddings"] is False  # served as an untied graph: the engine is unchanged


@needs_torch
def test_induction_lists_are_written_twice_and_only_the_predictable_repeat_is_trained() -> None:
    from service.training.train import INDUCTION_LENGTHS, induction_batch

    writable = np.arange(10, 60, dtype=np.int64)
    ids, labels, weights = induction_batch(writable, np.random.default_rng(0), size=32)
    assert ids.shape == labels.shape == weights.shape and ids.shape[0] == 32
    for row_ids, row_labels in zip(ids.numpy(), labels.numpy(), strict=True):
        trained = np.flatnonzero(row_labels != -100)
        length = len(trained) + 1  # the repeat's first token is not predictable, so not trained
        assert INDUCTION_LENGTHS[0] <= length <= INDUCTION_LENGTHS[1]
        first, second = row_ids[:length], row_ids[length : 2 * length]
        assert set(first.tolist()) <= set(writable.tolist())
        np.testing.assert_array_equal(first, second)
        np.testing.assert_array_equal(trained, np.arange(length, 2 * length - 1))
        np.testing.assert_array_equal(row_labels[trained], second[1:])  # each label is the next input token
    again, _, _ = induction_batch(writable, np.random.default_rng(0), size=32)
    np.testing.assert_array_equal(ids.numpy(), again.numpy())


@needs_torch
def test_cued_lists_repeat_one_list_named_by_its_first_token_and_train_only_the_repeat() -> None:
    from service.training.train import CUED_LENGTHS, cued_lists_batch, induction_batch, lists_batch

    writable = np.arange(10, 400, dtype=np.int64)
    ids, labels, _ = cued_lists_batch(writable, np.random.default_rng(0), 4, size=48)
    counts = []
    for row_ids, row_labels in zip(ids.numpy(), labels.numpy(), strict=True):
        trained = np.flatnonzero(row_labels != -100)
        repeat = row_ids[trained[0] : trained[-1] + 2]  # input positions: a label is the next one's token
        np.testing.assert_array_equal(row_labels[trained], repeat[1:])  # each label is the next input token
        assert CUED_LENGTHS[0] <= repeat.size <= CUED_LENGTHS[1]
        written = row_ids[: trained[0]].tolist()
        starts = [i for i, token in enumerate(written) if token == repeat[0]]
        assert starts and written[starts[0] : starts[0] + repeat.size] == repeat.tolist()
        assert (row_ids[trained[-1] + 2 :] == 0).all()  # padding only after it
        counts.append(len(written) > repeat.size)
    assert any(counts) and not all(counts), "samples with one list and with several"
    again, _, _ = cued_lists_batch(writable, np.random.default_rng(0), 4, size=48)
    np.testing.assert_array_equal(ids.numpy(), again.numpy())
    # One list per sample is the plain induction batch, draw for draw (the shipped model's training).
    plain, _, _ = lists_batch(writable, np.random.default_rng(3), 1, size=8)
    np.testing.assert_array_equal(plain.numpy(), induction_batch(writable, np.random.default_rng(3), size=8)[0].numpy())


@needs_torch
def test_an_induction_warm_up_trains_before_the_corpus_and_is_measured() -> None:
    from service.training.train import train

    cfg = replace(TINY, steps=2, induction_steps=3)
    first = train(cfg, progress=False, log=lambda _msg: None)
    again = train(cfg, progress=False, log=lambda _msg: None)
    for name, w in first.weights.items():
        np.testing.assert_array_equal(w, again.weights[name], err_msg=name)
    plain = train(replace(TINY, steps=2), progress=False, log=lambda _msg: None)
    assert not np.array_equal(first.weights["lm_head.weight"], plain.weights["lm_head.weight"])
    assert 0.0 <= first.metrics["induction_copy_accuracy"] <= 1.0
    assert first.metrics["steps"] == 2 and first.metrics["induction_steps"] == 3


@needs_torch
def test_interleaved_induction_steps_come_after_every_k_corpus_steps_and_add_to_them() -> None:
    from service.training.train import is_induction_step, total_steps

    cfg = replace(TINY, steps=6, induction_steps=2, induction_every=3)
    schedule = [is_induction_step(step, cfg) for step in range(total_steps(cfg))]
    assert schedule == [True, True, False, False, False, True, False, False, False, True]
    assert schedule.count(False) == cfg.steps  # the corpus gets all its steps
    plain = replace(TINY, steps=6)
    assert total_steps(plain) == 6 and not any(is_induction_step(s, plain) for s in range(6))

    from service.training.train import train

    model = train(replace(TINY, steps=4, induction_steps=1, induction_every=2), progress=False, log=lambda _m: None)
    assert model.metrics["induction_every"] == 2 and model.metrics["induction_tokens_trained"] > 0
    assert np.isfinite(model.metrics["final_loss"])
    cued_cfg = replace(TINY, steps=2, induction_steps=1, induction_every=1, induction_lists=3)
    cued = train(cued_cfg, progress=False, log=lambda _m: None)  # the interleaved steps write cued lists
    assert cued.metrics["induction_lists"] == 3 and 0.0 <= cued.metrics["induction_copy_accuracy"] <= 1.0
    single = train(replace(cued_cfg, induction_lists=1), progress=False, log=lambda _m: None)
    assert not np.array_equal(cued.weights["lm_head.weight"], single.weights["lm_head.weight"])


def test_train_builtin_options_parse_into_the_training_configuration() -> None:
    import argparse

    from service.training.cli import add_train_builtin

    parser = argparse.ArgumentParser()
    add_train_builtin(parser.add_subparsers())
    args = parser.parse_args(
        ["train-builtin", "out", "--tie-embeddings", "--repeats", "6", "--lr", "0.001", "--induction-steps", "5"]
        + ["--induction-lists", "4"]
    )
    assert (args.tie_embeddings, args.repeats, args.lr, args.drills, args.induction_steps) == (True, 6, 0.001, 0, 5)
    assert args.induction_lists == 4
    assert parser.parse_args(["train-builtin", "out"]).tie_embeddings is False


@needs_torch
def test_the_trainers_sliding_window_is_the_engines() -> None:
    """A position attends to the last `attention_window` positions, itself included, as the engine's reference
    forward (and GroupQueryAttention's local_window_size) computes it; a sequence no longer than the window is
    plain causal attention."""
    import torch

    from service.engine.weights import reference_forward
    from service.training.model import Decoder, window_mask

    window = 5
    config = replace(TINY, attention_window=window).decoder(40)
    torch.manual_seed(0)
    model = Decoder(config, max_len=32)
    ids = np.random.default_rng(0).integers(1, 40, size=17)
    with torch.no_grad():
        logits = model(torch.from_numpy(ids).view(1, -1))[0].double().numpy()
    weights = {name: t.detach().double().numpy() for name, t in model.state_dict().items()}
    np.testing.assert_allclose(logits, reference_forward(config, weights, ids), atol=1e-4)
    unwindowed = reference_forward(replace(config, attention_window=0), weights, ids)
    assert not np.allclose(logits[window:], unwindowed[window:], atol=1e-4)  # the window changes later positions
    np.testing.assert_allclose(logits[:window], unwindowed[:window], atol=1e-4)
    assert window_mask(window, window) is None and window_mask(window + 1, window) is not None


@needs_torch
def test_a_windowed_agentic_training_with_a_large_vocabulary_exports_a_model_that_serves_long_prompts(
    tmp_path: Path,
) -> None:
    """The options of issue 41's model: a sliding window, a 16k context, writable ids from the standard library,
    coding-agent samples (some behind a long prompt, kept from its tail): trained, exported, and served past the
    window and past the old 4,096-token context."""
    from service.training.agentic import make_agentic_sample
    from service.training.export import export
    from service.training.train import build_corpus, train

    cfg = replace(TINY, attention_window=64, writable_ids=3000, agentic_share=0.5, steps=2)
    decoder = cfg.decoder(100)
    assert decoder.attention_window == 64 and decoder.max_position == 16384
    assert TrainConfig().decoder(100).max_position == 4096  # full attention keeps the shipped model's context
    corpus = build_corpus(cfg.seed, cfg.samples, agentic=12, window=64, writable=3000)
    assert corpus.target_ids.size == 3000 and len(corpus.sequences) == cfg.samples + 12
    tails = [start for start in corpus.completion_start[cfg.samples :] if start <= 2 * 64]
    assert tails  # the long prompts are cut to their last window and a bit
    model = train(cfg, progress=False, log=lambda _msg: None)
    _, onnx_dir = export(model, tmp_path / "out")
    assert read_config(onnx_dir).decoder.attention_window == 64
    engine = OnnxEngine(onnx_dir, intra_op_threads=1)
    assert engine.max_context == 16384
    renderer = Renderer()
    request = make_agentic_sample(np.random.default_rng(2), instruction_tokens=5000).sample.request
    prompt = renderer.fmt.render(request)
    assert len(prompt) > 4096
    engine.add_sequence("s", prompt, SamplingParams(max_new_tokens=4, seed=1))
    out = []
    while engine.active_sequence_ids():
        out += [t.token_id for t in engine.step().values()]
    assert len(out) == 4 and set(out) <= set(model.target_ids.tolist())
