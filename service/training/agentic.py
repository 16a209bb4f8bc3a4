"""Coding-agent samples shaped like Codex CLI's traffic (issue 41): a request with Codex-style tools (`exec_command`
with `cmd`/`workdir`, `write_stdin`, a custom `apply_patch` with a Lark grammar, a namespace), developer messages
(long instructions, a skills list, permissions), the user's `<environment_context>`, then a file task. The model
calls `exec_command` with a command that does the task, then, after the command's output (in Codex's format),
ends with a short final answer.

Five tasks: create a file with given content, show a file, list a directory, append a line, rename a file. File
names are drawn from words and random syllables, so that the call copies a name rather than recalls one.

`AgentTask` carries what the bench needs to check a completion by running it (bench/agentic_quality.py): the
files to lay out in a scratch directory and what must hold afterwards."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from service.prompting.base import ConversationItem, PromptRequest
from service.protocol.requests import CreateResponseRequest
from service.protocol.tools import model_tools
from service.training import words
from service.training.sample import EFFORTS, Sample, Step, pick, reasoning_for, user_item

TaskKind = Literal["create", "show", "list", "append", "rename"]
TASK_KINDS: tuple[TaskKind, ...] = ("create", "show", "list", "append", "rename")
EXEC = "exec_command"

_EXTENSIONS = ("txt", "md", "py", "json", "csv", "log", "yaml", "sh", "toml", "cfg", "rs", "js", "html", "ini")
_SYLLABLES = [
    "ka",
    "ro",
    "mi",
    "tu",
    "le",
    "zan",
    "bel",
    "dor",
    "fin",
    "gra",
    "hol",
    "jun",
    "kex",
    "lum",
    "nor",
    "pex",
    "qui",
    "rav",
    "sol",
    "tek",
    "ul",
    "vin",
    "wex",
    "yor",
    "zed",
    "bra",
    "cli",
    "dre",
    "fra",
    "glo",
    "kri",
    "plo",
    "sta",
    "tri",
    "ux",
    "ab",
    "or",
    "en",
    "it",
    "ix",
]
_STEMS = [
    "notes",
    "todo",
    "readme",
    "config",
    "main",
    "app",
    "utils",
    "data",
    "report",
    "draft",
    "log",
    "index",
    "setup",
    "build",
    "test",
    "server",
    "client",
    "hello",
    "world",
    "output",
    "input",
    "summary",
    "changelog",
    "list",
    "items",
    "tasks",
    "ideas",
    "plan",
    "schedule",
    "budget",
    "script",
    "backup",
    "settings",
    "deploy",
    "release",
    "version",
    "paths",
    "params",
    "values",
    "results",
    "cache",
    "temp",
    "sample",
    "example",
    "demo",
]
_DIRS = ("src", "docs", "tests", "notes", "data", "scripts", "lib", "config", "assets", "build", "tmp", "examples")


@dataclass(frozen=True)
class AgentTask:
    """A file task, what the scratch directory holds before it, and the facts a correct command leaves."""

    kind: TaskKind
    user: str  # the request's text
    command: str  # a shell command that does it (the one the corpus trains)
    files: dict[str, str] = field(default_factory=dict)  # path -> content, laid out before the command
    expect_files: dict[str, str] = field(default_factory=dict)  # path -> content (stripped) afterwards
    expect_absent: tuple[str, ...] = ()  # paths that must no longer exist
    expect_output: tuple[str, ...] = ()  # strings the command's output must contain
    answer: str = ""  # the final answer the corpus trains after the command's output

    def output_text(self, out: str) -> str:
        """The answer once the command printed `out` (the show and list answers quote it)."""
        return self.answer.replace("{out}", out.strip())


def _syllable_name(rng: np.random.Generator) -> str:
    return "".join(pick(rng, _SYLLABLES) for _ in range(int(rng.integers(2, 4))))


def file_name(rng: np.random.Generator) -> str:
    """A file name: a word, two joined by `_` or `-`, or syllables, sometimes a digit, then an extension."""
    r = rng.random()
    if r < 0.35:
        stem = pick(rng, _STEMS)
    elif r < 0.6:
        stem = pick(rng, _STEMS) + pick(rng, ["_", "-"]) + pick(rng, words.NOUNS + words.COLORS + words.ANIMALS)
    elif r < 0.8:
        stem = _syllable_name(rng)
    else:
        stem = pick(rng, words.ANIMALS + words.COLORS + words.NOUNS)
    if rng.random() < 0.25:
        stem += str(int(rng.integers(1, 100)))
    return f"{stem}.{pick(rng, _EXTENSIONS)}"


def _content(rng: np.random.Generator) -> str:
    """A file's text: a word, a number, or a short phrase (no quotes, so single-quoting it is safe)."""
    r = rng.random()
    if r < 0.3:
        return pick(rng, ["hi", "hello", "ok", "done", "yes", "no", "test", "todo"] + list(words.COLORS))
    if r < 0.45:
        return str(int(rng.integers(0, 100000)))
    phrase = [pick(rng, words.ADJECTIVES), pick(rng, words.NOUNS)]
    if rng.random() < 0.5:
        phrase = [pick(rng, words.VERBS), "the", *phrase]
    return " ".join(phrase)


