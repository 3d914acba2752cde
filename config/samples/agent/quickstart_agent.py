# The README's quickstart agent: runs csv-stats through the gateway with the Python `mcp` client.
import asyncio
import os

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

URL = os.environ.get("GATEWAY_URL", "http://localhost:8090/mcp/skills-demo")
CSV = os.environ.get("CSV", "/package/assets/example.csv")  # the sample CSV inside the run's pod
CALL = {"skill": "csv-stats", "script": "scripts/stats.py", "args": [CSV]}


async def main() -> int | str:
    auth = {"Authorization": f"Bearer {os.environ['TOKEN']}"}
    async with httpx2.AsyncClient(headers=auth, timeout=httpx2.Timeout(30.0, read=300.0)) as http:
        async with Client(streamable_http_client(URL, http_client=http)) as client:
            preview = (await client.call_tool("skill_run", CALL)).structured_content  # runs nothing yet
            result = await client.call_tool("skill_run", {**CALL, "confirm": preview["token"]})
            if result.is_error:
                return result.content[0].text  # what went wrong, and what to do
            print(result.structured_content["stdout"])
            return result.structured_content["exitCode"]


raise SystemExit(asyncio.run(main()))
