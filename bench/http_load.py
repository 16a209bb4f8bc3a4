"""Throughput under load: C concurrent streaming clients through the real server vs the bare engine at batch C.

    .venv/bin/python -m bench.http_load [--models tiny,qwen] [--clients 1,4,8,16,32] [--prompt 128] [--new 128]
        [--threads 2] [--turns 5] [--think 0,2] [--steady-requests 3] [--database-url URL]
        [--out docs/performance/benchmarks] [--server-env NAME=VALUE ...] [--block-size N]

For each model and each client count C:
  * http (a burst): `python -m service serve` in a subprocess; C clients (httpx, one asyncio task each)
    POST /v1/responses with stream=true at once and read the SSE stream. Time to first token (TTFT) is
    from the POST to the first `*.delta` event, inter-token latency (ITL) the gaps between a client's
    deltas (a delta carries several tokens when the server commits steps together, see runs._advance),
    aggregate tokens/s the output tokens of all C responses (usage) over the wall time from the first
    POST to the last terminal event.
  * steady (closed loop, --steady-requests R): each of C clients sends R requests one after another (the
    next as soon as the previous ends), client i starting i/C of one request's duration after client 0,
    so arrivals are spread as in a server under steady load. A client's first request is a warm-up; TTFT
    and ITL are those of the later requests, and tokens/s the tokens that arrived while every client was
    past its warm-up and still busy (a delta counted for its share of its response's tokens by its
    characters), over that window.
  * engine: OnnxEngine in this process, the same C prompts added at once and stepped to the end (what
    the server's engine does, without HTTP, SSE or the event log); TTFT is from the start to a sequence's
    first sampled token, ITL the step gaps.
  * multi-turn (--turns): one client, a conversation chained by previous_response_id, TTFT and decode tok/s
    per turn, on a server with the prefix cache, one that also warms a continued conversation's next turn as
    it decodes (SERVICE_WARM_WHILE_DECODING=1), and one without the cache (SERVICE_PREFIX_CACHE_BYTES=0),
    once for each --think: seconds between a turn's end and the next request (a reader's, or a tool's,
    time; an idle server prefills the next turn's start meanwhile, see RunSupervisor._warm_next_turn).
Models: "tiny" = the built-in shape with random weights (never stops: every run makes --new tokens), "qwen" =
`model build-random --shape qwen2.5-0.5b [--block-size N]` (Harmony vocabulary), cached in --work-dir.
Every prompt is distinct (no prefix shared between clients) and about --prompt tokens long.
Writes http_load.md (a Markdown table) and http_load.png (tokens/s and TTFT vs clients) under --out.
The machine is shared: ratios are from one run each; rerun before trusting a small difference.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np

from service.engine.base import SamplingParams
from service.engine.config import int8_block_name, int8_block_or_default, parse_int8_block
from service.engine.model_dir import ensure_random_model
from service.engine.onnx_engine import OnnxEngine
from service.prompting import chat_format_for
from service.prompting.base import PromptRequest
from tests.conftest import MODEL_CACHE, ServerProcess

ROOT = Path(__file__).resolve().parent.parent
WORDS = [
    "alpha",
    "bravo",
    "charlie",
    "delta",
    "echo",
    "foxtrot",
    "golf",
    "hotel",
    "india",
    "juliet",
    "kilo",
    "lima",
    "mike",
    "oscar",
    "papa",
]


@dataclass
class Sample:
    """What one run of C clients measured."""

    model: str
    path: str  # "http" (a burst), "steady" (closed loop) or "engine"
    clients: int
    tokens: int = 0
    seconds: float = 0.0
    ttft: list[float] = field(default_factory=list)  # seconds, one per client
    itl: list[float] = field(default_factory=list)  # seconds, every gap of every client
    input_tokens: int = 0  # prompt tokens of all C responses (usage; through the server only)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def prompt_texts(model_dir: Path, clients: int, prompt_tokens: int) -> list[str]:
    """Distinct user messages whose rendered prompts are about `prompt_tokens` long."""
    chat_format = chat_format_for(model_dir, json.loads((model_dir / "config.json").read_text()))
    texts = []
    for i in range(clients):
        words = [f"client{i}"]
        # Grow the message until its rendered prompt reaches the target (words are ~1-2 tokens each).
        while True:
            text = " ".join(words)
            if len(chat_format.render(_request(text))) >= prompt_tokens:
                break
            words.append(WORDS[(len(words) + i) % len(WORDS)])
        texts.append(text)
    return texts


def _request(text: str) -> PromptRequest:
    return PromptRequest(items=[{"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}])


# -- the bare engine ---------------------------------------------------------------------------------


def bare_engine(model: str, model_dir: Path, texts: list[str], new_tokens: int, threads: int) -> Sample:
    engine = OnnxEngine(model_dir, intra_op_threads=threads)
    chat_format = chat_format_for(model_dir, json.loads((model_dir / "config.json").read_text()))
    if hasattr(chat_format, "grammar_tokenizer"):
        # Harmony builds its grammar tokenizer in a background thread that holds the GIL for most of a second
        # (a server does so at startup): wait for it rather than let it stall a measured step.
        chat_format.grammar_tokenizer()
    prompts = [chat_format.render(_request(text)) for text in texts]
    sample = Sample(model, "engine", len(texts))
    # Warm-up: ORT allocates and picks kernels on the first runs, and the format's first constraint builds its
    # token tables (the server's warm-up request pays both too).
    engine.add_sequence("warm", prompts[0], SamplingParams(max_new_tokens=2, seed=1), chat_format.new_constraint())
    while engine.active_sequence_ids():
        engine.step()
    started = time.perf_counter()
    last: dict[str, float] = {}
    for i, prompt in enumerate(prompts):
        params = SamplingParams(max_new_tokens=new_tokens, seed=i, logprobs=False)  # as served: none asked
        engine.add_sequence(f"s{i}", prompt, params, chat_format.new_constraint())
    while engine.active_sequence_ids():
        outputs = engine.step()
        now = time.perf_counter()
        for seq_id in outputs:
            if seq_id in last:
                sample.itl.append(now - last[seq_id])
            else:
                sample.ttft.append(now - started)
            last[seq_id] = now
            sample.tokens += 1
    sample.seconds = time.perf_counter() - started
    return sample


# -- through the server ------------------------------------------------------------------------------


async def _one_client(
    client: httpx.AsyncClient, url: str, text: str, new_tokens: int, seed: int, extra: dict[str, object] | None = None
) -> dict[str, object]:
    """`extra`: request fields added to (or replacing) the body's, for another server (bench.side_by_side)."""
    body = {"input": text, "max_output_tokens": new_tokens, "stream": True, "seed": seed, "store": True}
    body.update(extra or {})
    started = time.perf_counter()
    arrivals: list[float] = []
    chars: list[int] = []
    output_tokens = input_tokens = 0
    status = "unknown"
    async with client.stream("POST", url + "/v1/responses", json=body, timeout=600) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):  # other servers may end with "data: [DONE]"
                continue
            event = json.loads(line[len("data: ") :])
            kind = event["type"]
            if kind.endswith(".delta"):
                arrivals.append(time.perf_counter())
                chars.append(len(event["delta"]))
            elif kind in ("response.completed", "response.incomplete", "response.failed"):
                status = event["response"]["status"]
                usage = event["response"].get("usage") or {}
                output_tokens = int(usage.get("output_tokens", 0))
                input_tokens = int(usage.get("input_tokens", 0))
    return {
        "started": started,
        "arrivals": arrivals,
        "chars": chars,
        "tokens": output_tokens,
        "input_tokens": input_tokens,
        "status": status,
    }