def _quoted(text: str) -> str:
    return text if text.replace(".", "").isalnum() else shlex.quote(text)


def make_task(rng: np.random.Generator) -> AgentTask:
    kind = TASK_KINDS[int(rng.integers(len(TASK_KINDS)))]
    name = file_name(rng)
    if kind == "create":
        text = _content(rng)
        user = pick(
            rng,
            [
                "Create a file named {f} containing the word {t}",
                "Create a file named {f} containing {t}",
                "Create {f} with the text {t}",
                "Write {t} to a new file {f}",
                "Make a file called {f} that says {t}",
                "create {f} containing {t}",
            ],
        ).format(f=name, t=text)
        return AgentTask(
            kind, user, f"echo {_quoted(text)} > {name}", expect_files={name: text},
            answer=pick(rng, [f"Created {name} containing {text}.", f"Done: {name} now contains {text}."]),
        )  # fmt: skip
    if kind == "show":
        text = _content(rng)
        user = pick(
            rng, ["Show me {f}", "What is in {f}?", "Print the contents of {f}", "Show the file {f}", "cat {f}"]
        ).format(f=name)
        return AgentTask(
            kind, user, f"cat {name}", files={name: text + "\n"}, expect_output=(text,),
            answer=pick(rng, [f"{name} contains: {{out}}", f"The file {name} says: {{out}}"]),
        )  # fmt: skip
    if kind == "list":
        folder = pick(rng, _DIRS)
        names = sorted({file_name(rng) for _ in range(int(rng.integers(1, 4)))})
        user = pick(
            rng, ["List the files in {d}", "What files are in {d}?", "Show the directory {d}", "ls {d}"]
        ).format(d=folder)
        return AgentTask(
            kind, user, f"ls {folder}", files={f"{folder}/{n}": "x\n" for n in names}, expect_output=tuple(names),
            answer=pick(rng, [f"{folder} contains: {{out}}", f"The files in {folder}: {{out}}"]),
        )  # fmt: skip
    if kind == "append":
        old, text = _content(rng), _content(rng)
        user = pick(
            rng,
            ["Append the line {t} to {f}", "Add the line {t} at the end of {f}", "Append {t} to {f}"],
        ).format(f=name, t=text)
        return AgentTask(
            kind, user, f"echo {_quoted(text)} >> {name}", files={name: old + "\n"},
            expect_files={name: f"{old}\n{text}"},
            answer=pick(rng, [f"Appended {text} to {name}.", f"Added the line {text} to {name}."]),
        )  # fmt: skip
    new = file_name(rng)
    while new == name:
        new = file_name(rng)
    text = _content(rng)
    user = pick(rng, ["Rename {a} to {b}", "Move {a} to {b}", "rename the file {a} to {b}"]).format(a=name, b=new)
    return AgentTask(
        kind, user, f"mv {name} {new}", files={name: text + "\n"}, expect_files={new: text}, expect_absent=(name,),
        answer=pick(rng, [f"Renamed {name} to {new}.", f"Moved {name} to {new}."]),
    )  # fmt: skip


# --- the request around a task: Codex-style tools, developer messages, environment ---

