"""The run loop: `RunSupervisor` (supervisor.py) built on its parts, and a run's state (state.py).

`RunSupervisor` is imported on first use: service.agent.steps (which the supervisor uses) imports
service.runs.state, and importing the supervisor here would close that loop."""

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
