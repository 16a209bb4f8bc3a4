"""Codex CLI on the built-in model (issue 41): `codex exec "Create a file named hello.txt containing the word hi"`
in a scratch git repository, with a stock config whose only setting is a Responses provider pointed at a fresh
server on the built-in model, once per seed (SERVICE_DEFAULT_SEED: Codex sends no seed). A run succeeds when
Codex exits 0 and hello.txt holds `hi`; the server's SQLite file keeps each run's responses.

    python -m bench.codex_builtin [--seeds 1,2,3,4,5] [--model DIR] [--codex PATH/bin/codex.js]

Needs node and the pinned Codex (.ci/run installs it into .ci/codex)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
CODEX_JS = ROOT / ".ci" / "codex" / "node_modules" / "@openai" / "codex" / "bin" / "codex.js"
TASK = "Create a file named hello.txt containing the word hi"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def codex_config(home: Path, url: str, model: str) -> None:
    """A stock Codex config: the custom provider and the model, nothing else."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(
        f'model = "{model}"\nmodel_provider = "local"\n\n[model_providers.local]\nname = "local server"\n'
        f'base_url = "{url}/v1"\nwire_api = "responses"\nenv_key = "LOCAL_RESPONSES_API_KEY"\n'
    )


def run_codex(node: str, codex_js: Path, tmp: Path, url: str, model: str, prompt: str) -> tuple[int, Path, str]:
    """`codex exec PROMPT` in a fresh git repository under `tmp`: (exit code, the repository, its output)."""
    home, repo = tmp / "codex-home", tmp / "repo"
    codex_config(home, url, model)
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    env = {**os.environ, "CODEX_HOME": str(home), "HOME": str(tmp), "LOCAL_RESPONSES_API_KEY": "x", "NO_COLOR": "1"}
    argv = [node, str(codex_js), "exec", "--skip-git-repo-check", "--sandbox", "danger-full-access",
            "-c", "analytics.enabled=false", prompt]  # fmt: skip
    done = subprocess.run(
        argv, cwd=repo, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300
    )
    return done.returncode, repo, done.stdout[-2000:] + done.stderr[-2000:]


def stored_responses(db: Path) -> list[dict[str, Any]]:
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT id, status, response FROM responses ORDER BY rowid").fetchall()
    return [{"id": r[0], "status": r[1], "output": json.loads(r[2])["output"] if r[2] else None} for r in rows]


def one_run(seed: int, node: str, codex_js: Path, work: Path, model_dir: Path | None = None) -> dict[str, Any]:
    work.mkdir(parents=True)
    port = _free_port()
    db = work / "service.db"
    env = {**os.environ, "SERVICE_DATABASE_URL": f"sqlite+aiosqlite:///{db}", "SERVICE_DEFAULT_SEED": str(seed)}
    env.pop("SERVICE_MODEL", None)  # the built-in model, unless --model names another directory
    if model_dir is not None:
        env["SERVICE_MODEL"] = str(model_dir)
    with (work / "server.log").open("wb") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "service", "serve", "--host", "127.0.0.1", "--port", str(port)],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                try:
                    model = httpx.get(f"{url}/v1/models", timeout=2).json()["data"][0]["id"]
                    break
                except (httpx.HTTPError, KeyError, IndexError, ValueError):
                    time.sleep(0.5)
            else:
                return {"seed": seed, "ok": False, "why": "server did not start"}
            code, repo, output = run_codex(node, codex_js, work, url, model, TASK)
        finally:
            server.terminate()
            server.wait(timeout=30)
    hello = repo / "hello.txt"
    content = hello.read_text() if hello.is_file() else None
    responses = stored_responses(db)
    calls = [i for r in responses for i in r["output"] or [] if i.get("type") == "function_call"]
    return {
        "seed": seed,
        "ok": code == 0 and content is not None and content.strip() == "hi",
        "exit": code,
        "hello_txt": content,
        "responses": [r["status"] for r in responses],
        "commands": [
            json.loads(c["arguments"]).get("cmd") if c.get("arguments", "").startswith("{") else c.get("arguments")
            for c in calls
        ],
        **({} if code == 0 else {"output": output}),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="1,2,3,4,5")
    parser.add_argument("--codex", type=Path, default=CODEX_JS)
    parser.add_argument("--model", type=Path, default=None, help="a model directory (default: the built-in model)")
    args = parser.parse_args()
    node = shutil.which("node")
    if node is None or not args.codex.is_file():
        raise SystemExit(f"needs node and Codex at {args.codex} (.ci/run installs it)")
    runs = []
    with tempfile.TemporaryDirectory(prefix="codex-builtin-") as tmp:
        for seed in [int(s) for s in args.seeds.split(",")]:
            runs.append(one_run(seed, node, args.codex, Path(tmp) / f"seed-{seed}", args.model))
            print(json.dumps(runs[-1]), flush=True)
    print(json.dumps({"task": TASK, "succeeded": sum(r["ok"] for r in runs), "of": len(runs)}))


if __name__ == "__main__":
    main()
