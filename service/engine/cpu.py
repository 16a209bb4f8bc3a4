"""CPU feature detection, used to pick the int8 scheme and to report the MLAS kernel path."""

from __future__ import annotations

import functools
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

_CPUINFO = Path("/proc/cpuinfo")


@dataclass(frozen=True)
class CpuFeatures:
    model_name: str
    logical_cores: int
    avx2: bool
    avx512f: bool
    avx512_vnni: bool
    avx_vnni: bool
    amx_int8: bool

    @property
    def has_vnni(self) -> bool:
        return self.avx512_vnni or self.avx_vnni or self.amx_int8

    @property
    def row_int8_qgemm(self) -> str:
        """The QGEMM flavour a per-row int8 model is built for here: u8s8 (int8 weights) with VNNI, whose vpdpbusd
        sums are exact; u8u8 without, since vpmaddubsw's int16 pair sums saturate on u8 x s8 (uint8 weights +128
        instead: exact on every x86 path, so a u8u8 model loads on any CPU)."""
        return "u8s8" if self.has_vnni else "u8u8"

    @property
    def int8_kernel(self) -> str:
        """The MLAS u8s8 GEMM path ONNX Runtime picks for dynamic int8 MatMul on this CPU."""
        if self.amx_int8:
            return "amx_int8"
        if self.avx512_vnni:
            return "avx512_vnni"
        if self.avx_vnni:
            return "avx_vnni"
        if self.avx512f:
            return "avx512_core u8s8 (reduce_range)"
        if self.avx2:
            return "avx2_u8s8 (reduce_range)"
        return "generic (reduce_range)"

    @property
    def needs_reduce_range(self) -> bool:
        # Without VNNI, MLAS multiplies u8*s8 with vpmaddubsw, whose int16 pair sums saturate;
        # 7-bit weights avoid that (measured on Zen 3: max logit error 0.35 -> 0.02).
        return not self.has_vnni

    @property
    def int4_experts_batch_invariant(self) -> bool:
        """Whether QMoE's 4-bit experts (MLAS block GEMM, int8 activations) give a row the same bits at batch
        1 as in a batch. Without VNNI they do not: on AVX2 (AMD EPYC, onnxruntime 1.32) the one-row and the
        many-row kernels round differently, by ~1e-7 in the logits; VNNI CPUs agree
        (tests/test_gptoss_engine.py). 8-bit experts and MatMulNBits int8 agree on both."""
        return self.has_vnni

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["int8_kernel"] = self.int8_kernel
        d["reduce_range"] = self.needs_reduce_range
        d["int4_experts_batch_invariant"] = self.int4_experts_batch_invariant
        return d


def parse_cpuinfo(text: str) -> CpuFeatures:
    """Features from the text of /proc/cpuinfo (first processor's flags)."""
    flags: set[str] = set()
    model = "unknown"
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "flags" and not flags:
            flags = set(value.split())
        elif key == "model name" and model == "unknown":
            model = value.strip()
    return CpuFeatures(
        model_name=model,
        logical_cores=os.cpu_count() or 1,
        avx2="avx2" in flags,
        avx512f="avx512f" in flags,
        avx512_vnni="avx512_vnni" in flags,
        avx_vnni="avx_vnni" in flags,
        amx_int8="amx_int8" in flags and "amx_tile" in flags,
    )


@functools.cache
def cpu_features() -> CpuFeatures:
    """This machine's features; an unreadable /proc/cpuinfo reads as a plain x86-64 CPU."""
    try:
        text = _CPUINFO.read_text()
    except OSError:
        text = ""
    return parse_cpuinfo(text)
