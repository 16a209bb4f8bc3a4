"""Tool types this server does not run, through the real server and the official client: each is refused with a
400 that says why, nothing of the refused request is stored, and the server stays healthy. (MCP and the code
interpreter run here: tests/test_server_tools.py.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest

from tests.api_helpers import client_for
from tests.conftest import ServerProcess

SECRET = "sk-NEVER-STORED-42"
REFUSED: list[tuple[dict[str, Any], str]] = [
    ({"type": "web_search_preview"}, "does not offer web search"),
    ({"type": "file_search", "vector_store_ids": ["vs_1"]}, "does not offer file search"),
]


def test_server_tools_refused_clearly(app_factory: Any, database_url: str) -> None:
    # By default they are accepted and not offered (tests/test_compat_inputs.py); the operator may refuse them.
    server: ServerProcess = app_factory(database_url, SERVICE_REFUSE_UNSUPPORTED_TOOLS="true").start()
    client = client_for(server.url)
    function = {"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}}
    for tool, says in REFUSED:
        with pytest.raises(openai.BadRequestError) as raised:
            client.responses.create(input="hi", max_output_tokens=4, tools=[function, tool])  # type: ignore[list-item]
        body: dict[str, Any] = raised.value.body  # type: ignore[assignment]
        assert body["param"] == "tools[1].type", body
        assert body["code"] == "unsupported_tool"
        assert says in body["message"]
    # A refused MCP server (its URL is not http(s)): its secret is stored nowhere.
    bad_mcp = {"type": "mcp", "server_label": "x", "server_url": "ftp://127.0.0.1/mcp", "authorization": SECRET}
    with pytest.raises(openai.BadRequestError) as raised:
        client.responses.create(input="hi", max_output_tokens=4, tools=[function, bad_mcp])  # type: ignore[list-item]
    assert raised.value.body["param"] == "tools[1].server_url"  # type: ignore[index]
    after = client.responses.create(input="still fine", max_output_tokens=2)
    assert after.status in ("completed", "incomplete")
    server.stop()
    if database_url.startswith("sqlite"):
        path = Path(database_url.split("///", 1)[1])
        files = list(path.parent.glob(path.name + "*"))
        assert files and not any(SECRET.encode() in file.read_bytes() for file in files)
