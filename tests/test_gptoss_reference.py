"""gpt-oss against transformers' fp32 forward: a tiny random GptOssConfig with the real structure.

Several experts with top-k routing, attention sinks, a sliding window smaller than the context used
here (decoding runs past 4x the window), YaRN rotary scaling. Greedy tokens and every step's logits
of our graph (fp32) and of onnxruntime-genai's export (fp32) must match transformers to
LOGITS_ATOL; the quantized graphs (int8 dense + int8 or int4 experts) report top-1 agreement.

Needs torch and transformers, which live in the build venv (.venv-train, see .ci/run): without
them the module skips with a message.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: run in the build venv (.venv-train; .ci/run)")
transformers = pytest.importorskip("transformers", reason="transformers is not installed: run in .venv-train")

from service.engine.base import SamplingParams  # noqa: E402
from service.engine.config import DecoderConfig  # noqa: E402
from service.engine.gptoss import GptOssSpec  # noqa: E402
from service.engine.graph_gptoss import write_gptoss_model  # noqa: E402
from service.engine.onnx_engine import OnnxEngine  # noqa: E402
from tests.engine_fixtures import prefilled_logits  # noqa: E402

WINDOW = 8
PROMPT = [5 + (7 * i) % 500 for i in range(12)]  # longer than the window: prefill crosses it too
NEW_TOKENS = 3 * WINDOW  # 12 + 24 = 36 positions > 4x the window
LOGITS_ATOL = 1e-4  # fp32 vs fp32: observed ~1e-7
REPORT = Path(__file__).resolve().parent.parent / "bench" / "results" / "gptoss_reference.json"


def _hf_config() -> Any:
    return transformers.GptOssConfig(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=4,  # sliding, full, sliding, full
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        num_local_experts=6,
        num_experts_per_tok=2,
        sliding_window=WINDOW,
        max_position_embeddings=256,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 150000.0,
            "factor": 32.0,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "original_max_position_embeddings": 4096,
            "truncate": False,
        },
        eos_token_id=1,
        bos_token_id=2,
    )


@pytest.fixture(scope="module")
def hf_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    torch.manual_seed(0)
    config = _hf_config()
    config._attn_implementation = "eager"
    model = transformers.GptOssForCausalLM(config).eval()
    with torch.no_grad():  # the default init leaves sinks and biases near zero: make them matter
        for name, param in model.named_parameters():
            if "sinks" in name or name.endswith("bias"):
                param.normal_(0.0, 0.5)
    out = tmp_path_factory.mktemp("hf-gptoss")
    model.save_pretrained(out)
    return model, out


def _ours(model: Any, out: Path, expert_bits: int | None) -> Path:
    hf = model.config.to_dict()
    config = DecoderConfig.from_dict(hf)
    spec = GptOssSpec.from_hf(hf)
    spec = GptOssSpec(**{**spec.__dict__, "expert_bits": expert_bits})
    weights = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    return write_gptoss_model(out, config, spec, weights, quantize_dense=expert_bits is not None)


def _greedy_run(model_dir: Path) -> tuple[list[int], np.ndarray]:
    engine = OnnxEngine(model_dir, intra_op_threads=1)
    engine.add_sequence("a", PROMPT, SamplingParams(max_new_tokens=NEW_TOKENS, temperature=0.0))
    tokens: list[int] = []
    logits: list[np.ndarray] = []
    while engine.active_sequence_ids():
        logits.append(prefilled_logits(engine, "a").copy())
        tokens.append(engine.step()["a"].token_id)
    return tokens, np.stack(logits)


def _reference_logits(model: Any, tokens: list[int]) -> np.ndarray:
    with torch.no_grad():
        out = model(torch.tensor([PROMPT + tokens])).logits[0].numpy()
    return np.asarray(out[len(PROMPT) - 1 : len(PROMPT) - 1 + len(tokens)])


def test_fp32_graph_matches_transformers(hf_model: tuple[Any, Path], tmp_path: Path) -> None:
    model, _ = hf_model
    tokens, logits = _greedy_run(_ours(model, tmp_path / "fp32", None))
    ref = _reference_logits(model, tokens)
    assert len(tokens) == NEW_TOKENS and len(PROMPT) + NEW_TOKENS > 4 * WINDOW
    assert np.abs(ref - logits).max() < LOGITS_ATOL
    assert tokens == [int(t) for t in ref.argmax(-1)]  # transformers' greedy choice at every step


def test_genai_builder_export_matches_transformers(hf_model: tuple[Any, Path], tmp_path: Path) -> None:
    """onnxruntime-genai's model builder exports gpt-oss for CPU in fp32 (int4/int8 need MXFP4 weights)."""
    pytest.importorskip("onnxruntime_genai", reason="onnxruntime-genai is not installed")
    pytest.importorskip("onnx_ir", reason="onnx_ir (the builder's dependency) is not installed")
    model, hf_dir = hf_model
    _save_tokenizer(hf_dir)
    out = tmp_path / "genai"
    cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-m", str(hf_dir), "-i", str(hf_dir)]
    cmd += ["-o", str(out), "-p", "fp32", "-e", "cpu", "-c", str(tmp_path / "cache")]
    subprocess.run(cmd, check=True, capture_output=True)
    assert json.loads((out / "genai_config.json").read_text())["model"]["type"] == "gptoss"
    tokens, logits = _greedy_run(out)
    ref = _reference_logits(model, tokens)
    assert np.abs(ref - logits).max() < LOGITS_ATOL
    assert tokens == [int(t) for t in ref.argmax(-1)]


