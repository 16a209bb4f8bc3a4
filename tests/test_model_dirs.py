"""Model directories a user gets from the CLI or brings along, served as they are: `build-random`
(Harmony vocabulary by default), `model quantize` (int8 copy with the tokenizer and configs, written
atomically, refusing an already-int8 model) and an onnxruntime-genai build (genai_config.json, no
config.json)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from service.engine.base import SamplingParams
from service.engine.builder import build_random_decoder
from service.engine.config import (
    HARMONY_VOCAB_SIZE,
    INT8_PER_ROW,
    DecoderConfig,
    ModelMeta,
    default_int8_block,
    read_config,
    write_config,
)
from service.engine.onnx_engine import OnnxEngine
from service.engine.shapes import SHAPES, shape_config
from service.prompting.testing_tokenizer import write_tiny_chat_model_tokenizer
from tests.api_helpers import assert_well_formed_stream, client_for, final_text, text_from_deltas
from tests.cli_helpers import assert_one_line_error, run_cli
from tests.conftest import ROOT, ServerProcess
from tests.engine_fixtures import SMALL

# What build-random and quantize write when no --block-size is given: chosen for this CPU (default_int8_block).
DEFAULT_SCHEME = "rows_int8" if default_int8_block() == INT8_PER_ROW else "matmulnbits_int8"
TOKENIZER_FILES = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"}


@pytest.fixture(scope="module")
def random_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """`build-random` int8, `build-random --fp32`, and `model quantize` of the latter, all through the CLI;
    and the same two int8 ways per row (`--block-size row`)."""
    root = tmp_path_factory.mktemp("random")
    dirs = {name: root / name for name in ("int8", "fp32", "quantized", "row", "row-quantized")}
    for args in (
        ["build-random", str(dirs["int8"])],
        ["build-random", "--fp32", str(dirs["fp32"])],
        ["build-random", "--block-size", "row", str(dirs["row"])],
    ):
        result = run_cli("model", *args)
        assert result.returncode == 0, result.stderr
    result = run_cli("model", "quantize", str(dirs["fp32"]), str(dirs["quantized"]))
    assert result.returncode == 0, result.stderr
    assert DEFAULT_SCHEME in result.stdout
    result = run_cli("model", "quantize", "--block-size", "row", str(dirs["fp32"]), str(dirs["row-quantized"]))
    assert result.returncode == 0, result.stderr
    assert "rows_int8" in result.stdout
    return dirs


def greedy(model_dir: Path, prompt: list[int], n: int = 12) -> list[tuple[int, float | None]]:
    engine = OnnxEngine(model_dir, intra_op_threads=1)
    engine.add_sequence("s", prompt, SamplingParams(max_new_tokens=n, temperature=0.0, top_logprobs=1))
    out = []
    while engine.active_sequence_ids():
        token = engine.step()["s"]
        out.append((token.token_id, token.logprob))
    return out


def test_every_shape_is_on_the_harmony_vocabulary_by_default() -> None:
    for shape in SHAPES:
        config = shape_config(shape)
        assert config.vocab_size == HARMONY_VOCAB_SIZE == 201_088
        assert shape_config(shape, "native") == SHAPES[shape]
    assert shape_config("qwen2.5-0.5b", "native").vocab_size == 151_936


def test_build_random_writes_a_harmony_model(random_dirs: dict[str, Path]) -> None:
    meta = read_config(random_dirs["int8"])
    assert meta.decoder.vocab_size == HARMONY_VOCAB_SIZE and meta.extra["chat_format"] == "harmony"
    assert meta.extra["quantization"]["scheme"] == DEFAULT_SCHEME
    assert read_config(random_dirs["fp32"]).extra["quantization"] is None


def test_quantizing_an_fp32_build_gives_the_int8_build(random_dirs: dict[str, Path]) -> None:
    """The contrib graph is quantized with the scheme build-random uses: same tokens, same logprobs."""
    prompt = [200006, 1428, 200008, 12194, 200007, 200006]
    assert greedy(random_dirs["quantized"], prompt) == greedy(random_dirs["int8"], prompt)
    fp32 = read_config(random_dirs["fp32"])
    quantized = read_config(random_dirs["quantized"])
    assert quantized.decoder == fp32.decoder
    assert quantized.extra == {**fp32.extra, "quantization": read_config(random_dirs["int8"]).extra["quantization"]}


def test_build_random_and_quantized_models_serve_as_they_are(
    random_dirs: dict[str, Path], tmp_path: Path, server_factory: Callable[..., ServerProcess]
) -> None:
    texts = {}
    database_url = f"sqlite+aiosqlite:///{tmp_path / 'service.db'}"  # the model is under test, not the store
    for name in ("int8", "quantized", "row", "row-quantized"):
        server = server_factory(database_url, SERVICE_MODEL=str(random_dirs[name])).start()
        client = client_for(server.url)
        assert [m.id for m in client.models.list().data] == ["random-tiny"]
        response = client.responses.create(input="Hello", max_output_tokens=16, extra_body={"seed": 5})
        assert response.status in ("completed", "incomplete") and response.usage is not None
        assert response.usage.output_tokens > 0
        texts[name] = final_text(response.model_dump(mode="json"))
        if name == "row":  # streamed too: the same run's text, delta by delta
            stream = client.responses.create(input="Hello", max_output_tokens=16, stream=True, extra_body={"seed": 5})
            events = [event.model_dump(mode="json") for event in stream]
            assert_well_formed_stream(events)
            assert text_from_deltas(events) == texts[name]
        server.stop()
    # The same int8 weights: the same tokens, however the model was made.
    assert texts["int8"] and texts["int8"] == texts["quantized"]
    assert texts["row"] and texts["row"] == texts["row-quantized"]


def test_quantize_refuses_an_int8_model_and_writes_nothing(random_dirs: dict[str, Path], tmp_path: Path) -> None:
    before = sorted(random_dirs["int8"].iterdir())
    result = run_cli("model", "quantize", str(random_dirs["int8"]), str(tmp_path / "again"))
    op = "MatMulIntegerToFloat" if DEFAULT_SCHEME == "rows_int8" else "MatMulNBits"
    assert_one_line_error(result, "quantized already", op)
    assert list(tmp_path.iterdir()) == [] and sorted(random_dirs["int8"].iterdir()) == before
    result = run_cli("model", "quantize", str(random_dirs["fp32"]), str(random_dirs["quantized"]))
    assert_one_line_error(result, "already exists")


@pytest.fixture(scope="module")
def chat_fp32_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A user's fp32 export in the standard layout, with a tokenizer.json and a chat template."""
    model_dir = tmp_path_factory.mktemp("chat") / "fp32"
    vocab_size = write_tiny_chat_model_tokenizer(model_dir)
    config = DecoderConfig(**{**SMALL.to_dict(), "vocab_size": vocab_size, "max_position": 1024, "eos_token_id": 2})
    build_random_decoder(model_dir, config, seed=3, quantize=False, graph="standard", extra={"model_id": "chatml"})
    (model_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": 2}))
    return model_dir


def test_quantize_keeps_the_tokenizer_and_the_result_serves(
    chat_fp32_dir: Path, tmp_path: Path, database_url: str, server_factory: Callable[..., ServerProcess]
) -> None:
    dst = tmp_path / "int8"
    result = run_cli("model", "quantize", str(chat_fp32_dir), str(dst))
    assert result.returncode == 0, result.stderr
    assert TOKENIZER_FILES | {"generation_config.json", "config.json", "model.onnx"} == {p.name for p in dst.iterdir()}
    for name in TOKENIZER_FILES:
        assert (dst / name).read_bytes() == (chat_fp32_dir / name).read_bytes()
    assert read_config(dst).extra["quantization"]["weight_type"] == "int8"
    server = server_factory(database_url, SERVICE_MODEL=str(dst)).start()
    client = client_for(server.url)
    events = [e.model_dump() for e in client.responses.create(input="Hi", max_output_tokens=12, stream=True)]
    assert_well_formed_stream(events)
    assert final_text(events[-1]["response"]) == text_from_deltas(events)


def test_an_interrupted_quantize_leaves_no_destination(random_dirs: dict[str, Path], tmp_path: Path) -> None:
    dst = tmp_path / "int8"
    process = subprocess.Popen(  # the 200 MB fp32 model: quantizing it takes seconds
        [sys.executable, "-m", "service", "model", "quantize", str(random_dirs["fp32"]), str(dst)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not list(tmp_path.glob(".int8.*.partial")):  # the work directory beside DST
        assert process.poll() is None and time.monotonic() < deadline, "quantize ended before it was interrupted"
        time.sleep(0.005)
    time.sleep(0.3)  # well inside the quantization
    assert process.poll() is None, "quantize ended before it was interrupted"
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode in (130, -signal.SIGINT), stderr  # a shell reports both as 130
    assert "Traceback" not in stderr and stderr.strip().splitlines()[-1] == "interrupted"
    assert list(tmp_path.iterdir()) == []


@pytest.fixture(scope="module")
def genai_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What onnxruntime-genai's model builder writes: model.onnx (GroupQueryAttention, MatMulNBits int8,
    shared past/present buffers), genai_config.json, tokenizer.json and tokenizer_config.json with a
    chat template; no config.json."""
    model_dir = tmp_path_factory.mktemp("genai") / "tiny-genai"
    vocab_size = write_tiny_chat_model_tokenizer(model_dir)
    eos = Tokenizer.from_file(str(model_dir / "tokenizer.json")).token_to_id("<|im_end|>")
    config = DecoderConfig(**{**SMALL.to_dict(), "vocab_size": vocab_size, "max_position": 512})
    build_dir = tmp_path_factory.mktemp("genai-build") / "m"
    build_random_decoder(build_dir, config, seed=11, quantize=True, graph="contrib")
    (build_dir / "model.onnx").rename(model_dir / "model.onnx")
    genai_config = {
        "model": {
            "bos_token_id": 0,
            "context_length": config.max_position,
            "decoder": {
                "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
                "filename": "model.onnx",
                "head_size": config.head_dim,
                "hidden_size": config.hidden_size,
                "inputs": {
                    "input_ids": "input_ids",
                    "attention_mask": "attention_mask",
                    "past_key_names": "past_key_values.%d.key",
                    "past_value_names": "past_key_values.%d.value",
                },
                "outputs": {
                    "logits": "logits",
                    "present_key_names": "present.%d.key",
                    "present_value_names": "present.%d.value",
                },
                "num_attention_heads": config.num_heads,
                "num_hidden_layers": config.num_layers,
                "num_key_value_heads": config.num_kv_heads,
            },
            "eos_token_id": [eos, 1],
            "pad_token_id": 1,
            "type": "qwen2",
            "vocab_size": vocab_size,
        },
        "search": {
            "diversity_penalty": 0.0,
            "do_sample": False,
            "early_stopping": True,
            "length_penalty": 1.0,
            "max_length": config.max_position,
            "min_length": 0,
            "no_repeat_ngram_size": 0,
            "num_beams": 1,
            "num_return_sequences": 1,
            "past_present_share_buffer": True,
            "repetition_penalty": 1.0,
            "temperature": 1.0,
            "top_k": 1,
            "top_p": 1.0,
        },
    }
    (model_dir / "genai_config.json").write_text(json.dumps(genai_config, indent=4))
    assert not (model_dir / "config.json").exists()
    return model_dir


def test_genai_config_is_read(genai_dir: Path) -> None:
    meta = read_config(genai_dir)
    assert meta.decoder.num_layers == SMALL.num_layers and meta.decoder.max_position == 512
    assert meta.stop_token_ids[1] == 1 and meta.extra["kv_cache"] == "shared_buffer"
    engine = OnnxEngine(genai_dir, intra_op_threads=1)
    assert engine.layout.shared_buffer
    assert engine.layout.past_names[:2] == ["past_key_values.0.key", "past_key_values.0.value"]
    result = run_cli("model", "info", str(genai_dir))
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    assert info["format"] == "onnxruntime-genai" and info["op_counts"]["MatMulNBits"] > 0


def test_a_genai_build_serves_without_hand_written_files(
    genai_dir: Path, database_url: str, server_factory: Callable[..., ServerProcess]
) -> None:
    before = sorted(p.name for p in genai_dir.iterdir())
    server = server_factory(database_url, SERVICE_MODEL=str(genai_dir)).start()
    client = client_for(server.url)
    assert [m.id for m in client.models.list().data] == ["tiny-genai"]
    response = client.responses.create(input="Hello", instructions="Be brief.", max_output_tokens=20)
    assert [item.type for item in response.output] == ["message"] and response.usage is not None
    events = [e.model_dump() for e in client.responses.create(input="Stream", max_output_tokens=20, stream=True)]
    assert_well_formed_stream(events)
    assert final_text(events[-1]["response"]) == text_from_deltas(events)
    follow = client.responses.create(input="More", previous_response_id=response.id, max_output_tokens=5)
    assert follow.usage is not None and follow.usage.input_tokens > response.usage.input_tokens
    assert sorted(p.name for p in genai_dir.iterdir()) == before  # nothing written into the user's directory


def test_bad_model_directories_are_one_line(tmp_path: Path) -> None:
    assert_one_line_error(run_cli("model", "info", str(tmp_path / "missing")), "missing", "not a directory")
    assert_one_line_error(run_cli("model", "info", str(tmp_path)), "no .onnx file")
    (tmp_path / "model.onnx").write_bytes(b"not a graph")
    (tmp_path / "genai_config.json").write_text('{"model": {}}')
    assert_one_line_error(run_cli("model", "info", str(tmp_path)), "genai_config.json does not describe a decoder")
    (tmp_path / "genai_config.json").unlink()
    write_config(tmp_path, ModelMeta(SMALL, {"chat_format": "harmony"}))
    assert_one_line_error(run_cli("model", "info", str(tmp_path)), "model.onnx is not an ONNX graph")
