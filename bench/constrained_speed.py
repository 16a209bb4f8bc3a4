"""Constrained vs unconstrained decode speed on the built-in model, at batch 1 and 8.

    SERVICE_INTRA_OP_THREADS=1 .venv/bin/python -m bench.constrained_speed [--threads 1] [--steps 64]
        [--rounds 3] [--batches 1,8]

Modes (every sequence of a batch in the same mode):
  * none      no constraint at all (the engine's fast path);
  * harmony   the Harmony header constraint in a free final body (what every unconstrained request runs);
  * json      the final body constrained by a JSON schema (llguidance bitmask, computed in the mask
              thread while the model runs, applied with numpy);
  * lark      the final body constrained by a Lark grammar (arithmetic, as a custom tool's input);
  * lark-words  a Lark grammar of prose (a broad letter class: the costliest kind of mask).
Each sequence starts inside the final channel (`<|channel|>final<|message|>` is part of its prompt
and already fed to its constraint), so every timed token is a body token. A sequence whose grammar
completes is replaced by a fresh one (untimed), so the batch stays full. Only engine.step() is timed:
tokens/s = tokens sampled / seconds in step(); CPU ms/token = process CPU time in step() (every
thread: ONNX Runtime, the mask thread) / tokens, which other processes' load disturbs less. Modes
run interleaved, --rounds times, best of each reported (the machine is shared).
"""

from __future__ import annotations

import argparse
import itertools
import time
from typing import Any

from service.constraints.compiler import GrammarSpec
from service.constraints.plan import DecodingPlan, plan_from_spec
from service.engine.base import LogitsConstraint, SamplingParams
from service.engine.model_dir import ensure_builtin_model
from service.engine.onnx_engine import OnnxEngine
from service.prompting.base import PromptRequest
from service.prompting.harmony import HarmonyFormat

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "items": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"name": {"type": "string"}, "count": {"type": "integer"}},
                "required": ["name", "count"],
                "additionalProperties": False,
            },
        }
    },
    "required": ["items"],
    "additionalProperties": False,
}
# A custom tool's input language (arithmetic), and prose (a broad letter class, which llguidance's
# token-trie slicer cannot shortcut: every mask walks most of the 201k-token vocabulary).
LARK = {
    "lark": 'start: expr\nexpr: term (("+" | "-" | "*") term)*\nterm: NUMBER | "(" expr ")"\nNUMBER: /[0-9]{1,6}/',
    "lark-words": 'start: sentence+\nsentence: WORD (" " WORD)* ". "\nWORD: /[A-Za-z]{1,12}/',
}
MODES = ("none", "harmony", "json", "lark", "lark-words")


def _plan(mode: str) -> DecodingPlan | None:
    if mode == "json":
        fmt = {"type": "json_schema", "name": "b", "schema": SCHEMA, "strict": True}
        return plan_from_spec([], {"text_format": fmt, "reasoning_budget": 0})
    if mode in LARK:
        return DecodingPlan((), True, GrammarSpec("lark", LARK[mode]), "bench", 0)
    return plan_from_spec([], {"reasoning_budget": 0})


class Bench:
    def __init__(self, engine: OnnxEngine, fmt: HarmonyFormat) -> None:
        self.engine = engine
        self.fmt = fmt
        request = PromptRequest(items=[{"type": "message", "role": "user", "content": "go"}])
        self.header = fmt.encoding.encode("<|channel|>final<|message|>", allowed_special="all")
        self.prompt = fmt.render(request) + self.header
        self.request = request
        self.ids = itertools.count()

    def add(self, mode: str, seed: int) -> None:
        constraint: LogitsConstraint | None = None
        if mode != "none":
            constraint = self.fmt.constraint_for(self.request, _plan(mode))
            for token in self.header:
                constraint.accept(token)
        params = SamplingParams(
            max_new_tokens=10_000, temperature=1.0, seed=seed, stop_token_ids=self.fmt.stop_token_ids()
        )
        self.engine.add_sequence(f"s{next(self.ids)}", self.prompt, params, constraint)

    def run(self, mode: str, batch: int, steps: int) -> tuple[float, float]:
        """(tokens per wall second, process CPU milliseconds per token) over `steps` engine steps."""
        for seq_id in self.engine.active_sequence_ids():
            self.engine.remove_sequence(seq_id)
        for b in range(batch):
            self.add(mode, seed=b)
        tokens, seconds, cpu = 0, 0.0, 0.0
        for _ in range(steps):
            started, cpu_started = time.perf_counter(), time.process_time()
            out = self.engine.step()
            seconds += time.perf_counter() - started
            cpu += time.process_time() - cpu_started
            tokens += len(out)
            for _finished in [o for o in out.values() if o.finish_reason is not None]:
                self.add(mode, seed=tokens)  # keep the batch full (untimed)
        for seq_id in self.engine.active_sequence_ids():
            self.engine.remove_sequence(seq_id)
        return tokens / seconds, 1000 * cpu / tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batches", default="1,8")
    args = parser.parse_args()
    engine = OnnxEngine(ensure_builtin_model(None, progress=True), intra_op_threads=args.threads)
    fmt = HarmonyFormat()
    fmt.grammar_tokenizer()  # built once (~1 s), not timed
    bench = Bench(engine, fmt)
    batches = [int(b) for b in args.batches.split(",")]
    for mode in MODES:  # warm up: grammar compilation and caches
        bench.run(mode, 1, 4)
    best: dict[tuple[str, int], float] = {}
    cpu: dict[tuple[str, int], float] = {}
    for _ in range(args.rounds):
        for batch in batches:
            for mode in MODES:
                rate, cpu_ms = bench.run(mode, batch, args.steps)
                best[mode, batch] = max(best.get((mode, batch), 0.0), rate)
                cpu[mode, batch] = min(cpu.get((mode, batch), float("inf")), cpu_ms)
    print(f"built-in model, {args.threads} thread(s), {args.steps} steps, best of {args.rounds}")
    print("| batch | " + " | ".join(f"{m} tok/s" for m in MODES) + " |")
    print("|---|" + "---|" * len(MODES))
    for batch in batches:
        base = best["none", batch]
        rates = " | ".join(f"{best[m, batch]:.0f} ({best[m, batch] / base - 1:+.0%})" for m in MODES)
        print(f"| {batch} | {rates} |")
    print("\nCPU time per token (all threads of the process; less sensitive to other load), ms:")
    print("| batch | " + " | ".join(MODES) + " |")
    print("|---|" + "---|" * len(MODES))
    for batch in batches:
        base = cpu["none", batch]
        cells = " | ".join(f"{cpu[m, batch]:.2f} ({cpu[m, batch] / base - 1:+.0%})" for m in MODES)
        print(f"| {batch} | {cells} |")


if __name__ == "__main__":
    main()
