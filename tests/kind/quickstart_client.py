"""The quick start's agent: the real Python `mcp` client against the gateway.

Usage: quickstart_client.py URL TOKEN
  URL    the namespace's MCP endpoint, e.g. http://localhost:8090/mcp/skills-demo
  TOKEN  the agent's ServiceAccount token (kubectl create token skills-agent)

Lists the skills (csv-stats must be there), runs scripts/stats.py on a small
CSV sent inline (preview, then the confirmed run), checks the statistics it
prints, and prints `first result after N ms` (from the client's start).
Exits 1 with one line on any failure.
"""

from __future__ import annotations

import asyncio
import base64
import json
import sys
import time

import httpx2 as httpx  # the mcp client ships httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

CSV = b"city,temp\nOslo,3\nLima,19\nCairo,27\n"


async def call(client: Client, tool: str, args: dict) -> dict:
    result = await client.call_tool(tool, args)
    text = " ".join(getattr(c, "text", "") for c in result.content)
    if result.is_error:
        raise SystemExit(f"{tool} failed: {text[:400]}")
    return result.structured_content or json.loads(text)


async def main(url: str, token: str) -> None:
    start = time.monotonic()
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"}, timeout=httpx.Timeout(180.0))
    async with http, Client(streamable_http_client(url, http_client=http), mode="auto") as client:
        # The binding may still be on its way to Ready: wait for the skill.
        for _ in range(120):
            listed = await call(client, "skill_list", {})
            if "csv-stats" in {s["name"] for s in listed.get("skills", [])}:
                break
            await asyncio.sleep(1)
        else:
            raise SystemExit(f"csv-stats never appeared in skill_list: {json.dumps(listed)[:400]}")
        args = {
            "skill": "csv-stats",
            "script": "scripts/stats.py",
            "args": ["cities.csv"],
            "inputs": [{"path": "cities.csv", "content": base64.b64encode(CSV).decode(), "encoding": "base64"}],
        }
        preview = await call(client, "skill_run", args)
        if preview.get("status") != "confirmation-required":
            raise SystemExit(f"no preview first: {json.dumps(preview)[:300]}")
        result = await call(client, "skill_run", {**args, "confirm": preview["token"]})
        if result.get("exitCode") != 0:
            raise SystemExit(f"exit {result.get('exitCode')}: {json.dumps(result)[:600]}")
        stdout = result.get("stdout", "")
        try:
            stats = json.loads(stdout)
        except ValueError:
            raise SystemExit(f"stdout is not JSON: {stdout[:300]!r}")
        text = json.dumps(stats)
        temp = next((c for c in stats.get("columns", []) if c.get("name") == "temp"), {})
        if stats.get("rows") != 3 or temp.get("max") != 27:
            raise SystemExit(f"unexpected statistics: {text[:400]}")
    print(f"first result after {int((time.monotonic() - start) * 1000)} ms: {text[:160]}")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
