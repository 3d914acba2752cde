"""SEP-2640 skills extension (io.modelcontextprotocol/skills): skills/list and skills/get.

The mcp 2.3.0 client has no skills API, so the requests go through
`ClientSession.send_request` with small request models: that path still
stamps the negotiated era (the 2026-07-28 `_meta` envelope and the
Mcp-Protocol-Version / Mcp-Method headers, or nothing on a handshake-era
connection) and returns the raw result.

The extension is defined against 2026-07-28: on a connection that negotiated
it, the capability is required. On a handshake-era connection (mode=legacy)
the server may leave the extension out; the test is skipped then.
"""

from __future__ import annotations

import hashlib
from typing import Any, Literal

import mcp_types as types
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import TypeAdapter

from conftest import SAMPLE_NAMES, SAMPLES, skill_files, split_skill_md

pytestmark = pytest.mark.anyio

EXTENSION = "io.modelcontextprotocol/skills"
INVALID_PARAMS = -32602
_RAW = TypeAdapter(dict[str, Any])


class ListSkillsRequest(types.Request[types.PaginatedRequestParams | None, Literal["skills/list"]]):
    method: Literal["skills/list"] = "skills/list"
    params: types.PaginatedRequestParams | None = None


class GetSkillParams(types.RequestParams):
    uri: str


class GetSkillRequest(types.Request[GetSkillParams, Literal["skills/get"]]):
    method: Literal["skills/get"] = "skills/get"
    params: GetSkillParams


async def list_skills(client: Client) -> list[dict[str, Any]]:
    skills: list[dict[str, Any]] = []
    cursor = None
    for _ in range(100):
        params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
        page = await client.session.send_request(ListSkillsRequest(params=params), _RAW)
        assert page.get("resultType", "complete") == "complete", page
        assert isinstance(page.get("ttlMs"), int) and "cacheScope" in page, "skills/list is a CacheableResult"
        skills.extend(page["skills"])
        cursor = page.get("nextCursor")
        if not cursor:
            return skills
    raise AssertionError("skills/list pagination did not end after 100 pages")


async def get_skill(client: Client, uri: str) -> dict[str, Any]:
    return await client.session.send_request(GetSkillRequest(params=GetSkillParams(uri=uri)), _RAW)


def expected_entry(name: str) -> dict[str, Any]:
    skill_dir = SAMPLES / name
    frontmatter, _ = split_skill_md((skill_dir / "SKILL.md").read_text())
    resources = {
        f"skill://{name}/{path}": {"digest": "sha256:" + hashlib.sha256(data).hexdigest(), "size": len(data)}
        for path, data in skill_files(skill_dir).items()
    }
    return {"uri": f"skill://{name}/SKILL.md", "frontmatter": frontmatter, "resources": resources}


def check_entry(entry: dict[str, Any], name: str) -> None:
    want = expected_entry(name)
    assert entry["uri"] == want["uri"]
    assert entry["frontmatter"] == want["frontmatter"], f"{name}: frontmatter must be verbatim"
    assert isinstance(entry["resources"], list), f"{name}: a directory skill has static resources"
    got = {r["uri"]: {"digest": r["digest"], "size": r["size"]} for r in entry["resources"]}
    assert len(got) == len(entry["resources"]), f"{name}: duplicate resource entries"
    assert got == want["resources"], f"{name}: manifest differs from the files on disk"


async def test_skills_list_and_get(connect):
    async with connect() as client:
        extensions = client.server_capabilities.extensions or {}
        modern = client.protocol_version in MODERN_PROTOCOL_VERSIONS
        if EXTENSION not in extensions:
            if modern:
                pytest.fail(f"{EXTENSION} not declared on a {client.protocol_version} connection: {extensions}")
            pytest.skip(f"{EXTENSION} not declared on this handshake-era ({client.protocol_version}) connection")
        assert client.server_capabilities.resources is not None, "the extension requires the resources capability"

        listed = await list_skills(client)
        by_name = {entry["frontmatter"]["name"]: entry for entry in listed}
        assert sorted(by_name) == SAMPLE_NAMES
        for name in SAMPLE_NAMES:
            check_entry(by_name[name], name)

        got = await get_skill(client, "skill://csv-stats/SKILL.md")
        assert got.get("resultType", "complete") == "complete"
        assert "ttlMs" in got and "cacheScope" in got, "skills/get is a CacheableResult"
        check_entry(got["skill"], "csv-stats")

        with pytest.raises(MCPError) as unknown:
            await get_skill(client, "skill://no-such-skill/SKILL.md")
        assert unknown.value.code == INVALID_PARAMS

        # The manifest's digests describe what resources/read returns.
        read = await client.read_resource("skill://json-pretty/scripts/pretty.js")
        data = read.contents[0].text.encode()
        manifest = {r["uri"]: r for r in by_name["json-pretty"]["resources"]}
        assert manifest["skill://json-pretty/scripts/pretty.js"]["digest"] == "sha256:" + hashlib.sha256(data).hexdigest()
