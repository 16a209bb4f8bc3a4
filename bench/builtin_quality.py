"""Quality of the built-in model on held-out synthetic prompts, through the real engine (ONNX int8).

Prompts come from the training corpus generator with another seed, rendered exactly as the server
renders them; completions are sampled at temperature 1 with the Harmony header constraint, like
the server does (message bodies, including function arguments, are unconstrained). Reports:

- well_formed: the completion parses as Harmony with openai-harmony (strict);
- ended_by_itself: it stopped with <|return|> or <|call|> within --max-tokens;
- tool_decision: it called the expected function, or answered without a call when none fits;
- arguments_json_valid: the calls' arguments are a JSON object;
- argument_copied: the call's argument equals the value in the user's request;
- answer_has_tool_value: after a tool result, the final answer contains the tool output's salient value;
- arguments_closed_64: a call's arguments closed (<|call|>) within 64 tokens (every completion that opened a call).

    SERVICE_INTRA_OP_THREADS=1 python -m bench.builtin_quality [--samples 300] [--model DIR] [--update-manifest]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from openai_harmony import Role

from service.engine.base import SamplingParams
from service.engine.model_dir import BUILTIN_MANIFEST, ensure_builtin_model
from service.engine.onnx_engine import OnnxEngine
from service.prompting.base import PromptRequest
from service.prompting.harmony import HarmonyFormat
from service.training.corpus import make_samples
from service.training.sample import Sample

HELD_OUT_SEED = 424242  # the training corpus uses TrainConfig.seed (1)


@dataclass
class Outcome:
    sample: Sample
    tokens: list[int]
    stopped: bool


def complete(
    engine: OnnxEngine,
    fmt: HarmonyFormat,
    requests: list[PromptRequest],
    max_tokens: int,
    batch: int,
    temperature: float = 1.0,
    seed: int = 0,
) -> list[tuple[list[int], bool]]:
    """(tokens, stopped by a stop token) per request, `batch` at a time, the i-th sampled with seed `seed + i`
    under the server's Harmony header constraint (bench/agentic_quality.py shares it)."""
    stops = fmt.stop_token_ids()
    results: list[tuple[list[int], bool]] = []
    for start in range(0, len(requests), batch):
        part = requests[start : start + batch]
        tokens: dict[str, list[int]] = {}
        stopped: dict[str, bool] = {}
        for offset, request in enumerate(part):
            sid = str(start + offset)
            params = SamplingParams(
                max_new_tokens=max_tokens, temperature=temperature, seed=seed + start + offset, stop_token_ids=stops
            )
            engine.add_sequence(sid, fmt.render(request), params, constraint=fmt.constraint_for(request))
            tokens[sid], stopped[sid] = [], False
        while engine.active_sequence_ids():
            for sid, out in engine.step().items():
                tokens[sid].append(out.token_id)
                if out.finish_reason is not None:
                    stopped[sid] = out.finish_reason == "stop"
        results += [(tokens[str(start + i)], stopped[str(start + i)]) for i in range(len(part))]
    return results


def generate(
    model_dir: Path, samples: list[Sample], max_tokens: int, threads: int, batch: int, temperature: float = 1.0
) -> list[Outcome]:
    engine = OnnxEngine(model_dir, intra_op_threads=threads, max_batch=batch)
    done = complete(engine, HarmonyFormat(), [s.request for s in samples], max_tokens, batch, temperature)
    return [Outcome(sample, tokens, stopped) for sample, (tokens, stopped) in zip(samples, done, strict=True)]


ARGUMENT_BUDGET = 64  # tokens a call's arguments must close within (issue 41)


def argument_tokens(fmt: HarmonyFormat, tokens: list[int]) -> int | None:
    """Tokens between a call's <|message|> and its <|call|>; None where no call closed."""
    enc = fmt.encoding
    (call,) = enc.encode("<|call|>", allowed_special="all")
    (message,) = enc.encode("<|message|>", allowed_special="all")
    if call not in tokens:
        return None
    end = tokens.index(call)
    return end - max(i for i in range(end) if tokens[i] == message) - 1


def opens_a_call(fmt: HarmonyFormat, tokens: list[int]) -> bool:
    """The completion wrote a call's header (` to=functions.`), closed or not."""
    return " to=functions." in fmt.encoding.decode(tokens)