_APPLY_PATCH_GRAMMAR = """start: begin_patch hunk+ end_patch
begin_patch: "*** Begin Patch" LF
end_patch: "*** End Patch" LF?
hunk: add_hunk | delete_hunk | update_hunk
add_hunk: "*** Add File: " filename LF add_line+
delete_hunk: "*** Delete File: " filename LF
update_hunk: "*** Update File: " filename LF change+
filename: /(.+)/
add_line: "+" /(.*)/ LF -> line
change: (change_context | change_line)+
change_context: ("@@" | "@@ " /(.+)/) LF
change_line: ("+" | "-" | " ") /(.*)/ LF
%import common.LF
"""


def _exec_tool(rng: np.random.Generator) -> dict[str, Any]:
    props: dict[str, Any] = {
        "cmd": {"type": "string", "description": pick(rng, ["Shell command to execute.", "The command to run."])},
        "workdir": {"type": "string", "description": "Working directory for the command. Defaults to the turn cwd."},
    }
    for extra, spec in (
        ("justification", {"type": "string", "description": "Why the command needs approval; omit otherwise."}),
        ("login", {"type": "boolean", "description": "Run a login shell. Omit to inherit."}),
        ("max_output_tokens", {"type": "number", "description": "Output token budget."}),
        ("shell", {"type": "string", "description": "Shell binary to launch."}),
        ("tty", {"type": "boolean", "description": "Allocate a PTY for the command."}),
        ("yield_time_ms", {"type": "number", "description": "Wait before yielding output, in ms."}),
    ):
        if rng.random() < 0.6:
            props[extra] = spec
    return {
        "type": "function",
        "name": EXEC,
        "description": pick(
            rng,
            [
                "Runs a command in a PTY, returning output or a session ID for ongoing interaction.",
                "Runs a shell command and returns its output.",
            ],
        ),
        "parameters": {"type": "object", "properties": props, "required": ["cmd"], "additionalProperties": False},
        "strict": False,
    }


def _other_tools(rng: np.random.Generator) -> list[dict[str, Any]]:
    tools: list[dict[str, Any]] = []
    if rng.random() < 0.7:
        tools.append(
            {
                "type": "function",
                "name": "write_stdin",
                "description": "Writes characters to an existing exec session and returns recent output.",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "session_id": {"type": "number", "description": "The running session."},
                        "chars": {"type": "string", "description": "Bytes to write to stdin."},
                    },
                    "required": ["session_id"],
                },
                "strict": False,
            }
        )
    if rng.random() < 0.6:
        tools.append(
            {
                "type": "custom",
                "name": "apply_patch",
                "description": "Use the `apply_patch` tool to edit files. This is a FREEFORM tool.",
                "format": {"type": "grammar", "syntax": "lark", "definition": _APPLY_PATCH_GRAMMAR},
            }
        )
    if rng.random() < 0.5:
        tools.append(
            {
                "type": "function",
                "name": "view_image",
                "description": "View a local image file from the filesystem.",
                "parameters": {
                    "type": "object",
                    "properties": {"path": {"type": "string", "description": "Local path to an image file."}},
                    "required": ["path"],
                },
                "strict": False,
            }
        )
    if rng.random() < 0.6:
        tools.append(
            {
                "type": "namespace",
                "name": pick(rng, ["multi_agent_v1", "agents", "workspace"]),
                "description": "Tools for spawning and managing sub-agents.",
                "tools": [
                    {
                        "type": "function",
                        "name": name,
                        "description": description,
                        "parameters": {
                            "type": "object",
                            "properties": {"target": {"type": "string", "description": "The agent's id."}},
                            "required": ["target"],
                        },
                        "strict": False,
                    }
                    for name, description in (
                        ("spawn_agent", "Start a sub-agent on a task."),
                        ("close_agent", "Close an agent that is no longer needed."),
                        ("wait_agent", "Wait for an agent to finish."),
                    )
                    if rng.random() < 0.8
                ]
                or [
                    {
                        "type": "function",
                        "name": "spawn_agent",
                        "description": "Start a sub-agent on a task.",
                        "parameters": {"type": "object", "properties": {}},
                        "strict": False,
                    }
                ],
            }
        )
    if rng.random() < 0.4:
        tools.append({"type": "web_search"})
    return tools


