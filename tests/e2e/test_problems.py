"""Broken skills are reported, not fatal; several --skills roots are merged."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import SAMPLE_NAMES, SAMPLES, all_prompts, call, call_error, root_path, write_skill

pytestmark = pytest.mark.anyio


async def test_broken_skill_is_a_problem_and_sibling_is_served(connect, tmp_path: Path):
    root = tmp_path / "skills"
    write_skill(root, "good", "name: good\ndescription: A well-formed skill used by the e2e tests.")
    broken = write_skill(root, "broken", "name: broken\nlicense: Apache-2.0")  # no description

    async with connect(root) as client:
        listing = await call(client, "skill_list")
        assert [s["name"] for s in listing["skills"]] == ["good"]

        problems = listing["problems"]
        about_broken = [
            p for p in problems if p.get("skill") == "broken" or "broken" in Path(p.get("path", "")).parts
        ]
        assert about_broken, f"the skill without a description must be reported: {problems}"
        for problem in about_broken:
            assert isinstance(problem["reason"], str) and problem["reason"], problem
            assert isinstance(problem["detail"], str), problem
            assert Path(problem["path"]).resolve().is_relative_to(broken.resolve()), problem

        assert [p.name for p in await all_prompts(client)] == ["good"]
        message = await call_error(client, "skill_load", {"name": "broken"})
        assert "good" in message
        loaded = await call(client, "skill_load", {"name": "good"})
        assert loaded["description"] == "A well-formed skill used by the e2e tests."


async def test_several_skill_roots(connect, tmp_path: Path):
    extra = tmp_path / "more-skills"
    write_skill(extra, "extra-notes", "name: extra-notes\ndescription: An extra skill from a second root.")

    async with connect(SAMPLES, extra) as client:
        listing = await call(client, "skill_list")
    names = sorted(s["name"] for s in listing["skills"])
    assert names == sorted([*SAMPLE_NAMES, "extra-notes"])
    assert [root_path(r) for r in listing["roots"]] == [SAMPLES.resolve(), extra.resolve()]
    extra_entry = next(s for s in listing["skills"] if s["name"] == "extra-notes")
    assert Path(extra_entry["root"]).resolve() == extra.resolve()
