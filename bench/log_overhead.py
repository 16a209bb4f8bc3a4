"""What logging every token costs: decode tokens/s of the bare engine vs the same run through the
server (every event committed to the SQL log before it is streamed), in one run.

    .venv/bin/python -m bench.log_overhead [--database-url URL] [--tokens 300]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import sqlalchemy as sa

from service.engine.base import SamplingParams
from service.engine.model_dir import ensure_random_model
from service.engine.onnx_engine import OnnxEngine
from service.prompting import chat_format_for
from service.prompting.base import PromptRequest
from service.store.db import create_engine
from tests.api_helpers import client_for, raw_events, wait_until_terminal
from tests.conftest import MODEL_CACHE, ServerProcess


def bare_engine(model_dir: Path, tokens: int, threads: int) -> float:
    engine = OnnxEngine(model_dir, intra_op_threads=threads)
    chat_format = chat_format_for(model_dir, json.loads((model_dir / "config.json").read_text()))
    request = PromptRequest(
        items=[{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "bench"}]}]
    )
    prompt = chat_format.render(request)
    # Warm-up, as the server gets one: ONNX Runtime allocates and picks its kernels on the first runs,
    # which would otherwise count against the bare engine (3-4x slower over the first few hundred steps).
    engine.add_sequence("warm", prompt, SamplingParams(max_new_tokens=tokens, seed=2), chat_format.new_constraint())
    while engine.active_sequence_ids():
        engine.step()
    params = SamplingParams(max_new_tokens=tokens, seed=1, logprobs=False)  # as the server runs it: none asked
    engine.add_sequence("bench", prompt, params, chat_format.new_constraint())
    engine.step()  # first token (prefill logits)
    started, produced = time.perf_counter(), 0
    while engine.active_sequence_ids():
        engine.step()
        produced += 1
    return produced / (time.perf_counter() - started)


def through_server(database_url: str, tokens: int, threads: int, log_dir: Path) -> tuple[float, float]:
    """(tokens/s of a background run with no client attached, as timed by its own log;
    tokens/s seen by a streaming client of the official openai package)."""
    server = ServerProcess(database_url, log_dir / "bench-server.log", SERVICE_INTRA_OP_THREADS=str(threads)).start()
    try:
        client = client_for(server.url)
        client.responses.create(input="warm up", max_output_tokens=5)
        background = client.responses.create(
            input="bench", max_output_tokens=tokens, background=True, extra_body={"seed": 1}
        )
        final = wait_until_terminal(client, background.id)
        events = raw_events(server.url, background.id)
        assert final.usage is not None
        # in_progress is logged with the first step; the terminal event with the last token
        started = _logged_at(database_url, background.id, 1)
        ended = _logged_at(database_url, background.id, len(events) - 1)
        background_rate = final.usage.output_tokens / (ended - started)

        stream = client.responses.create(input="bench", max_output_tokens=tokens, stream=True, extra_body={"seed": 1})
        first = last = None
        chars: list[int] = []
        output_tokens = 0
        for event in stream:
            if event.type.endswith(".delta"):
                now = time.perf_counter()
                first = first or now
                last = now
                chars.append(len(str(event.delta)))  # type: ignore[union-attr]
            elif event.type in ("response.completed", "response.incomplete"):
                assert event.response.usage is not None
                output_tokens = event.response.usage.output_tokens
        assert first is not None and last is not None
        # A delta may carry several tokens (steps committed together are folded): the tokens after the
        # first delta, counted by their share of the characters.
        after_first = output_tokens * (sum(chars) - chars[0]) / max(1, sum(chars))
        return background_rate, after_first / (last - first)
    finally:
        server.stop()


def _logged_at(database_url: str, response_id: str, sequence_number: int) -> float:
    async def query() -> float:
        db = create_engine(database_url)
        try:
            async with db.connect() as connection:
                sql = sa.text("SELECT created_at FROM events WHERE response_id = :r AND sequence_number = :n")
                value = await connection.scalar(sql, {"r": response_id, "n": sequence_number})
                if isinstance(value, str):
                    value = datetime.fromisoformat(value)
                return float(value.timestamp() if value.tzinfo else value.replace(tzinfo=UTC).timestamp())
        finally:
            await db.dispose()

    return asyncio.run(query())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--database-url", action="append")
    parser.add_argument("--tokens", type=int, default=300)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    model_dir = ensure_random_model(MODEL_CACHE, progress=False)  # the servers run it too (endless)
    with tempfile.TemporaryDirectory() as tmp:
        urls = args.database_url or [f"sqlite+aiosqlite:///{tmp}/bench.db"]
        bare = bare_engine(model_dir, args.tokens, args.threads)
        print(f"bare engine: {bare:.1f} tok/s")
        for url in urls:
            logged, streamed = through_server(url, args.tokens, args.threads, Path(tmp))
            backend = url.split(":")[0]
            print(f"{backend}: background run, every token logged: {logged:.1f} tok/s = {logged / bare:.0%} of bare")
            print(f"{backend}: streamed to an openai client: {streamed:.1f} tok/s = {streamed / bare:.0%} of bare")


if __name__ == "__main__":
    main()