def score(outcomes: list[Outcome], fmt: HarmonyFormat) -> dict[str, Any]:
    counts = {k: [0, 0] for k in ("well_formed", "ended_by_itself", "tool_decision", "arguments_json_valid")}
    counts |= {"argument_copied": [0, 0], "answer_has_tool_value": [0, 0], "arguments_closed_64": [0, 0]}
    failures: list[str] = []

    def tally(key: str, ok: bool) -> None:
        counts[key][0] += int(ok)
        counts[key][1] += 1

    for o in outcomes:
        tally("ended_by_itself", o.stopped)
        if opens_a_call(fmt, o.tokens):
            length = argument_tokens(fmt, o.tokens)
            tally("arguments_closed_64", length is not None and length <= ARGUMENT_BUDGET)
        try:
            messages = fmt.encoding.parse_messages_from_completion_tokens(o.tokens, Role.ASSISTANT, strict=True)
            parsed = True
        except Exception:  # noqa: BLE001 - any parse error means the completion is not well-formed
            messages, parsed = [], False
        tally("well_formed", parsed)
        calls = [m for m in messages if (m.recipient or "").startswith("functions.")]
        finals = [m for m in messages if m.channel == "final"]
        expected_call = o.sample.kind == "call"
        name = calls[0].recipient.removeprefix("functions.") if calls and calls[0].recipient else None
        decided = (name == o.sample.tool) if expected_call else not calls
        tally("tool_decision", decided)
        if not decided and len(failures) < 10:
            failures.append(f"decision: expected {o.sample.tool or 'no call'}, got {name or 'no call'}")
        for call in calls:
            text = "".join(c.text for c in call.content if hasattr(c, "text"))
            try:
                args = json.loads(text)
                valid = isinstance(args, dict)
            except ValueError:
                args, valid = None, False
            tally("arguments_json_valid", valid)
            if expected_call and name == o.sample.tool and o.sample.argument is not None:
                param, value = o.sample.argument
                copied = valid and isinstance(args, dict) and args.get(param) == value
                tally("argument_copied", copied)
                if not copied and len(failures) < 20:
                    failures.append(f"argument: expected {param}={value!r}, got {text!r}")
        if o.sample.kind == "after_tool":
            answer = "".join(c.text for m in finals for c in m.content if hasattr(c, "text"))
            ok = o.sample.salient is not None and o.sample.salient in answer
            tally("answer_has_tool_value", ok)
            if not ok and len(failures) < 30:
                failures.append(f"answer: expected {o.sample.salient!r} in {answer!r}")
    report = rates(counts)
    report["examples_of_failures"] = failures
    return report


def rates(counts: dict[str, list[int]]) -> dict[str, Any]:
    """{metric: {"rate", "ok", "of"}} from {metric: [ok, of]}."""
    return {key: {"rate": round(ok / n, 4) if n else None, "ok": ok, "of": n} for key, (ok, n) in counts.items()}


def held_out_arguments(parser: argparse.ArgumentParser, seed: int) -> None:
    """The options the held-out benches share (this one and bench/agentic_quality.py)."""
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--seed", type=int, default=seed)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--model", type=Path, default=None, help="a model directory (default: the built-in model)")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--threads", type=int, default=int(os.environ.get("SERVICE_INTRA_OP_THREADS", "1")))


def record_in_manifest(key: str, report: dict[str, Any]) -> None:
    """The report, but the model's path and the failures, as the built-in manifest's metrics[key]."""
    manifest = json.loads(BUILTIN_MANIFEST.read_text())
    manifest["metrics"][key] = {k: v for k, v in report.items() if k not in ("model", "examples_of_failures")}
    BUILTIN_MANIFEST.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    held_out_arguments(parser, HELD_OUT_SEED)
    parser.add_argument(
        "--temperature", type=float, default=1.0, help="1.0 (the API default) for the issue's figures; 0 is greedy"
    )
    parser.add_argument(
        "--update-manifest", action="store_true", help="record the figures in the built-in model's manifest"
    )
    args = parser.parse_args()
    model_dir = args.model or ensure_builtin_model(progress=True)
    samples = make_samples(args.seed, args.samples)
    started = time.monotonic()
    outcomes = generate(model_dir, samples, args.max_tokens, args.threads, args.batch, args.temperature)
    report = {
        "model": str(model_dir),
        "held_out_seed": args.seed,
        "samples": len(samples),
        "max_output_tokens": args.max_tokens,
        "temperature": args.temperature,
        **score(outcomes, HarmonyFormat()),
        "seconds": round(time.monotonic() - started, 1),
    }
    print(json.dumps(report, indent=2))
    if args.update_manifest:
        record_in_manifest("quality", report)


if __name__ == "__main__":
    main()