def codex_tools(rng: np.random.Generator) -> tuple[dict[str, Any], ...]:
    """Responses-shaped tools as Codex sends them, reduced to what the server offers the model (model_tools)."""
    tools = [_exec_tool(rng), *_other_tools(rng)]
    order = [0] + (1 + rng.permutation(len(tools) - 1)).tolist() if rng.random() < 0.7 else rng.permutation(len(tools))
    raw = [tools[int(i)] for i in order]
    request = CreateResponseRequest.model_validate({"model": "builtin", "input": "", "tools": raw})
    return tuple(model_tools(request.tools))


_GUIDE_SUBJECTS = (
    "the user", "the workspace", "the repository", "each change", "a command", "the shell", "every file",
    "the tests", "the final answer", "a patch", "the plan", "your reply", "the code", "a tool call",
)  # fmt: skip
_GUIDE_VERBS = (
    "should stay", "must be", "is kept", "can be", "needs to be", "is usually", "should never be", "is always",
)  # fmt: skip
_GUIDE_ENDS = (
    "small and focused", "easy to review", "consistent with the existing style", "explained in one sentence",
    "checked before you finish", "run from the workspace root", "written in plain language",
    "limited to what the user asked", "safe to run twice", "clear about what changed", "free of secrets",
    "formatted as the project expects", "short unless asked otherwise", "reported honestly",
)  # fmt: skip
_HEADINGS = (
    "General", "Editing constraints", "Planning", "Shell commands", "Testing", "Presenting your work",
    "Autonomy", "Code review", "Formatting", "Safety", "Tool guidelines", "Final answer structure",
)  # fmt: skip


CHARS_PER_TOKEN = 4  # about right for these English lines in o200k (the bench measures the real prompt length)


def guideline_text(rng: np.random.Generator, tokens: int) -> str:
    """Instructions in the style of an agent's developer prompt, about `tokens` tokens long."""
    parts = [
        pick(
            rng,
            [
                "You are a coding agent running in a terminal-based coding assistant.",
                "You are a coding agent. You are expected to be precise, safe, and helpful.",
                "You are an expert software engineer working in the user's repository.",
            ],
        )
    ]
    size = len(parts[0])
    while size < tokens * CHARS_PER_TOKEN:
        if rng.random() < 0.15:
            line = f"\n# {pick(rng, _HEADINGS)}\n"
        else:
            line = f"- {pick(rng, _GUIDE_SUBJECTS).capitalize()} {pick(rng, _GUIDE_VERBS)} {pick(rng, _GUIDE_ENDS)}."
            if rng.random() < 0.3:
                line += f" Prefer `{pick(rng, ['rg', 'git', 'ls', 'cat', 'sed', 'make', 'pytest'])}` when it helps."
        parts.append(line)
        size += len(line) + 1
    return "\n".join(parts)


def _skills(rng: np.random.Generator) -> str:
    lines = ["<skills_instructions>", "## Skills", "A skill is a set of local instructions stored in a SKILL.md file."]
    for _ in range(int(rng.integers(1, 5))):
        name = f"{pick(rng, _STEMS)}-{pick(rng, _STEMS)}"
        lines.append(
            f"- {name}: {pick(rng, _GUIDE_SUBJECTS).capitalize()} {pick(rng, _GUIDE_ENDS)}. (file: r0/{name}/SKILL.md)"
        )
    lines.append("</skills_instructions>")
    return "\n".join(lines)


def _permissions(rng: np.random.Generator) -> str:
    mode = pick(rng, ["danger-full-access", "workspace-write", "read-only"])
    return (
        "<permissions instructions>\n"
        f"Filesystem sandboxing defines which files can be read or written. `sandbox_mode` is `{mode}`.\n"
        f"Approval policy is currently {pick(rng, ['never', 'on-request', 'untrusted'])}.\n"
        "</permissions instructions>"
    )