async def _clients(
    url: str, texts: list[str], new_tokens: int, extra: dict[str, object] | None = None
) -> list[dict[str, object]]:
    limits = httpx.Limits(max_connections=len(texts) + 4, max_keepalive_connections=len(texts) + 4)
    async with httpx.AsyncClient(limits=limits) as client:
        return await asyncio.gather(*(_one_client(client, url, t, new_tokens, i, extra) for i, t in enumerate(texts)))


def through_server(
    model: str,
    url: str,
    texts: list[str],
    new_tokens: int,
    *,
    warm: str | None = None,
    extra: dict[str, object] | None = None,
) -> Sample:
    """`warm`: the warm-up request's text (default: the first client's); `extra`: see _one_client."""
    asyncio.run(_clients(url, [warm] if warm is not None else texts[:1], 2, extra))  # warm-up
    results = asyncio.run(_clients(url, texts, new_tokens, extra))
    sample = Sample(model, "http", len(texts))
    first = min(float(r["started"]) for r in results)  # type: ignore[arg-type]
    end = first
    for result in results:
        arrivals: list[float] = result["arrivals"]  # type: ignore[assignment]
        if result["status"] == "failed" or not arrivals:
            raise RuntimeError(f"a run streamed no delta (status {result['status']}): give it more tokens")
        sample.ttft.append(arrivals[0] - float(result["started"]))  # type: ignore[arg-type]
        sample.itl.extend(b - a for a, b in zip(arrivals, arrivals[1:], strict=False))
        sample.tokens += int(result["tokens"])  # type: ignore[call-overload]
        sample.input_tokens += int(result["input_tokens"])  # type: ignore[call-overload]
        end = max(end, arrivals[-1])
    sample.seconds = end - first
    return sample


