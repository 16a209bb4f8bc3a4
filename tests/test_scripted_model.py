"""The scripted decoder (service/engine/scripted.py): the graph alone follows its rules, and served through the
real server with the official client it answers, or calls a tool, as scripted, deterministically and the same
when two requests decode at once."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import openai
import pytest
from openai.types.responses import FunctionToolParam

from service.engine.base import SamplingParams
from service.engine.config import read_config
from service.engine.onnx_engine import OnnxEngine
from service.engine.scripted import Rule, parse_rules, write_scripted_model
from service.vocab import load_harmony
from tests.api_helpers import client_for
from tests.conftest import ROOT, ServerProcess, app_on_backend

HELLO = "<|channel|>final<|message|>Hello!<|return|>"
DONE = "<|channel|>final<|message|>Done: the tool said hi.<|return|>"
CALL = '<|channel|>commentary to=functions.echo <|constrain|>json<|message|>{"text": "hi"}<|call|>'
RULES = [Rule(HELLO, ["Say hello"]), Rule(DONE, ["<|call|>"]), Rule(CALL)]
ECHO: FunctionToolParam = {
    "type": "function",
    "strict": False,
    "name": "echo",
    "description": "Echo the text back",
    "parameters": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
}


@pytest.fixture(scope="module")
def scripted_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_scripted_model(tmp_path_factory.mktemp("scripted") / "model", RULES)


def _greedy(model: Path, prompt: str, steps: int = 40) -> str:
    """Decode `prompt` (Harmony text) with the bare graph, one token a run after the prompt, as the engine does
    (the KV buffer passed back in: past and present are one [1, 1, max_context, 2] buffer)."""
    enc = load_harmony()
    session = ort.InferenceSession(str(model / "model.onnx"), providers=["CPUExecutionProvider"])
    buffer = np.zeros((1, 1, read_config(model).decoder.max_position, 2), np.float32)
    ids, length, out = list(enc.encode(prompt, allowed_special="all")), 0, []
    for _ in range(steps):
        length += len(ids)
        feed = {
            "input_ids": np.array([ids], np.int64),
            "attention_mask": np.ones((1, length), np.int64),
            "past_key_values.0.key": buffer,
            "past_key_values.0.value": buffer,
        }
        logits, buffer, _ = session.run(None, feed)
        token = int(logits[0, -1].argmax())
        out.append(token)
        ids = [token]
        if token in (200_002, 200_012):  # <|return|>, <|call|>
            break
    return enc.decode(out)


def test_graph_follows_the_first_matching_rule(scripted_dir: Path) -> None:
    user = "<|start|>user<|message|>{}<|end|><|start|>assistant"
    assert _greedy(scripted_dir, user.format("Say hello")) == HELLO
    assert _greedy(scripted_dir, user.format("Do it")) == CALL
    tool_turn = (
        user.format("Do it") + ' to=functions.echo<|channel|>commentary <|constrain|>json<|message|>{"text": "hi"}'
        "<|call|><|start|>functions.echo to=assistant<|channel|>commentary<|message|>hi<|end|><|start|>assistant"
    )
    assert _greedy(scripted_dir, tool_turn) == DONE
    # A pattern that occurs only after the last <|start|> (in the completion so far) does not count.
    assert _greedy(scripted_dir, "<|start|>user<|message|>x<|end|><|start|>assistant Say hello") != HELLO


def test_engine_decodes_a_batch_as_each_alone(scripted_dir: Path) -> None:
    """Shared-buffer layout: the engine decodes several sequences in one run (right-padded rows), token for token
    what each gives alone, prompts of different lengths and rules included."""
    enc = load_harmony()
    prompts = {
        "hello": "<|start|>user<|message|>Say hello<|end|><|start|>assistant",
        "call": "<|start|>system<|message|>a longer prompt than the other one<|end|>"
        "<|start|>user<|message|>Do it<|end|><|start|>assistant",
    }
    params = SamplingParams(max_new_tokens=64, temperature=1.0, seed=7, stop_token_ids=frozenset({200_002, 200_012}))

    rows: list[int] = []

    def decode(names: list[str]) -> dict[str, str]:
        engine = OnnxEngine(scripted_dir, intra_op_threads=1)
        run = engine._decode_batch

        def counted(batch: list[Any]) -> None:
            rows.append(len(batch))
            run(batch)

        engine._decode_batch = counted  # type: ignore[method-assign]
        for name in names:
            engine.add_sequence(name, list(enc.encode(prompts[name], allowed_special="all")), params)
        out: dict[str, list[int]] = {name: [] for name in names}
        while engine.active_sequence_ids():
            for name, token in engine.step().items():
                out[name].append(token.token_id)
        return {name: enc.decode(tokens) for name, tokens in out.items()}

    together = decode(["hello", "call"])
    assert together == {**decode(["hello"]), **decode(["call"])}
    assert together == {"hello": HELLO, "call": CALL}
    assert 2 in rows  # both decoded in one run while both went on


def test_config_and_rules_parsing(scripted_dir: Path) -> None:
    meta = read_config(scripted_dir)
    assert meta.extra["chat_format"] == "harmony" and meta.decoder.max_position == 32_768
    assert parse_rules('[{"script": "a", "when": "b"}, "c"]') == [Rule("a", ["b"]), Rule("c")]
    with pytest.raises(ValueError):
        parse_rules('[{"when": ["x"]}]')


def test_cli_builds_a_servable_directory(tmp_path: Path) -> None:
    out = tmp_path / "cli-model"
    rules = json.dumps([{"when": ["Say hello"], "script": HELLO}])
    done = subprocess.run(
        [sys.executable, "-m", "service", "model", "build-scripted", str(out), "--rules", rules, "--script", CALL],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert read_config(out).extra["scripted_rules"] == [
        {"script": HELLO, "when": ["Say hello"]},
        {"script": CALL, "when": []},
    ]
    assert _greedy(out, "<|start|>user<|message|>Say hello<|end|><|start|>assistant") == HELLO


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, scripted_dir: Path
) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp(f"scripted-{request.param}")
    yield from app_on_backend(request.param, tmp, SERVICE_MODEL=str(scripted_dir))


@pytest.fixture
def client(server: ServerProcess) -> openai.OpenAI:
    return client_for(server.url)


def test_served_answer_is_the_script(client: openai.OpenAI) -> None:
    first = client.responses.create(model="scripted", input="Say hello")
    again = client.responses.create(model="scripted", input="Say hello", temperature=1.5)
    assert first.status == again.status == "completed"
    assert first.output_text == again.output_text == "Hello!"


def test_served_tool_call_then_answer(client: openai.OpenAI) -> None:
    first = client.responses.create(model="scripted", input="Do it", tools=[ECHO])
    calls = [item for item in first.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "echo" and json.loads(calls[0].arguments) == {"text": "hi"}
    second = client.responses.create(
        model="scripted",
        previous_response_id=first.id,
        tools=[ECHO],
        input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "hi"}],
    )
    assert second.status == "completed" and second.output_text == "Done: the tool said hi."


def test_two_at_once_give_the_same(client: openai.OpenAI) -> None:
    def run(prompt: str) -> str:
        response = client.responses.create(model="scripted", input=prompt, tools=[ECHO])
        return json.dumps([item.model_dump(exclude={"id", "call_id"}) for item in response.output], sort_keys=True)

    alone = [run("Say hello"), run("Do it")]
    with ThreadPoolExecutor(2) as pool:
        together = list(pool.map(run, ["Say hello", "Do it"]))
    assert together == alone
