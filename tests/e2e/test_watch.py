"""`serve --watch`: a change under a skills root reaches connected clients as
list_changed (legacy: on the session; 2026-07-28: on a subscriptions/listen
stream) and the next list shows it; a save that changes nothing sends
nothing. (Calls in flight keeping their snapshot is a unit test of the
snapshot cell: it is an ordering property, not something a client can time.)

The "nothing" is proven by events, not by waiting: the server logs every
rescan (`SKILL_OPERATOR_LOG=...=debug`), the test waits for the rescan of the
unchanged save to be logged, and only then makes the real change; the first
notification must be the real one.
"""

from __future__ import annotations

import os
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator

import anyio
import pytest
from mcp import Client, StdioServerParameters, types
from mcp.client.stdio import stdio_client

from conftest import CLIENT_TIMEOUT, HttpServer, _unwrapped, all_prompts, http_client, write_skill

pytestmark = pytest.mark.anyio

LOG_ENV = {"SKILL_OPERATOR_LOG": "skill_operator::serve::watch=debug"}
NOTICE_TIMEOUT = 20.0


def _env() -> dict[str, str]:
    return {**os.environ, **LOG_ENV}


@asynccontextmanager
async def watched(binary: Path, transport: str, mode: str, root: Path, log: Path, **client_kwargs: Any) -> AsyncIterator[Client]:
    args = ["serve", "--watch", "--read-only", "--skills", str(root)]
    if transport == "stdio":
        params = StdioServerParameters(command=str(binary), args=args, cwd=str(root.parent), env=_env())
        with open(log, "w") as errlog, _unwrapped(), anyio.fail_after(CLIENT_TIMEOUT * 2):
            async with Client(stdio_client(params, errlog=errlog), mode=mode, **client_kwargs) as client:
                yield client
    else:
        server = HttpServer(binary, [], log, args=[str(binary), *args], env=_env())
        try:
            url = await anyio.to_thread.run_sync(server.wait_ready)
            with _unwrapped(), anyio.fail_after(CLIENT_TIMEOUT * 2):
                async with http_client(url, server.token, mode, **client_kwargs) as client:
                    yield client
        finally:
            server.stop()


def _log_lines(log: Path, needle: str) -> int:
    try:
        return sum(1 for line in log.read_text(errors="replace").splitlines() if needle in line)
    except FileNotFoundError:
        return 0


async def _wait_for_log(log: Path, needle: str, count: int) -> None:
    """Until the server has logged `needle` `count` times (it writes its log as it goes)."""
    with anyio.fail_after(NOTICE_TIMEOUT):
        while _log_lines(log, needle) < count:
            await anyio.sleep(0.05)


def _names(prompts: list[Any]) -> set[str]:
    return {p.name for p in prompts}


@pytest.mark.parametrize("transport", ["stdio", "http"])
@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_a_new_skill_reaches_connected_clients(binary: Path, tmp_path: Path, transport: str, mode: str) -> None:
    root = tmp_path / "skills"
    alpha = write_skill(root, "alpha", "name: alpha\ndescription: The first skill.\n")
    log = tmp_path / "server.log"
    seen: list[str] = []
    arrived = anyio.Event()

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ServerNotification):
            method = getattr(message, "method", None) or getattr(getattr(message, "root", None), "method", "")
            if method.endswith("list_changed"):
                seen.append(method)
                arrived.set()

    kwargs = {"message_handler": on_message} if mode == "legacy" else {}
    async with watched(binary, transport, mode, root, log, **kwargs) as client:
        assert _names(await all_prompts(client)) == {"alpha"}

        async def change_and_check() -> None:
            # An unchanged save: rescanned (logged), and nothing is sent.
            skill_md = alpha / "SKILL.md"
            skill_md.write_bytes(skill_md.read_bytes())
            await _wait_for_log(log, "rescan found no change", 1)
            assert seen == [], f"an unchanged save sent {seen}"
            write_skill(root, "beta", "name: beta\ndescription: The second skill.\n")

        if mode == "legacy":
            await change_and_check()
            with anyio.fail_after(NOTICE_TIMEOUT):
                await arrived.wait()
            assert "notifications/tools/list_changed" in seen
        else:
            async with client.listen(tools_list_changed=True, prompts_list_changed=True, resources_list_changed=True) as sub:
                await change_and_check()
                with anyio.fail_after(NOTICE_TIMEOUT):
                    event = await sub.__anext__()
                assert type(event).__name__ in {"ToolsListChanged", "PromptsListChanged", "ResourcesListChanged"}
        assert _names(await all_prompts(client)) == {"alpha", "beta"}


async def test_removing_a_skill_removes_it(binary: Path, tmp_path: Path) -> None:
    root = tmp_path / "skills"
    write_skill(root, "alpha", "name: alpha\ndescription: The first skill.\n")
    gone = write_skill(root, "gone", "name: gone\ndescription: Goes away.\n", body="\n# Gone\n\n" + "x" * 200_000 + "\n")
    log = tmp_path / "server.log"
    async with watched(binary, "stdio", "auto", root, log) as client:
        async with client.listen(prompts_list_changed=True) as sub:
            for f in gone.iterdir():
                f.unlink()
            gone.rmdir()
            with anyio.fail_after(NOTICE_TIMEOUT):
                await sub.__anext__()
        assert _names(await all_prompts(client)) == {"alpha"}
        result = await client.call_tool("skill_load", {"name": "gone"})
        assert result.is_error, "a removed skill must not load"
