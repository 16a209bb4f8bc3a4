"""`model import` against transformers: tiny random Llama (with Llama 3.x RoPE scaling), Mistral (with a sliding
window shorter than the prompts), Qwen2 (q/k/v biases, tied embeddings) and Qwen3 (q/k norms) models saved by
`save_pretrained` as safetensors, imported with no torch involved, give transformers' own logits: fp32 within
1e-4 and the same 32 greedy tokens; int8 the same top-1 token on at least 95% of those steps; int8 decodes
batched bit-identically to batch 1. And a checkpoint served as it is downloaded, through SERVICE_MODEL=HF_DIR
and the official openai client: imported into the model cache on the first start, reused on the second.

Needs torch and transformers: run in the build venv (.venv-train, see .ci/run); without them the module skips
with a message."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tokenizers import Tokenizer

from service.engine.importers import import_checkpoint
from service.engine.onnx_engine import OnnxEngine
from service.prompting.testing_tokenizer import write_tiny_chat_model_tokenizer
from tests.api_helpers import client_for
from tests.conftest import ServerProcess
from tests.engine_fixtures import assert_batch_invariant, greedy, prompt_logits

torch = pytest.importorskip("torch", reason="torch is not installed: run in the build venv (.venv-train; .ci/run)")
transformers = pytest.importorskip("transformers", reason="transformers is not installed: run in .venv-train")

SHAPE = {
    "vocab_size": 1000,  # tests.engine_fixtures.prompt draws ids below 1000
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
}
LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
}
FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("Llama", {"rope_scaling": LLAMA3, "rope_theta": 500_000.0}),
    "mistral": ("Mistral", {"sliding_window": 16}),  # shorter than the prompts below: the window matters
    "qwen2": ("Qwen2", {"tie_word_embeddings": True}),
    "qwen3": ("Qwen3", {"head_dim": 32}),  # heads * head_dim != hidden, as in Qwen3-0.6B
}
PROMPTS = [[5], [17, 230, 4, 999, 12, 88, 301], list(range(40, 640, 14))]
STEPS = 32


@dataclass
class Imported:
    model: Any  # the transformers model (torch is optional: untyped)
    fp32: Path
    int8: Path


def save_random(model_type: str, out: Path, **config: Any) -> Any:
    """A random transformers model of `model_type`, norms and biases moved away from 1 and 0 (fresh ones would
    not test the mapping), saved with save_pretrained (safetensors)."""
    torch.manual_seed(0)
    name, extra = FAMILIES[model_type]
    config_cls = getattr(transformers, f"{name}Config")
    model_cls = getattr(transformers, f"{name}ForCausalLM")
    cfg = config_cls(**{"tie_word_embeddings": False, **SHAPE, **extra, **config}, attn_implementation="eager")
    model = model_cls(cfg).eval()
    with torch.no_grad():
        for param_name, param in model.named_parameters():
            param.add_(torch.randn_like(param) * (0.2 if "norm" in param_name or "bias" in param_name else 0.03))
    model.save_pretrained(out)
    assert sorted(p.name for p in out.glob("*.safetensors")) == ["model.safetensors"]
    return model


@pytest.fixture(scope="module", params=list(FAMILIES))
def imported(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Imported:
    tmp = tmp_path_factory.mktemp(request.param)
    model = save_random(request.param, tmp / "checkpoint")
    fp32 = import_checkpoint(tmp / "checkpoint", tmp / "fp32", bits=32)
    return Imported(model, fp32, import_checkpoint(tmp / "checkpoint", tmp / "int8"))


def reference_logits(model: Any, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        return np.asarray(model(torch.tensor([ids])).logits[0, -1].float().numpy())


def reference_greedy(model: Any, ids: list[int], steps: int = STEPS) -> list[int]:
    """transformers' greedy continuation, each step a full forward (no cache to differ by)."""
    tokens = list(ids)
    for _ in range(steps):
        tokens.append(int(reference_logits(model, tokens).argmax()))
    return tokens[len(ids) :]


def engine_greedy(model_dir: Path, ids: list[int], steps: int = STEPS) -> list[int]:
    eng = OnnxEngine(model_dir, intra_op_threads=1)
    eng.add_sequence("s", ids, greedy(steps))
    return [out.token_id for _ in range(steps) for out in eng.step().values()]


def test_an_fp32_import_gives_transformers_logits_and_greedy_tokens(imported: Imported) -> None:
    for ids in PROMPTS:
        want = reference_logits(imported.model, ids)
        np.testing.assert_allclose(prompt_logits(imported.fp32, ids), want, rtol=0, atol=1e-4)
    ids = PROMPTS[1]
    assert engine_greedy(imported.fp32, ids) == reference_greedy(imported.model, ids)


def test_an_int8_import_agrees_on_the_top_token(imported: Imported) -> None:
    """Along transformers' greedy path (teacher-forced: each step from the reference's tokens so far)."""
    ids = PROMPTS[1]
    path = reference_greedy(imported.model, ids)
    agree = [int(prompt_logits(imported.int8, ids + path[:step]).argmax()) == token for step, token in enumerate(path)]
    assert sum(agree) / len(agree) >= 0.95, agree


def test_an_int8_import_decodes_batched_bit_identically(imported: Imported) -> None:
    assert_batch_invariant(imported.int8)


def test_a_checkpoint_is_served_through_service_model(tmp_path: Path) -> None:
    """SERVICE_MODEL names the checkpoint directory as downloaded (weights, config, tokenizer with its chat
    template, generation config): the first start imports it into the model cache, the second reuses it."""
    src, cache = tmp_path / "Qwen2.5-tiny-Instruct", tmp_path / "cache"
    vocab = write_tiny_chat_model_tokenizer(src)
    end = Tokenizer.from_file(str(src / "tokenizer.json")).token_to_id("<|im_end|>")
    save_random("qwen2", src, vocab_size=vocab, eos_token_id=end, bos_token_id=None, max_position_embeddings=1024)
    (src / "generation_config.json").write_text(json.dumps({"eos_token_id": [end], "do_sample": False}))
    logs = []
    for start in range(2):
        log = tmp_path / f"server-{start}.log"
        server = ServerProcess(
            f"sqlite+aiosqlite:///{tmp_path / 'service.db'}",
            log,
            log_level="info",
            SERVICE_MODEL=str(src),
            SERVICE_MODEL_CACHE=str(cache),
        ).start(timeout=180)
        try:
            client = client_for(server.url)
            assert [m.id for m in client.models.list().data] == ["Qwen2.5-tiny-Instruct"]
            response = client.responses.create(model="Qwen2.5-tiny-Instruct", input="Hello", max_output_tokens=8)
            assert response.status in ("completed", "incomplete") and response.output[0].type == "message"
            assert response.usage is not None and response.usage.output_tokens > 0
        finally:
            server.stop()
        logs.append(log.read_text())
    assert "imported into" in logs[0] and "imported before" not in logs[0]
    assert "imported before" in logs[1] and "imported into" not in logs[1]
    (imported_dir,) = [p for p in cache.iterdir() if p.name.startswith("imported-")]
    assert (imported_dir / "tokenizer_config.json").is_file() and not list(imported_dir.glob("*.safetensors"))
