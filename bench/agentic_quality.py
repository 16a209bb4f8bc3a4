"""The built-in model as a coding agent (issue 41): held-out file tasks shaped like Codex CLI's traffic, behind a
long developer prompt (6,000-12,000 tokens rendered), through the real engine (ONNX int8), each checked by running
the model's own command in a scratch directory.

A task is two requests, as an agent makes them: the first must call `exec_command` with a command that does the
task (run in a scratch directory laid out as the task says, inside bubblewrap where it is installed); the second
carries the model's call and the command's real output (in Codex's format) and must end with a final answer.
Sampling at temperature 1 with the Harmony header constraint, as the server does. Reports:

- right_call: the first turn calls exec_command, and its command, run, does the task;
- final_after_output: the second turn ends with a final answer (and no other call);
- well_formed: both turns parse as Harmony (strict);
- ended_by_itself: both turns stopped with <|return|> or <|call|> within --max-tokens;
- arguments_closed_64: the call's arguments closed (<|call|>) within 64 tokens;
- prompt_tokens: the shortest and longest first-turn prompt.

    SERVICE_INTRA_OP_THREADS=2 python -m bench.agentic_quality [--samples 300] [--model DIR] [--update-manifest]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from openai_harmony import Role

from bench.builtin_quality import (
    ARGUMENT_BUDGET,
    argument_tokens,
    complete,
    held_out_arguments,
    opens_a_call,
    rates,
    record_in_manifest,
)
from service.engine.model_dir import ensure_builtin_model
from service.engine.onnx_engine import OnnxEngine
from service.prompting.base import PromptRequest
from service.prompting.harmony import HarmonyFormat
from service.training.agentic import EXEC, AgentTask, exec_output, make_agentic_sample

HELD_OUT_SEED = 515151  # training's agentic samples draw from TrainConfig.seed + train.AGENTIC_SEED_OFFSET
PROMPT_TOKENS = (6000, 12000)  # the rendered first-turn prompt's length, drawn per task


@dataclass
class Turn:
    tokens: list[int]
    stopped: bool


def _generate(
    engine: OnnxEngine, fmt: HarmonyFormat, requests: list[PromptRequest], max_tokens: int, batch: int, seed: int
) -> list[Turn]:
    return [Turn(t, s) for t, s in complete(engine, fmt, requests, max_tokens, batch, 1.0, seed)]


def held_out_tasks(count: int, seed: int, fmt: HarmonyFormat) -> list[tuple[PromptRequest, AgentTask, int]]:
    """(first request, task, its rendered length): instructions sized so that the prompt lands in PROMPT_TOKENS."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        goal = int(rng.integers(PROMPT_TOKENS[0], PROMPT_TOKENS[1] + 1))
        tokens = goal - 900  # the tools, skills and environment around the instructions: about 900 tokens
        while True:
            state = rng.bit_generator.state
            agent = make_agentic_sample(rng, instruction_tokens=tokens, after_output=False)
            length = len(fmt.render(agent.sample.request))
            if PROMPT_TOKENS[0] <= length <= PROMPT_TOKENS[1]:
                break
            rng.bit_generator.state = state  # back to where this task's draws began,
            tokens += goal - length
            rng.random()  # one step on (another task), with the instructions resized
        out.append((agent.sample.request, agent.task, length))
    return out


def _parse(fmt: HarmonyFormat, tokens: list[int]) -> list[Any] | None:
    try:
        return list(fmt.encoding.parse_messages_from_completion_tokens(tokens, Role.ASSISTANT, strict=True))
    except Exception:  # noqa: BLE001 - any parse error: not well-formed
        return None


def _text(message: Any) -> str:
    return "".join(c.text for c in message.content if hasattr(c, "text"))


def run_command(task: AgentTask, command: str) -> tuple[bool, str]:
    """Lay out the task's files in a scratch directory, run `command` there (in bubblewrap where installed: the
    root read-only, the scratch directory writable, no network), and check what the task needs."""
    with tempfile.TemporaryDirectory(prefix="agentic-") as tmp:
        root = Path(tmp)
        for path, content in task.files.items():
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).write_text(content)
        argv = ["bash", "-c", command]
        if shutil.which("bwrap"):
            argv = ["bwrap", "--ro-bind", "/", "/", "--bind", tmp, tmp, "--chdir", tmp, "--unshare-all",
                    "--die-with-parent", "--dev", "/dev", *argv]  # fmt: skip
        try:
            done = subprocess.run(argv, cwd=tmp, capture_output=True, text=True, timeout=10)
        except subprocess.TimeoutExpired:
            return False, ""
        out = done.stdout
        ok = done.returncode == 0
        for path, content in task.expect_files.items():
            ok = ok and (root / path).is_file() and (root / path).read_text().strip() == content
        ok = ok and not any((root / p).exists() for p in task.expect_absent)
        ok = ok and all(s in out for s in task.expect_output)
        return ok, out