async def _closed_loop(
    client: httpx.AsyncClient, url: str, texts: list[str], new_tokens: int, delay: float, seed: int
) -> list[dict[str, object]]:
    await asyncio.sleep(delay)
    return [await _one_client(client, url, text, new_tokens, seed + k * 1000) for k, text in enumerate(texts)]


def steady(model: str, url: str, texts: list[str], clients: int, requests: int, new_tokens: int) -> Sample:
    """C clients in a closed loop, `requests` each (the first a warm-up), staggered over one request's
    duration; `texts` holds clients * requests + 1 distinct prompts (the last for the sizing run)."""
    warm = asyncio.run(_clients(url, texts[clients * requests :][:1], new_tokens))[0]
    duration = _arrivals(warm)[-1] - _started(warm)

    async def all_clients() -> list[list[dict[str, object]]]:
        limits = httpx.Limits(max_connections=clients + 4, max_keepalive_connections=clients + 4)
        async with httpx.AsyncClient(limits=limits) as client:
            loops = [
                _closed_loop(
                    client, url, texts[i * requests : (i + 1) * requests], new_tokens, i * duration / clients, i
                )
                for i in range(clients)
            ]
            return await asyncio.gather(*loops)

    per_client = asyncio.run(all_clients())
    if any(result["status"] == "failed" or not _arrivals(result) for results in per_client for result in results):
        raise RuntimeError("a run failed or streamed no delta: give it more tokens")
    sample = Sample(model, "steady", clients)
    # The window where every client is past its warm-up and still busy.
    window_start = max(_started(results[1]) for results in per_client)
    window_end = min(_arrivals(results[-1])[-1] for results in per_client)
    for results in per_client:
        for result in results[1:]:
            arrivals = _arrivals(result)
            sample.ttft.append(arrivals[0] - _started(result))
            sample.itl.extend(b - a for a, b in zip(arrivals, arrivals[1:], strict=False))
        for result in results:
            # A delta stands for its share of the response's output tokens by the characters it carries (it
            # may carry several tokens: steps committed together are folded; Harmony headers stream none).
            arrivals, chars = _arrivals(result), result["chars"]
            assert isinstance(chars, list)
            share = int(str(result["tokens"])) / max(1, sum(chars))
            inside = sum(n for t, n in zip(arrivals, chars, strict=True) if window_start <= t <= window_end)
            sample.tokens += round(share * inside)
    sample.seconds = max(0.0, window_end - window_start)
    return sample


def _arrivals(result: dict[str, object]) -> list[float]:
    arrivals = result["arrivals"]
    assert isinstance(arrivals, list)
    return arrivals


def _started(result: dict[str, object]) -> float:
    return float(str(result["started"]))


