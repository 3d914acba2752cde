"""A skills root given relative to the working directory (`serve --skills
./skills`, what a person types) serves every read and a run: the root is
resolved once at start, so the path checks compare resolved paths with
resolved paths. Before that fix every read failed with "the path leaves the
skill directory (through a symlink)".
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client

from conftest import CLIENT_TIMEOUT, SAMPLES, _unwrapped, call
from test_skills_extension import list_skills

pytestmark = pytest.mark.anyio


async def test_every_read_and_a_run_through_a_relative_root(binary: Path, tmp_path: Path) -> None:
    shutil.copytree(SAMPLES, tmp_path / "skills")
    # Sandboxed scripts run as an unprivileged uid, which must reach the skill.
    for d in [tmp_path, *tmp_path.parents]:
        if d == Path("/tmp") or d == Path("/"):
            break
        d.chmod(d.stat().st_mode | 0o005)
    args = ["serve", "--skills", "./skills", "--confirm", "auto", "--data-dir", str(tmp_path / "data")]
    params = StdioServerParameters(command=str(binary), args=args, cwd=str(tmp_path))
    with open(tmp_path / "server.log", "w") as errlog, _unwrapped(), anyio.fail_after(CLIENT_TIMEOUT):
        async with Client(stdio_client(params, errlog=errlog), mode="auto") as client:
            listed = await call(client, "skill_list", {})
            assert "csv-stats" in {s["name"] for s in listed["skills"]}
            loaded = await call(client, "skill_load", {"name": "csv-stats"})
            assert "csv" in json.dumps(loaded).lower()
            files = await call(client, "skill_file", {"skill": "csv-stats", "paths": ["scripts/stats.py", "SKILL.md"]})
            assert all(r["ok"] for r in files["results"]), files
            read = await client.read_resource("skill://csv-stats/scripts/stats.py")
            data = read.contents[0].text.encode()
            assert data == (tmp_path / "skills/csv-stats/scripts/stats.py").read_bytes()
            entries = {e["frontmatter"]["name"]: e for e in await list_skills(client)}
            manifest = {r["uri"]: r for r in entries["csv-stats"]["resources"]}
            assert manifest["skill://csv-stats/scripts/stats.py"]["digest"] == "sha256:" + hashlib.sha256(data).hexdigest()
            csv = (tmp_path / "skills/csv-stats/assets/example.csv").read_text()
            run = {"skill": "csv-stats", "script": "scripts/stats.py", "args": ["data.csv"], "inputs": [{"path": "data.csv", "content": csv}]}
            ran = await call(client, "skill_run", run)
            assert ran["exitCode"] == 0, ran
            assert '"rows": 6' in ran["stdout"], ran["stdout"]
