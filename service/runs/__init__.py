"""The run loop: `RunSupervisor` (supervisor.py) built on its parts, and a run's state (state.py).

`RunSupervisor` is imported on first use: what needs only a run's state (service.runs.state: replay, the
stream archive) does not load the supervisor and its parts with it."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from service.runs.supervisor import RunSupervisor

__all__ = ["RunSupervisor"]


def __getattr__(name: str) -> object:
    if name == "RunSupervisor":
        from service.runs.supervisor import RunSupervisor

        return RunSupervisor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
