"""SERVICE_DEFAULT_SEED: requests without `seed` (Codex CLI sends none) sample with the configured seed, so a
repeated request gives the same tokens; a request's own seed still wins. On the random model, which never stops
by itself, so every one of the tokens is sampled."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.api_helpers import client_for
from tests.conftest import InProcessServer, ServerProcess


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, random_model_dir: Path) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("default-seed")
    process = InProcessServer(
        f"sqlite+aiosqlite:///{tmp / 'service.db'}", tmp / "server.log", SERVICE_DEFAULT_SEED="1234"
    ).start()
    try:
        yield process
    finally:
        process.stop()


def _tokens(client: openai.OpenAI, **extra: object) -> str:
    response = client.responses.create(input="Say something", max_output_tokens=40, temperature=1.0, **extra)  # type: ignore[call-overload]
    assert response.usage is not None and response.usage.output_tokens == 40
    texts = [getattr(c, "text", "") for item in response.output for c in getattr(item, "content", None) or []]
    return "|".join(item.type for item in response.output) + ":" + "".join(texts)


def test_requests_without_a_seed_sample_with_the_default_one(server: ServerProcess) -> None:
    client = client_for(server.url)
    unseeded = _tokens(client)
    assert _tokens(client) == unseeded
    assert _tokens(client, extra_body={"seed": 1234}) == unseeded  # the same seed, given by the request
    assert _tokens(client, extra_body={"seed": 99}) != unseeded  # a request's own seed wins
