"""The README's quickstart agent (config/samples/agent/quickstart_agent.py),
run verbatim as its own process with this venv's real `mcp` client, against
`skill-operator serve --http` with a bearer token: the same tools and the
same preview-then-confirm exchange the gateway serves. The cluster run of the
same file is tests/kind/quickstart.sh; this one needs no cluster.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import REPO_ROOT, SAMPLES, HttpServer

AGENT = REPO_ROOT / "config" / "samples" / "agent" / "quickstart_agent.py"


def served_samples(tmp_path: Path) -> Path:
    skills = tmp_path / "skills"
    shutil.copytree(SAMPLES, skills)
    # Sandboxed scripts run as an unprivileged uid, which must reach the skill.
    for d in [tmp_path, *tmp_path.parents]:
        if d in (Path("/tmp"), Path("/")):
            break
        d.chmod(d.stat().st_mode | 0o005)
    return skills


def run_agent(url: str, token: str, csv: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "GATEWAY_URL": url, "TOKEN": token, "CSV": csv}
    return subprocess.run([sys.executable, str(AGENT)], env=env, capture_output=True, text=True, timeout=120)


def test_the_quickstart_agent_runs_csv_stats_after_its_preview(binary: Path, tmp_path: Path) -> None:
    skills = served_samples(tmp_path)
    flags = ["--confirm", "ask", "--data-dir", str(tmp_path / "data")]
    server = HttpServer(binary, [skills], tmp_path / "http.log", flags=flags)
    try:
        url = server.wait_ready()
        # In the sandbox the skill is at /skill, as the package is at /package in a run's pod.
        done = run_agent(url, server.token, "/skill/assets/example.csv")
        assert done.returncode == 0, f"exit {done.returncode}\nstdout: {done.stdout}\nstderr: {done.stderr}"
        stats = json.loads(done.stdout)
        assert stats["rows"] == 6 and [c["name"] for c in stats["columns"]] == ["date", "region", "units", "price"], stats
        # The script's own failure is the agent's exit status, not a success.
        failed = run_agent(url, server.token, "/skill/assets/no-such.csv")
        assert failed.returncode not in (0, None), f"stdout: {failed.stdout}\nstderr: {failed.stderr}"
    finally:
        server.stop()
