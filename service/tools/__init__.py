"""Server-side tools: MCP servers, the sandboxed code interpreter, and the registry a run calls them through."""

from __future__ import annotations

import logging

from service.config import Settings
from service.tools.sandbox import Sandbox, SandboxUnavailable
from service.tools.sandbox_command import SandboxLimits

log = logging.getLogger(__name__)


def sandbox_from_settings(settings: Settings) -> Sandbox:
    limits = SandboxLimits(
        wall_seconds=settings.sandbox_wall_seconds,
        cpu_seconds=settings.sandbox_cpu_seconds,
        memory_bytes=settings.sandbox_memory_bytes,
        processes=settings.sandbox_processes,
        output_bytes=settings.tool_output_bytes,
        disk_bytes=settings.sandbox_disk_bytes,
        disk_files=settings.sandbox_disk_files,
        shm_bytes=settings.sandbox_shm_bytes,
        tmp_bytes=settings.sandbox_tmp_bytes,
        max_concurrent=settings.sandbox_max_concurrent,
        max_per_tenant=settings.sandbox_max_per_project,
    )
    return Sandbox(settings.sandbox_dir, limits)


async def report_sandbox(settings: Settings) -> str | None:
    """Log at start-up whether the code interpreter's sandbox works here; the reason it does not, or None."""
    try:
        described = await sandbox_from_settings(settings).probe()
    except (SandboxUnavailable, OSError) as exc:
        log.warning("code interpreter unavailable: %s", exc)
        return str(exc)
    except Exception as exc:  # a fault of the probe itself must not stop the server: it serves without the tool
        log.exception("code interpreter unavailable: its sandbox probe raised")
        return f"the sandbox probe raised {type(exc).__name__}: {exc}"
    log.info("code interpreter available: %s", described)
    return None
