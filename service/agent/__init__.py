"""The agent loop: a response whose model calls server-side tools (MCP servers, the code interpreter).

Following one call through it stays in this package:
- `setup.py`: at create, the request's server tools checked, each MCP server listed, an approved call found;
- `items.py`: which call a recipient addresses, and the output items' shapes (`mcp_call`, `code_interpreter_call`, …);
- `calls.py`: the pure state machine over `tool_call_started` / `tool_call_result` facts, and `execute`, the only
  place a server-side tool is called (exactly once per log);
- `segment.py`: where a run stands in its loop (per-segment prompt and tokens), rebuilt from the log on replay;
- `steps.py`: executing a run's pending call through the group commit and feeding the result back;
- `runtime.py`: `ToolRuntime`, the server's tools (MCP connector and its URL policy, sandbox, containers) and
  `McpSecrets`, built once at start-up (service/app.py) and handed to the commands and the supervisor.

`service/tools/` holds the executors (MCP client, sandbox, registry); nothing in it knows the log.
The run supervisor drives this package and it never imports `service.runs` (a run is `steps.RunAtCall`);
this module imports nothing, so `service.runs.state` can import `calls` and `segment` alone.
"""
