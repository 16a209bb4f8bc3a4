"""The coding-agent samples (service/training/agentic.py) render as the server renders Codex's requests, complete
in tokens the server's constraint allows and parses, and train commands that do their task when run; the writable
vocabulary holds the corpus's ids and the standard library's most frequent."""

from __future__ import annotations

import json

import numpy as np

from bench.agentic_quality import held_out_tasks, run_command
from service.prompting.harmony import HarmonyFormat
from service.training.agentic import EXEC, TASK_KINDS, exec_output, make_agentic_sample, make_task, task_output
from service.training.corpus import Renderer
from service.training.writable import FIRST_SPECIAL_ID, writable_ids
from tests.corpus_helpers import started_items


def test_every_trained_command_does_its_task_when_run() -> None:
    rng = np.random.default_rng(7)
    tasks = [make_task(rng) for _ in range(60)]
    assert {t.kind for t in tasks} == set(TASK_KINDS)
    for task in tasks:
        ok, out = run_command(task, task.command)
        assert ok, task
        assert out == task_output(task)  # what the corpus shows the model as the command's output
    wrong = next(t for t in tasks if t.kind == "create")
    assert not run_command(wrong, "true")[0]  # a command that does nothing fails the check


def test_agent_turns_complete_in_tokens_the_server_constrains_and_parses() -> None:
    renderer = Renderer()
    fmt = renderer.fmt
    rng = np.random.default_rng(3)
    for after_output in (False, True) * 6:
        agent = make_agentic_sample(rng, instruction_tokens=int(rng.choice([0, 300])), after_output=after_output)
        sample = agent.sample
        assert renderer.prompt(sample) == fmt.render(sample.request)
        names = [t["name"] for t in sample.request.tools]
        assert names.count(EXEC) == 1 and "web_search" not in names  # as model_tools offers Codex's tools
        completion = renderer.completion(sample.completion)
        started = started_items(fmt, sample.request, completion)
        kinds = [c.kind for c in started]
        if after_output:
            assert kinds == ["reasoning", "message"]
            assert sample.request.items[-1]["type"] == "function_call_output"
        else:
            assert kinds == ["reasoning", "function_call"] and started[1].name == EXEC
            call = sample.completion[-1]
            assert json.loads(call.text) == {"cmd": agent.task.command}


def test_the_command_output_is_shown_as_codex_reports_it() -> None:
    text = exec_output(np.random.default_rng(0), "a.txt\nb.txt\n")
    lines = text.splitlines()
    assert lines[0].startswith("Chunk ID: ") and lines[2] == "Process exited with code 0"
    assert text.endswith("Output:\na.txt\nb.txt\n")


def test_held_out_prompts_are_as_long_as_the_bench_says() -> None:
    fmt = HarmonyFormat()
    tasks = held_out_tasks(3, 515151, fmt)
    assert all(6000 <= n <= 12000 for _, _, n in tasks)
    assert all(len(fmt.render(request)) == n for request, _, n in tasks)


def test_writable_ids_keep_the_corpus_and_add_the_most_frequent_text_ids() -> None:
    corpus = np.array([200, 300, 12345], dtype=np.int32)
    ids = writable_ids(corpus, 2000)
    assert ids.size == 2000 and np.all(np.diff(ids) > 0)
    assert set(corpus.tolist()) <= set(ids.tolist())
    assert ids.max() < FIRST_SPECIAL_ID
    enc = HarmonyFormat().encoding
    for word in (" the", " return", "import", " self", "\n"):
        (tid,) = enc.encode(word, disallowed_special=())
        assert tid in set(ids.tolist()), word
    assert np.array_equal(writable_ids(corpus, 0), corpus)
