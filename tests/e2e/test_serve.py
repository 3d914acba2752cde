"""skill-operator serve over the sample skills: tools, prompts and resources,
for every transport (stdio, http) x connect mode (auto, legacy)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS

from conftest import (
    SAMPLE_NAMES,
    SAMPLES,
    all_prompts,
    all_resources,
    call,
    call_error,
    root_path,
    skill_files,
    split_skill_md,
)

pytestmark = pytest.mark.anyio

TOOLS = {"skill_list", "skill_load", "skill_file", "skill_search"}
# mode="auto" must reach 2026-07-28 unless SKILL_OPERATOR_EXPECT_MODERN=0.
EXPECT_MODERN = os.environ.get("SKILL_OPERATOR_EXPECT_MODERN", "1") != "0"


def sample(name: str) -> tuple[dict, str, dict[str, bytes]]:
    skill_dir = SAMPLES / name
    frontmatter, body = split_skill_md((skill_dir / "SKILL.md").read_text())
    return frontmatter, body, skill_files(skill_dir)


def declared_scripts(frontmatter: dict) -> list[str]:
    host = frontmatter.get("mcp-host") or {}
    return [entry["script"] for entry in host.get("run") or []]


async def test_initialize_and_list_tools(connect, mode):
    async with connect() as client:
        version = client.protocol_version
        if mode == "legacy":
            assert version in HANDSHAKE_PROTOCOL_VERSIONS
            assert client.session.initialize_result is not None
            assert client.server_info is not None and client.server_info.name
        elif EXPECT_MODERN:
            assert version in MODERN_PROTOCOL_VERSIONS, (
                f"mode=auto negotiated {version}; expected a 2026-07-28 server/discover answer "
                "(set SKILL_OPERATOR_EXPECT_MODERN=0 to accept the handshake fallback)"
            )
            assert client.session.discover_result is not None
        else:
            assert version in (*HANDSHAKE_PROTOCOL_VERSIONS, *MODERN_PROTOCOL_VERSIONS)

        caps = client.server_capabilities
        assert caps.tools is not None and caps.prompts is not None and caps.resources is not None

        listed = await client.list_tools()
        tools = {tool.name: tool for tool in listed.tools}
        assert TOOLS <= set(tools), f"missing tools: {TOOLS - set(tools)}"
        for name in TOOLS:
            tool = tools[name]
            assert tool.description, f"{name} has no description"
            assert isinstance(tool.input_schema, dict) and tool.input_schema.get("type") == "object", name
            assert tool.annotations is not None and tool.annotations.read_only_hint is True, (
                f"{name} must be annotated readOnlyHint: true"
            )
        assert "name" in tools["skill_load"].input_schema.get("properties", {})
        file_props = tools["skill_file"].input_schema.get("properties", {})
        assert {"skill", "paths"} <= set(file_props)


async def test_skill_list_samples(connect):
    async with connect() as client:
        listing = await call(client, "skill_list")

    names = [s["name"] for s in listing["skills"]]
    assert sorted(names) == SAMPLE_NAMES
    assert listing["problems"] == [], f"samples should load cleanly: {listing['problems']}"
    assert [root_path(r) for r in listing["roots"]] == [SAMPLES.resolve()]
    assert isinstance(listing["grantFrom"], str)

    for entry in listing["skills"]:
        name = entry["name"]
        frontmatter, _, files = sample(name)
        assert entry["description"] == frontmatter["description"]
        assert Path(entry["path"]).resolve() == (SAMPLES / name).resolve()
        assert Path(entry["root"]).resolve() == SAMPLES.resolve()
        assert entry["files"] == len(files), f"{name}: files"
        assert entry["bytes"] == sum(len(b) for b in files.values()), f"{name}: bytes"

        scripts = entry["scripts"]
        declared = declared_scripts(frontmatter)
        assert scripts["declared"] == declared, name
        for bucket in ("runnable", "unavailable", "ungranted"):
            assert isinstance(scripts[bucket], list), f"{name}: scripts.{bucket}"
        problem_scripts = [u["script"] for u in scripts["unavailable"] + scripts["ungranted"]]
        assert set(scripts["runnable"]) | set(problem_scripts) <= set(declared), name
        for item in scripts["unavailable"] + scripts["ungranted"]:
            assert isinstance(item["reason"], str) and item["reason"], f"{name}: {item}"
        assert entry["egress"] == (frontmatter.get("mcp-host") or {}).get("egress", []), name

    by_name = {s["name"]: s for s in listing["skills"]}
    assert by_name["release-notes"]["scripts"]["declared"] == []
    assert by_name["csv-stats"]["scripts"]["declared"] == ["scripts/stats.py"]
    assert by_name["weather-brief"]["egress"] == ["api.open-meteo.com"]


async def test_skill_load_matches_files(connect):
    async with connect() as client:
        for name in SAMPLE_NAMES:
            frontmatter, body, files = sample(name)
            loaded = await call(client, "skill_load", {"name": name})
            assert loaded["name"] == name
            assert loaded["description"] == frontmatter["description"]
            assert loaded["frontmatter"] == frontmatter, f"{name}: frontmatter must be the YAML, verbatim"
            assert loaded["bodyTruncated"] is False
            # The body is the text after the closing '---' line; blank lines
            # directly after the fence are not significant.
            assert loaded["body"].lstrip("\n") == body.lstrip("\n"), f"{name}: body differs from SKILL.md"
            listed = {f["path"]: f["size"] for f in loaded["files"]}
            assert listed == {path: len(data) for path, data in files.items()}, name
            scripts = {s["script"]: s for s in loaded["scripts"]}
            assert list(scripts) == declared_scripts(frontmatter), name
            for spec in (frontmatter.get("mcp-host") or {}).get("run") or []:
                got = scripts[spec["script"]]
                assert got["interpreter"] == spec["interpreter"], name
                assert got["env"] == spec.get("env", []), name
                if "timeout" in spec:
                    assert got["timeout"] == spec["timeout"], name
                assert isinstance(got["status"], str) and got["status"], name
            assert loaded["egress"] == (frontmatter.get("mcp-host") or {}).get("egress", []), name
            assert isinstance(loaded["problems"], list)


async def test_skill_load_unknown_name_lists_served_names(connect):
    async with connect() as client:
        message = await call_error(client, "skill_load", {"name": "no-such-skill"})
    for name in SAMPLE_NAMES:
        assert name in message, f"error message should list served skill {name!r}: {message}"


async def test_skill_file_batch(connect):
    _, _, files = sample("csv-stats")
    paths = ["scripts/stats.py", "../csv-stats/SKILL.md", "assets/missing.csv", "SKILL.md"]
    async with connect() as client:
        out = await call(client, "skill_file", {"skill": "csv-stats", "paths": paths})

    assert out["skill"] == "csv-stats"
    results = out["results"]
    assert [r["path"] for r in results] == paths, "results must come back in request order"

    for index in (0, 3):
        good = results[index]
        data = files[paths[index]]
        assert good["ok"] is True, good
        assert good["encoding"] == "utf-8"
        assert isinstance(good["mediaType"], str) and good["mediaType"]
        assert good["size"] == len(data)
        assert good["returned"] == len(data)
        assert good["truncated"] is False
        assert good["content"] == data.decode("utf-8")
    assert results[3]["mediaType"].startswith("text/")

    for index in (1, 2):
        bad = results[index]
        assert bad["ok"] is False, bad
        assert isinstance(bad["error"]["code"], str) and bad["error"]["code"], bad
        assert isinstance(bad["error"]["message"], str) and bad["error"]["message"], bad
        assert "content" not in bad
    assert results[1]["error"]["code"] != results[2]["error"]["code"], (
        "an escaping path and a missing file should be told apart"
    )


async def test_prompts(connect):
    async with connect() as client:
        prompts = await all_prompts(client)
        assert sorted(p.name for p in prompts) == SAMPLE_NAMES
        for prompt in prompts:
            assert prompt.description, prompt.name
        for name in ("csv-stats", "release-notes"):
            _, body, _ = sample(name)
            got = await client.get_prompt(name)
            assert got.messages, name
            text = got.messages[0].content.text
            assert text.strip() == body.strip(), f"prompt {name} should be the SKILL.md body"


async def test_resources(connect):
    async with connect() as client:
        resources = await all_resources(client)
        by_uri = {str(r.uri): r for r in resources}
        for name in SAMPLE_NAMES:
            for path in skill_files(SAMPLES / name):
                assert f"skill://{name}/{path}" in by_uri, f"missing resource skill://{name}/{path}"
        skill_md = by_uri["skill://csv-stats/SKILL.md"]
        assert skill_md.mime_type == "text/markdown"

        for uri, path in [
            ("skill://csv-stats/SKILL.md", SAMPLES / "csv-stats" / "SKILL.md"),
            ("skill://csv-stats/scripts/stats.py", SAMPLES / "csv-stats" / "scripts" / "stats.py"),
        ]:
            read = await client.read_resource(uri)
            assert len(read.contents) == 1, uri
            content = read.contents[0]
            assert str(content.uri) == uri
            assert content.text == path.read_text(), f"{uri} should be the file, verbatim"
        assert read.contents[0].mime_type is None or read.contents[0].mime_type.startswith("text/")


async def test_skill_search_ranks_and_tolerates_typos(connect):
    async with connect() as client:
        exact = await call(client, "skill_search", {"query": "csv"})
        typo = await call(client, "skill_search", {"query": "wether forcast"})
        limited = await call(client, "skill_search", {"query": "file", "limit": 1})
        refused = await call_error(client, "skill_search", {"query": "csv", "limit": 51})
    assert exact["results"][0]["name"] == "csv-stats" and exact["results"][0]["matched"][0] == "name", exact
    assert [r["name"] for r in typo["results"]] == ["weather-brief"], typo
    assert len(limited["results"]) == 1 and limited["total"] > 1, limited
    assert "limit 51" in refused and "50" in refused, refused