# The multi-turn part's servers: the prefix cache as served by default, with the next turn also warmed while a
# continued conversation decodes (Settings.warm_while_decoding), and off.
CACHE_CONFIGURATIONS: tuple[tuple[str, dict[str, str]], ...] = (
    ("on", {}),
    ("on, warmed while decoding", {"SERVICE_WARM_WHILE_DECODING": "1"}),
    ("off", {"SERVICE_PREFIX_CACHE_BYTES": "0"}),
)


def multi_turn(url: str, turns: int, new_tokens: int, words: int, think: float = 0.0) -> list[tuple[float, float]]:
    """Each turn of one conversation chained by previous_response_id, `think` seconds after the previous turn
    ended: (TTFT in seconds, decode tokens/s: its output tokens after the first delta over the time from that
    delta to the end)."""

    async def run() -> list[tuple[float, float]]:
        ttfts: list[tuple[float, float]] = []
        previous: str | None = None
        async with httpx.AsyncClient() as client:
            warm = {"input": "warm up", "max_output_tokens": 2}  # the server's first run pays ORT's first-run costs
            (await client.post(url + "/v1/responses", json=warm, timeout=600)).raise_for_status()
            for turn in range(turns):
                text = " ".join(WORDS[(turn + i) % len(WORDS)] for i in range(words))
                body = {
                    "input": f"think {think:g}, turn {turn}: {text}",
                    "max_output_tokens": new_tokens,
                    "stream": True,
                    "seed": 1,
                }
                if previous is not None:
                    body["previous_response_id"] = previous
                    await asyncio.sleep(think)
                started = time.perf_counter()
                first: float | None = None
                output_tokens = 0
                async with client.stream("POST", url + "/v1/responses", json=body, timeout=600) as response:
                    response.raise_for_status()
                    async for line in response.aiter_lines():
                        if not line.startswith("data: "):
                            continue
                        event = json.loads(line[len("data: ") :])
                        if event["type"] == "response.created":
                            previous = event["response"]["id"]
                        elif event["type"].endswith(".delta") and first is None:
                            first = time.perf_counter()
                        elif event["type"] in ("response.completed", "response.incomplete"):
                            output_tokens = (event["response"].get("usage") or {}).get("output_tokens", 0)
                ended = time.perf_counter()
                first = first or ended
                ttfts.append((first - started, max(output_tokens - 1, 0) / max(ended - first, 1e-9)))
        return ttfts

    return asyncio.run(run())


# -- models, report ----------------------------------------------------------------------------------


def model_dir_for(model: str, work_dir: Path, block: int | None = None) -> Path:
    """`block`: the Qwen shape's int8 block size (None: build-random's default, default_int8_block())."""
    if model == "tiny":
        return ensure_random_model(MODEL_CACHE, progress=False)
    if model == "qwen":
        name = int8_block_name(int8_block_or_default(block))  # the default depends on the CPU
        target = work_dir / f"qwen2.5-0.5b-harmony-b{name}"
        if not (target / "config.json").exists():
            command = [sys.executable, "-m", "service", "model", "build-random", "--shape", "qwen2.5-0.5b", str(target)]
            command += ["--block-size", int8_block_name(block)] if block is not None else []
            subprocess.run(command, check=True, cwd=ROOT)
        return target
    return Path(model)  # any servable model directory