def test_genai_int4_export_from_mxfp4_tensors_serves_batched(hf_model: tuple[Any, Path], tmp_path: Path) -> None:
    """`-p int4 -e cpu` needs the original checkpoint's MXFP4 expert tensors (*_blocks, *_scales):
    given random ones, the builder writes QMoE int4 experts that the engine loads and batches exactly."""
    pytest.importorskip("onnxruntime_genai", reason="onnxruntime-genai is not installed")
    pytest.importorskip("onnx_ir", reason="onnx_ir (the builder's dependency) is not installed")
    from safetensors.torch import load_file, save_file

    from service.engine.info import model_info

    model, hf_dir = hf_model
    ckpt = tmp_path / "mxfp4"
    ckpt.mkdir()
    for path in hf_dir.iterdir():
        (ckpt / path.name).write_bytes(path.read_bytes())
    _save_tokenizer(ckpt)
    tensors = load_file(str(ckpt / "model.safetensors"))
    c = model.config
    h, inter = c.hidden_size, c.intermediate_size
    gen = torch.Generator().manual_seed(1)
    for layer in range(c.num_hidden_layers):
        p = f"model.layers.{layer}.mlp.experts."
        for name, n, k in (("gate_up_proj", 2 * inter, h), ("down_proj", h, inter)):
            e = c.num_local_experts
            tensors[p + name + "_blocks"] = torch.randint(0, 256, (e, n, k // 32, 16), generator=gen, dtype=torch.uint8)
            tensors[p + name + "_scales"] = torch.full((e, n, k // 32), 124, dtype=torch.uint8)  # e8m0: 2^-3
    save_file(tensors, str(ckpt / "model.safetensors"), metadata={"format": "pt"})
    out = tmp_path / "genai-int4"
    cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-m", str(ckpt), "-i", str(ckpt)]
    subprocess.run([*cmd, "-o", str(out), "-p", "int4", "-e", "cpu", "-c", str(tmp_path / "cache")], check=True)
    info = model_info(out)
    assert info["mixture_of_experts"]["expert_op"] == "QMoE" and info["mixture_of_experts"]["expert_bits"] == 4
    assert info["attention"]["window_sized_cache_layers"] == [0, 2]

    def run(prompts: dict[str, list[int]]) -> dict[str, list[int]]:
        engine = OnnxEngine(out, intra_op_threads=1)
        for key, ids in prompts.items():
            engine.add_sequence(key, ids, SamplingParams(max_new_tokens=3 * WINDOW, temperature=1.0, seed=3))
        got: dict[str, list[int]] = {}
        while engine.active_sequence_ids():
            for key, token in engine.step().items():
                got.setdefault(key, []).append(token.token_id)
        return got

    alone = run({"x": PROMPT})
    assert run({"y": PROMPT[:3], "x": PROMPT})["x"] == alone["x"]


@pytest.mark.parametrize("bits", [8, 4])
def test_quantized_top1_agreement_is_reported(hf_model: tuple[Any, Path], tmp_path: Path, bits: int) -> None:
    """Teacher-forced over the fp32 greedy sequence: how often the quantized model's top-1 agrees."""
    model, _ = hf_model
    tokens, _ = _greedy_run(_ours(model, tmp_path / "fp32", None))
    ref = _reference_logits(model, tokens)
    engine = OnnxEngine(_ours(model, tmp_path / f"q{bits}", bits), intra_op_threads=1)
    engine.add_sequence("a", PROMPT, SamplingParams(max_new_tokens=NEW_TOKENS + 1, temperature=0.0))
    prefilled_logits(engine, "a")
    quant = []
    for token in tokens:
        quant.append(engine._seqs["a"].logits.copy())
        engine._forward(engine._seqs["a"], [token])  # feed the fp32 model's token, not our own choice
    agreement = float((np.stack(quant).argmax(-1) == ref.argmax(-1)).mean())
    error = float(np.abs(np.stack(quant) - ref).max())
    scale = float(np.abs(ref).max())
    figures = {"top1_agreement": agreement, "max_abs_logit_error": error, "max_abs_logit": scale}
    _report(f"int8 dense + int{bits} experts", figures)
    print(f"int{bits} experts: top-1 agreement {agreement:.3f} over {len(tokens)} positions, max |dlogit| {error:.4f}")
    assert agreement >= 0.5  # a broken graph (wrong layout, wrong routing) agrees at chance (1/512)


def _report(name: str, figures: dict[str, float]) -> None:
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    data = json.loads(REPORT.read_text()) if REPORT.exists() else {}
    data[name] = {**figures, "positions": NEW_TOKENS, "window": WINDOW}
    REPORT.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def _save_tokenizer(out: Path) -> None:
    """The builder saves the checkpoint's tokenizer: a word-level one over the tiny vocabulary."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(512)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", eos_token="t1").save_pretrained(out)
