"""The int8 block size option (`--block-size` on `model build-random` and `model quantize`): written into
every MatMulNBits node and config.json, the same model whichever way it is made, still batch-invariant,
refused clearly where it has no meaning, and by default (`auto`) per row, for the QGEMM of the CPU that builds the
model."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest

from service.engine.builder import build_random_decoder
from service.engine.config import INT8_BLOCK_SIZE, INT8_PER_ROW, default_int8_block, int8_layout_label, read_config
from service.engine.cpu import cpu_features
from service.engine.model_files import find_model_file
from service.engine.quantize import quantize_model
from tests.cli_helpers import assert_one_line_error, run_cli
from tests.engine_fixtures import (
    SEED,
    SMALL,
    assert_batch_invariant,
    contrib_fp32_dir,
    prompt,
    prompt_logits,
    small_fp32_dir,
)

__all__ = ["contrib_fp32_dir", "small_fp32_dir"]

BLOCK = 64  # SMALL's hidden size: one block per row of the attention projections, two for the MLP's down


def _blocks(model_dir: Path) -> set[int]:
    graph = onnx.load(str(find_model_file(model_dir)), load_external_data=False).graph
    nodes = [n for n in graph.node if n.op_type == "MatMulNBits"]
    assert nodes
    return {a.i for n in nodes for a in n.attribute if a.name == "block_size"}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_random_decoder(tmp_path_factory.mktemp("b64") / "m", SMALL, SEED, quantize=True, block=BLOCK)


def test_the_block_size_is_in_every_node_and_in_config_json(built: Path) -> None:
    assert _blocks(built) == {BLOCK}
    assert read_config(built).extra["quantization"]["block_size"] == BLOCK


def test_the_default_is_per_row_for_the_qgemm_of_the_cpu(contrib_fp32_dir: Path, tmp_path: Path) -> None:
    """Per row on every CPU (faster prefill and batched decode than blocks, with VNNI and without), built for the
    u8s8 QGEMM where the CPU has VNNI and for u8u8 elsewhere; the import cache names the u8u8 build apart."""
    assert default_int8_block() == INT8_PER_ROW
    plain = dataclasses.replace(cpu_features(), avx512_vnni=False, avx_vnni=False, amx_int8=False)
    for vnni in (
        dataclasses.replace(plain, avx512_vnni=True),
        dataclasses.replace(plain, avx_vnni=True),
        dataclasses.replace(plain, amx_int8=True),
    ):
        assert vnni.row_int8_qgemm == "u8s8" and int8_layout_label(INT8_PER_ROW, vnni) == "row"
    assert plain.row_int8_qgemm == "u8u8" and int8_layout_label(INT8_PER_ROW, plain) == "row-u8u8"
    assert int8_layout_label(INT8_BLOCK_SIZE, plain) == int8_layout_label(INT8_BLOCK_SIZE, vnni) == "32"
    out = quantize_model(contrib_fp32_dir, tmp_path / "q")
    scheme = read_config(out).extra["quantization"]
    assert scheme["scheme"] == "rows_int8" and scheme["qgemm"] == cpu_features().row_int8_qgemm


def test_build_random_says_which_layout_it_chose(tmp_path: Path) -> None:
    chosen = f"row, {cpu_features().row_int8_qgemm} QGEMM"
    for args, said in (([], f"int8 block {chosen} (auto: chosen for this CPU)"), (["--block-size", "64"], "block 64;")):
        result = run_cli("model", "build-random", str(tmp_path / f"m{len(args)}"), *args)
        assert result.returncode == 0 and said in result.stdout, result.stdout + result.stderr[-2000:]
    assert read_config(tmp_path / "m0").extra["quantization"]["scheme"] == "rows_int8"
    assert _blocks(tmp_path / "m2") == {64}


def test_quantizing_with_a_block_size_gives_the_model_built_with_it(
    built: Path, contrib_fp32_dir: Path, tmp_path: Path
) -> None:
    """Same seeded weights: `model quantize --block-size 64` of the fp32 contrib model equals the model
    built int8 at block 64, logits bit for bit; and they differ from block 32's (the option is used)."""
    quantized, default = tmp_path / "q64", tmp_path / "q32"
    result = run_cli("model", "quantize", str(contrib_fp32_dir), str(quantized), "--block-size", "64")
    assert result.returncode == 0, result.stderr[-3000:]
    quantize_model(contrib_fp32_dir, default, block=INT8_BLOCK_SIZE)
    for ids in (prompt(1), prompt(9, start=40)):
        assert np.array_equal(prompt_logits(quantized, ids), prompt_logits(built, ids))
        assert not np.array_equal(prompt_logits(default, ids), prompt_logits(built, ids))


def test_a_larger_block_still_decodes_batched_bit_identically(built: Path) -> None:
    """Activations are quantized per row block whatever the block's size: a row's bits never depend on its
    neighbours, so resume at batch 1 stays exact."""
    assert_batch_invariant(built)


def test_converting_a_standard_export_takes_the_block_size(small_fp32_dir: Path, tmp_path: Path) -> None:
    src = tmp_path / "fp32"
    shutil.copytree(small_fp32_dir, src)
    result = run_cli(
        "model", "quantize", str(src), str(tmp_path / "int8"), "--layout", "contrib", "--block-size", "128"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert _blocks(tmp_path / "int8") == {128}
    info = json.loads(run_cli("model", "info", str(tmp_path / "int8")).stdout)
    assert info["decoding"]["batch_invariant"] is True


def test_a_block_size_for_dynamic_int8_is_refused(small_fp32_dir: Path, tmp_path: Path) -> None:
    result = run_cli("model", "quantize", str(small_fp32_dir), str(tmp_path / "dst"), "--block-size", "128")
    assert_one_line_error(result, "standard-op graph", "--layout contrib")
    assert not (tmp_path / "dst").exists()


@pytest.mark.parametrize(
    "args",
    [["--shape", "tiny", "--fp32"], ["--shape", "gpt-oss-tiny"]],
)
def test_a_block_size_where_nothing_is_blocked_is_refused(args: list[str], tmp_path: Path) -> None:
    result = run_cli("model", "build-random", str(tmp_path / "m"), *args, "--block-size", "64")
    assert_one_line_error(result, "--block-size")
    assert not (tmp_path / "m").exists()


def test_a_block_size_onnxruntime_does_not_take_is_refused_by_the_parser(tmp_path: Path) -> None:
    result = run_cli("model", "build-random", str(tmp_path / "m"), "--block-size", "48")
    assert result.returncode == 2
    assert "int8 block size must be one of row, 16, 32, 64, 128, 256 or auto" in result.stderr