def evaluate(model_dir: Path, samples: int, seed: int, max_tokens: int, threads: int, batch: int) -> dict[str, Any]:
    fmt = HarmonyFormat()
    engine = OnnxEngine(model_dir, intra_op_threads=threads, max_batch=batch)
    if engine.max_context <= PROMPT_TOKENS[1] + max_tokens * 2:
        raise SystemExit(
            f"{model_dir}: a context of {engine.max_context} tokens cannot hold the bench's prompts of up to "
            f"{PROMPT_TOKENS[1]} tokens and two turns (train with --attention-window, docs/models.md)"
        )
    tasks = held_out_tasks(samples, seed, fmt)
    first = _generate(engine, fmt, [r for r, _, _ in tasks], max_tokens, batch, seed)
    counts = {
        k: [0, 0] for k in ("right_call", "final_after_output", "well_formed", "ended_by_itself", "arguments_closed_64")
    }
    failures: list[str] = []

    def tally(key: str, ok: bool) -> None:
        counts[key][0] += int(ok)
        counts[key][1] += 1

    rng = np.random.default_rng(seed + 1)
    follow_ups: list[PromptRequest] = []
    for (request, task, _), turn in zip(tasks, first, strict=True):
        messages = _parse(fmt, turn.tokens)
        tally("well_formed", messages is not None)
        tally("ended_by_itself", turn.stopped)
        calls = [m for m in messages or [] if (m.recipient or "").startswith("functions.")]
        name = calls[0].recipient.removeprefix("functions.") if calls else None
        arguments = _text(calls[0]) if calls else ""
        if opens_a_call(fmt, turn.tokens):
            length = argument_tokens(fmt, turn.tokens)
            tally("arguments_closed_64", length is not None and length <= ARGUMENT_BUDGET)
        try:
            command = json.loads(arguments).get("cmd") if name == EXEC else None
        except (ValueError, AttributeError):
            command = None
        ok, out = run_command(task, command) if isinstance(command, str) else (False, "")
        tally("right_call", ok)
        if not ok and len(failures) < 15:
            failures.append(f"{task.user!r}: expected {task.command!r}, got {name} {arguments!r}")
        if name is not None:
            call_id = f"call_{len(follow_ups)}"
            follow_ups.append(
                PromptRequest(
                    items=[
                        *request.items,
                        {"type": "function_call", "call_id": call_id, "name": name, "arguments": arguments},
                        {"type": "function_call_output", "call_id": call_id, "output": exec_output(rng, out)},
                    ],
                    tools=request.tools,
                    reasoning_effort=request.reasoning_effort,
                )
            )
    second = _generate(engine, fmt, follow_ups, max_tokens, batch, seed + samples)
    for turn in second:
        messages = _parse(fmt, turn.tokens)
        tally("well_formed", messages is not None)
        tally("ended_by_itself", turn.stopped)
        final = bool(messages) and messages[-1].channel == "final" and turn.stopped  # type: ignore[index]
        final = final and not any((m.recipient or "").startswith("functions.") for m in messages or [])
        tally("final_after_output", final)
        if not final and len(failures) < 30:
            failures.append(f"after output: {fmt.encoding.decode(turn.tokens)[:200]!r}")
    counts["final_after_output"][1] = samples  # a task with no call has no answer after an output either
    lengths = [n for _, _, n in tasks]
    report = rates(counts)
    report["prompt_tokens"] = {"min": min(lengths), "max": max(lengths)}
    report["examples_of_failures"] = failures
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    held_out_arguments(parser, HELD_OUT_SEED)
    parser.add_argument("--update-manifest", action="store_true", help="record the figures in the built-in manifest")
    args = parser.parse_args()
    model_dir = args.model or ensure_builtin_model(progress=True)
    started = time.monotonic()
    report = {
        "model": str(model_dir),
        "held_out_seed": args.seed,
        "samples": args.samples,
        "max_output_tokens": args.max_tokens,
        "temperature": 1.0,
        **evaluate(model_dir, args.samples, args.seed, args.max_tokens, args.threads, args.batch),
        "seconds": round(time.monotonic() - started, 1),
    }
    print(json.dumps(report, indent=2))
    if args.update_manifest:
        record_in_manifest("agentic", report)


if __name__ == "__main__":
    main()