def environment_context(rng: np.random.Generator) -> str:
    cwd = pick(rng, ["/tmp", "/home/user", "/work", "/srv", "/root"]) + "/" + pick(rng, _STEMS + list(_DIRS))
    return (
        "<environment_context>\n"
        f"  <cwd>{cwd}</cwd>\n"
        f"  <shell>{pick(rng, ['bash', 'zsh', 'sh'])}</shell>\n"
        f"  <current_date>2026-{int(rng.integers(1, 13)):02d}-{int(rng.integers(1, 29)):02d}</current_date>\n"
        f"  <timezone>{pick(rng, ['Etc/UTC', 'Europe/Berlin', 'America/New_York', 'Asia/Tokyo'])}</timezone>\n"
        "</environment_context>"
    )


def _message(role: str, text: str) -> ConversationItem:
    return {"type": "message", "role": role, "content": [{"type": "input_text", "text": text}]}


def codex_request_items(rng: np.random.Generator, task: AgentTask, instruction_tokens: int) -> list[ConversationItem]:
    """The input items before the model's turn: developer messages (instructions, skills, permissions; each
    sometimes left out), the environment, then the task."""
    items: list[ConversationItem] = []
    if instruction_tokens > 0:
        items.append(_message("developer", guideline_text(rng, instruction_tokens)))
    if rng.random() < 0.7:
        items.append(_message("developer", _skills(rng) + (_permissions(rng) if rng.random() < 0.8 else "")))
    if rng.random() < 0.8:
        items.append(_message("user", environment_context(rng)))
    items.append(user_item(task.user))
    return items


def exec_output(rng: np.random.Generator, out: str, code: int = 0) -> str:
    """A command's result as Codex reports it to the model."""
    return (
        f"Chunk ID: {int(rng.integers(1 << 24)):06x}\n"
        f"Wall time: 0.{int(rng.integers(0, 10000)):04d} seconds\n"
        f"Process exited with code {code}\n"
        f"Original token count: {len(out.split())}\n"
        f"Output:\n{out}"
    )


def task_output(task: AgentTask) -> str:
    """What the trained command prints when it runs in the task's scratch directory."""
    if task.kind == "show":
        return next(iter(task.files.values()))
    if task.kind == "list":
        return "".join(p.split("/", 1)[1] + "\n" for p in sorted(task.files))
    return ""


def call_arguments(task: AgentTask) -> str:
    return json.dumps({"cmd": task.command})


@dataclass(frozen=True)
class AgentSample:
    sample: Sample
    task: AgentTask


def make_agentic_sample(
    rng: np.random.Generator, *, instruction_tokens: int, after_output: bool | None = None
) -> AgentSample:
    """One turn of a task: the call (the task's first request), or the final answer after the command's output."""
    task = make_task(rng)
    effort = EFFORTS[int(rng.integers(3))]
    request_items = codex_request_items(rng, task, instruction_tokens)
    tools = codex_tools(rng)
    think = reasoning_for(
        [
            f"The user asks: {task.user.rstrip('.?!')}.",
            f"I will run `{task.command}`.",
            "Then I will report the result.",
        ],
        effort,
    )
    arguments = call_arguments(task)
    if after_output is None:
        after_output = bool(rng.random() < 0.5)
    if not after_output:
        steps = (Step("analysis", think), Step("call", arguments, EXEC))
        request = PromptRequest(items=request_items, tools=tools, reasoning_effort=effort)
        return AgentSample(Sample(request, steps, "call", tool=EXEC, argument=("cmd", task.command)), task)
    call_id = f"call_{int(rng.integers(1 << 40)):x}"
    out = task_output(task)
    turn: list[ConversationItem] = []
    if rng.random() < 0.5:
        turn.append({"type": "reasoning", "content": [{"type": "reasoning_text", "text": think}], "summary": []})
    turn.append({"type": "function_call", "call_id": call_id, "name": EXEC, "arguments": arguments})
    turn.append({"type": "function_call_output", "call_id": call_id, "output": exec_output(rng, out)})
    answer = task.output_text(out.replace("\n", " ").strip() if task.kind == "list" else out)
    done = reasoning_for(["The command succeeded.", "I will tell the user what changed.", "Keep it short."], effort)
    steps = (Step("analysis", done), Step("final", answer))
    request = PromptRequest(items=request_items + turn, tools=tools, reasoning_effort=effort)
    return AgentSample(Sample(request, steps, "after_tool", salient=out.strip() or None), task)