def markdown(
    samples: list[Sample],
    prompt: int,
    new: int,
    threads: int,
    turns: dict[tuple[str, str, float], list[tuple[float, float]]],
    block: int | None = None,
) -> str:
    int8 = f"; Qwen shape's int8 block size: {int8_block_name(block)}" if block is not None else ""
    lines = [
        f"Prompt ≈{prompt} tokens, {new} output tokens per client, {threads} ORT threads{int8}; "
        f"machine: {machine()}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.",
        "",
        "| model | path | clients | tokens/s | × 1 client | http ÷ engine | TTFT p50 ms | TTFT p99 ms "
        "| TTFT p50 ÷ 1 client | ITL p50 ms | ITL p99 ms |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    fewest = min(x.clients for x in samples)
    base = {(s.model, s.path): s for s in samples if s.clients == fewest}
    engine = {(s.model, s.clients): s.tokens_per_second for s in samples if s.path == "engine"}
    for s in samples:
        one = base.get((s.model, s.path))
        speedup = s.tokens_per_second / one.tokens_per_second if one and one.tokens_per_second else float("nan")
        slower = percentile(s.ttft, 50) / percentile(one.ttft, 50) if one else float("nan")
        ratio = f"{s.tokens_per_second / engine[(s.model, s.clients)]:.2f}" if s.path != "engine" else ""
        lines.append(
            f"| {s.model} | {s.path} | {s.clients} | {s.tokens_per_second:.1f} | {speedup:.2f} "
            f"| {ratio} | {percentile(s.ttft, 50) * 1e3:.0f} | {percentile(s.ttft, 99) * 1e3:.0f} | {slower:.2f} "
            f"| {percentile(s.itl, 50) * 1e3:.1f} | {percentile(s.itl, 99) * 1e3:.1f} |"
        )
    if turns:
        count = max(len(t) for t in turns.values())
        lines += [
            "",
            f"Multi-turn: one client, {count} turns chained by previous_response_id (each turn ≈{prompt} new "
            f"prompt tokens, {new} output tokens), the next turn sent `think` seconds after the previous one "
            "ended; time to first token per turn, ms, and each turn's decode rate after its first token (a "
            "continued conversation's next turn is prefilled beside its decoding: RunSupervisor._warm_partial_turn).",
            "",
            "| model | prefix cache | think s | "
            + " | ".join(f"turn {i + 1}" for i in range(count))
            + " | last ÷ first | decode tok/s, turn 1 / later turns |",
            "| --- | --- | ---: | " + " | ".join("---:" for _ in range(count)) + " | ---: | ---: |",
        ]
        for (model, cache, think), per_turn in turns.items():
            ttfts = [ttft for ttft, _ in per_turn]
            rates = [rate for _, rate in per_turn]
            cells = " | ".join(f"{t * 1e3:.0f}" for t in ttfts)
            later = statistics.mean(rates[1:]) if len(rates) > 1 else float("nan")
            growth = ttfts[-1] / ttfts[0]
            lines.append(f"| {model} | {cache} | {think:g} | {cells} | {growth:.2f} | {rates[0]:.1f} / {later:.1f} |")
    return "\n".join(lines) + "\n"


def plot(samples: list[Sample], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for key in sorted({(s.model, s.path) for s in samples}):
        rows = sorted((s for s in samples if (s.model, s.path) == key), key=lambda s: s.clients)
        clients = [s.clients for s in rows]
        left.plot(clients, [s.tokens_per_second for s in rows], marker="o", label=f"{key[0]} {key[1]}")
        right.plot(clients, [percentile(s.ttft, 50) * 1e3 for s in rows], marker="o", label=f"{key[0]} {key[1]}")
    left.set(xlabel="concurrent clients", ylabel="aggregate tokens/s", xscale="log", yscale="log", title="throughput")
    right.set(xlabel="concurrent clients", ylabel="median TTFT (ms)", xscale="log", yscale="log", title="TTFT")
    ticks = sorted({s.clients for s in samples})
    for axis in (left, right):
        axis.set_xticks(ticks, [str(t) for t in ticks])
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def machine() -> str:
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout.splitlines():
            if line.startswith("Model name:"):
                return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} CPUs"
    except (OSError, subprocess.CalledProcessError):
        pass
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs"


def run(
    models: list[str],
    clients: list[int],
    *,
    prompt: int,
    new: int,
    threads: int,
    out: Path,
    work_dir: Path,
    database_url: str | None = None,
    server_env: dict[str, str] | None = None,
    turns: int = 0,
    think: tuple[float, ...] = (0.0,),
    steady_requests: int = 0,
    block: int | None = None,
) -> list[Sample]:
    """Measure every (model, path, clients) and write http_load.md / http_load.png under `out`."""
    samples: list[Sample] = []
    conversations: dict[tuple[str, str, float], list[tuple[float, float]]] = {}
    out.mkdir(parents=True, exist_ok=True)
    for model in models:
        model_dir = model_dir_for(model, work_dir, block)
        # Distinct prompts: the burst's, then the closed loop's (no prefix shared with an earlier run).
        texts = prompt_texts(model_dir, max(clients) * (1 + steady_requests) + 1, prompt)
        burst, loop_texts = texts[: max(clients)], texts[max(clients) :]
        for count in clients:
            samples.append(bare_engine(model, model_dir, burst[:count], new, threads))
            print(_line(samples[-1]), flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            url = database_url or f"sqlite+aiosqlite:///{tmp}/bench.db"
            env = {"SERVICE_MODEL": str(model_dir), "SERVICE_INTRA_OP_THREADS": str(threads), **(server_env or {})}
            server = ServerProcess(url, Path(tmp) / "server.log", **env).start(timeout=600)
            try:
                for count in clients:
                    samples.append(through_server(model, server.url, burst[:count], new))
                    print(_line(samples[-1]), flush=True)
                for count in clients if steady_requests >= 2 else ():
                    samples.append(steady(model, server.url, loop_texts, count, steady_requests, new))
                    print(_line(samples[-1]), flush=True)
            finally:
                server.stop()
            for number, (cache, cache_env) in enumerate(CACHE_CONFIGURATIONS if turns else ()):
                log_path = Path(tmp) / f"turns-{number}.log"
                db_url = f"sqlite+aiosqlite:///{tmp}/turns-{number}.db"
                server = ServerProcess(db_url, log_path, **env, **cache_env).start(timeout=600)
                try:
                    for pause in think:
                        per_turn = multi_turn(server.url, turns, new, words=prompt // 2, think=pause)
                        conversations[(model, cache, pause)] = per_turn
                        print(
                            model,
                            f"prefix cache {cache}, think {pause:g} s: TTFT per turn (ms)",
                            [round(t * 1e3) for t, _ in per_turn],
                            "decode tok/s",
                            [round(rate, 1) for _, rate in per_turn],
                            flush=True,
                        )
                finally:
                    server.stop()
    samples.sort(key=lambda s: (s.model, ["http", "steady", "engine"].index(s.path), s.clients))
    (out / "http_load.md").write_text(markdown(samples, prompt, new, threads, conversations, block))
    plot(samples, out / "http_load.png")
    return samples


def _line(s: Sample) -> str:
    return (
        f"{s.model:6} {s.path:6} clients={s.clients:3} {s.tokens_per_second:8.1f} tok/s  "
        f"TTFT p50 {percentile(s.ttft, 50) * 1e3:7.0f} ms  ITL p50 {percentile(s.itl, 50) * 1e3:6.1f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="tiny,qwen")
    parser.add_argument("--clients", default="1,4,8,16,32")
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--new", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "performance" / "benchmarks")
    parser.add_argument("--work-dir", type=Path, default=ROOT / ".cache" / "bench")
    parser.add_argument("--server-env", action="append", default=[], help="NAME=VALUE for the server")
    parser.add_argument("--turns", type=int, default=5, help="multi-turn part: turns per conversation (0 = skip)")
    parser.add_argument(
        "--think", default="0,2", help="multi-turn part: seconds between a turn's end and the next request (list)"
    )
    parser.add_argument(
        "--steady-requests",
        type=int,
        default=3,
        help="closed-loop part: requests per client, the first a warm-up (0 = skip)",
    )
    parser.add_argument(
        "--block-size",
        type=parse_int8_block,
        default=None,
        help="the Qwen shape's int8 block size: row, 16..256 or auto",
    )
    args = parser.parse_args()
    run(
        args.models.split(","),
        [int(c) for c in args.clients.split(",")],
        prompt=args.prompt,
        new=args.new,
        threads=args.threads,
        out=args.out,
        work_dir=args.work_dir,
        database_url=args.database_url,
        server_env=dict(item.split("=", 1) for item in args.server_env),
        turns=args.turns,
        think=tuple(float(t) for t in args.think.split(",")),
        steady_requests=args.steady_requests,
        block=args.block_size,
    )
    print((args.out / "http_load.md").read_text())


if __name__ == "__main__":
    main()
