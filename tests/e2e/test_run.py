"""The execution side end to end: skill_run and the job tools against the real
binary, driven by the real Python `mcp` client (stdio unless said otherwise).

Every rule of the execution fence has its own test: only declared scripts,
only inside the skill (string check and resolved check), argv as an array,
a closed interpreter set named by the declaration, an environment allowlist,
bounded runs that always return, non-zero exits as normal results, the
confirmation gate, grants, concurrency, jobs, restarts and the job cap.

The server runs as root in this environment, so scripts run as `nobody`:
fixture skills and data directories live in a world-readable temporary
directory (pytest's tmp_path is 0700 and would make every script
unreadable to that uid).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator

import anyio
import pytest
from mcp import Client, StdioServerParameters, types
from mcp.client.stdio import stdio_client

from conftest import CLIENT_TIMEOUT, HttpServer, _unwrapped, http_client

pytestmark = pytest.mark.anyio

MIB = 1024 * 1024
ALLOWED_ENV = {"PATH", "HOME", "LANG", "TMPDIR", "TZ", "MCP_DATA_DIR", "PWD"}


# ------------------------------------------------------------------ fixtures


@pytest.fixture
def world() -> Path:
    """A fresh 0755 directory under /tmp (readable by the run-as uid), removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="so-e2e-run-", dir="/tmp"))
    path.chmod(0o755)
    (path / "skills").mkdir(mode=0o755)
    (path / "data").mkdir(mode=0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def make_skill(
    world: Path,
    name: str,
    runs: list[dict[str, Any]],
    files: dict[str, str | bytes],
    host_extra: dict[str, Any] | None = None,
) -> Path:
    """skills/<name>/SKILL.md with an `mcp-host:` block (written as JSON, which is YAML) plus files."""
    skill = world / "skills" / name
    skill.mkdir(parents=True, mode=0o755)
    host = {"version": 1, "run": runs, **(host_extra or {})}
    (skill / "SKILL.md").write_text(
        f"---\nname: {name}\ndescription: e2e run probe\nmcp-host: {json.dumps(host)}\n---\n\n# {name}\n"
    )
    for rel, content in files.items():
        target = skill / rel
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        if isinstance(content, bytes):
            target.write_bytes(content)
        else:
            target.write_text(content)
    for path in [skill, *skill.rglob("*")]:
        if not path.is_symlink():
            path.chmod(0o755 if path.is_dir() else 0o644)
    return skill


def run_row(script: str, interpreter: str = "python", timeout: int = 10, env: list[str] | None = None) -> dict:
    row: dict[str, Any] = {"script": script, "interpreter": interpreter, "timeout": timeout}
    if env:
        row["env"] = env
    return row


# A root server refuses unsandboxed runs without dedicated uids: every server
# here gets a range (runs lease a uid each, sandboxed or not) unless the test
# names its own uid or opts out.
RUN_AS_UIDS = ["--run-as-uids", "62000-62099"]


def uid_flags(flags: list[str] | tuple[str, ...]) -> list[str]:
    if os.geteuid() != 0 or "--run-as-uid" in flags or "--run-as-uids" in flags or "--no-uid-range" in flags:
        return []
    return list(RUN_AS_UIDS)


def server_env(extra: dict[str, str] | None) -> dict[str, str]:
    """A clean environment for the server: no host markers unless a test adds them."""
    env = {"PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"), "HOME": "/root", "LANG": "C.UTF-8"}
    env.update(extra or {})
    return env


@pytest.fixture
def serve(binary: Path, world: Path):
    """`async with serve(*flags, env={...}, elicitation=cb) as client:` starts
    `skill-operator serve --skills world/skills --data-dir world/data FLAGS`
    over stdio with exactly that environment (on top of the client's minimal
    defaults) and connects the real client."""
    counter = iter(range(1000))

    @asynccontextmanager
    async def _serve(
        *flags: str,
        env: dict[str, str] | None = None,
        elicitation=None,
        mode: str = "auto",
        timeout: float = CLIENT_TIMEOUT,
    ) -> AsyncIterator[Client]:
        args = ["serve", "--skills", str(world / "skills"), "--data-dir", str(world / "data"), *uid_flags(flags)]
        args += [f for f in flags if f != "--no-uid-range"]
        params = StdioServerParameters(command=str(binary), args=args, env=server_env(env), cwd=str(world))
        log_path = world / f"server-{next(counter)}.log"
        with open(log_path, "w") as errlog, _unwrapped(), anyio.fail_after(timeout):
            async with Client(stdio_client(params, errlog=errlog), mode=mode, elicitation_callback=elicitation) as client:
                yield client

    return _serve


class FlaggedHttpServer(HttpServer):
    """conftest's HttpServer over this test's world, with extra flags and an explicit environment."""

    def __init__(
        self, binary: Path, world: Path, flags: list[str], env: dict[str, str] | None, log_path: Path, token: str | None = None
    ):
        args = [str(binary), "serve", "--skills", str(world / "skills"), "--data-dir", str(world / "data"), *uid_flags(flags)]
        super().__init__(binary, [], log_path, flags=flags, env=server_env(env), args=args, token=token)


async def tool(client: Client, name: str, arguments: dict[str, Any] | None = None) -> tuple[bool, dict[str, Any]]:
    """(isError, structuredContent) of one tool call."""
    result = await client.call_tool(name, arguments or {})
    text = " ".join(getattr(c, "text", "") for c in result.content)
    assert isinstance(result.structured_content, dict), f"{name}: no structuredContent: {text[:500]}"
    return bool(result.is_error), result.structured_content


async def ok(client: Client, name: str, arguments: dict[str, Any] | None = None) -> dict[str, Any]:
    is_error, body = await tool(client, name, arguments)
    assert not is_error, f"{name} {_short(arguments)} failed: {json.dumps(body)[:1500]}"
    return body


async def refused(client: Client, name: str, arguments: dict[str, Any], *codes: str) -> dict[str, Any]:
    """A call that must fail as a tool result with one of `codes`; returns structuredContent."""
    is_error, body = await tool(client, name, arguments)
    assert is_error, f"{name} {_short(arguments)} should fail ({codes}), got {json.dumps(body)[:1500]}"
    error = body.get("error") or {}
    assert error.get("code") in codes, f"{name} {_short(arguments)}: code {error.get('code')!r}, want {codes}: {error}"
    assert isinstance(error.get("message"), str) and error["message"], body
    return body


def _short(arguments: Any) -> str:
    text = json.dumps(arguments)
    return text if len(text) < 300 else text[:300] + "..."


async def job_count(client: Client) -> int:
    return len((await ok(client, "skill_job_list"))["jobs"])


def stdout_json(result: dict[str, Any]) -> Any:
    assert result["status"] == "completed", result
    assert result["exitCode"] == 0, f"script failed: {result['stderr'][-2000:]}"
    return json.loads(result["stdout"])


def kill_leftover(pid_text: str, expect_in_cmdline: str) -> None:
    """Kill a process a test's script started (by pid, only if it is still that program)."""
    try:
        pid = int(pid_text.strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except (ValueError, OSError):
        return
    if expect_in_cmdline in cmdline:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def processes_running(needle: str) -> list[str]:
    """Pids whose command line contains `needle` (a per-test tag)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if needle.encode() in cmdline:
                found.append(entry.name)
    return found


ECHO_PY = """import json, os, sys
json.dump({"argv": sys.argv[1:], "cwd": os.getcwd(), "env": dict(os.environ), "uid": os.getuid()}, sys.stdout)
"""


# ------------------------------------------------------ 1. declared scripts only


async def test_only_declared_scripts_run(serve, world):
    outside = world / "outside"
    outside.mkdir(mode=0o755)
    marks = world / "marks"
    marks.mkdir(mode=0o777)
    marks.chmod(0o777)
    evil = outside / "evil.py"
    evil.write_text(f"open({str(marks / 'evil-ran')!r}, 'w').write('x')\nprint('evil ran')\n")
    evil.chmod(0o644)
    skill = make_skill(
        world,
        "probe",
        [run_row("scripts/ok.py"), run_row("scripts/link.py"), run_row("scripts/later.py")],
        {"scripts/ok.py": ECHO_PY, "scripts/extra.py": ECHO_PY, "scripts/later.py": ECHO_PY},
    )
    (skill / "scripts" / "link.py").symlink_to(evil)

    # --sandbox off: the outside script is reachable from the process, so refusing it is the fence's doing.
    async with serve("--confirm", "auto", "--sandbox", "off") as client:
        body = await refused(client, "skill_run", {"skill": "probe", "script": "scripts/extra.py"}, "not-declared")
        message = body["error"]["message"]
        assert "declared" in message and "scripts/ok.py" in message and "scripts/later.py" in message, message
        assert "scripts/extra.py" in message

        listing = await ok(client, "skill_list")
        scripts = listing["skills"][0]["scripts"]
        assert "scripts/link.py" in [u["script"] for u in scripts["unavailable"]], scripts
        assert "scripts/link.py" not in scripts["runnable"]
        await refused(client, "skill_run", {"skill": "probe", "script": "scripts/link.py"}, "unavailable", "bad-path")

        # A link planted after start-up is caught by the resolved check right before the run.
        (skill / "scripts" / "later.py").unlink()
        (skill / "scripts" / "later.py").symlink_to(evil)
        await refused(client, "skill_run", {"skill": "probe", "script": "scripts/later.py"}, "unavailable", "bad-path")

        # The declared, regular script does run (the skill itself is fine).
        result = await ok(client, "skill_run", {"skill": "probe", "script": "scripts/ok.py"})
        assert stdout_json(result)["argv"] == []

    assert not (marks / "evil-ran").exists(), "a script outside the skill ran"


# ------------------------------------------------------------ 2. hostile paths

MALFORMED_PATHS = [
    "../x",
    "..",
    ".",
    "../probe/scripts/ok.py",
    "scripts/../scripts/ok.py",
    "scripts/./ok.py",
    "./scripts/ok.py",
    "./x",
    "%2e%2e/x",
    "scripts%2fok.py",
    "scripts/ok%2Epy",
    "/etc/passwd",
    "/tmp/x",
    "scripts/ok.py\x00",
    "scripts/ok.py\x00.txt",
    "scripts\\ok.py",
    "..\\..\\x",
    "C:x",
    "C:\\x\\y",
    "a//b",
    "scripts//ok.py",
    "scripts/ok.py/",
    "",
    "scripts/ok.py ",
    " scripts/ok.py",
    "scripts/ ok.py",
    "scripts/ok.py\n",
    "scripts/\tok.py",
    "scripts/ok.py\x7f",
    "a/" * 600 + "b",  # over the 1,024-byte path cap
]
WELL_FORMED_UNDECLARED = ["~/x", "scripts/OK.py", "scripts/extra.py", "SKILL.md", "scripts/ok.py.bak", "scripts"]


async def test_hostile_script_paths_are_refused_before_anything_runs(serve, world):
    make_skill(world, "probe", [run_row("scripts/ok.py")], {"scripts/ok.py": ECHO_PY, "scripts/extra.py": ECHO_PY})
    wrong: list[str] = []
    async with serve("--confirm", "auto") as client:
        for path in MALFORMED_PATHS:
            is_error, body = await tool(client, "skill_run", {"skill": "probe", "script": path})
            code = (body.get("error") or {}).get("code")
            if not is_error or code != "bad-path":
                wrong.append(f"{path[:40]!r}: isError={is_error} code={code!r}")
        for path in WELL_FORMED_UNDECLARED:
            is_error, body = await tool(client, "skill_run", {"skill": "probe", "script": path})
            code = (body.get("error") or {}).get("code")
            if not is_error or code != "not-declared":
                wrong.append(f"{path!r}: isError={is_error} code={code!r} (expected not-declared)")
        # The same strings through the job tool are refused the same way.
        job = (await ok(client, "skill_job_create", {"skill": "probe"}))["id"]
        for path in MALFORMED_PATHS[:10]:
            is_error, body = await tool(client, "skill_job_run", {"job": job, "script": path})
            if not is_error or (body.get("error") or {}).get("code") != "bad-path":
                wrong.append(f"skill_job_run {path!r}: {body.get('error')}")
        status = await ok(client, "skill_job_status", {"job": job})
        assert status["state"] == "created" and status.get("run") is None, status
        await ok(client, "skill_job_delete", {"job": job})
        assert await job_count(client) == 0, "a refused path created a job (something started)"
    assert len(MALFORMED_PATHS) + len(WELL_FORMED_UNDECLARED) >= 20
    assert not wrong, "paths not refused as expected:\n" + "\n".join(wrong)


# ----------------------------------------------------------- 3. argv injection


@pytest.mark.parametrize("sandbox", ["auto", "off"])
async def test_args_arrive_literally_no_shell(serve, world, sandbox):
    pwned = Path(f"/tmp/pwned-{uuid.uuid4().hex}")
    args = [
        f"; touch {pwned}",
        f"$(touch {pwned})",
        f"`touch {pwned}`",
        "$(whoami)",
        "`id`",
        "*",
        "a b",
        "$HOME",
        "'quoted' \"double\"",
        f"| touch {pwned}",
        "--help",
        "",
    ]
    make_skill(world, "probe", [run_row("scripts/echo.py")], {"scripts/echo.py": ECHO_PY})
    async with serve("--confirm", "auto", "--sandbox", sandbox) as client:
        result = await ok(client, "skill_run", {"skill": "probe", "script": "scripts/echo.py", "args": args})
    assert stdout_json(result)["argv"] == args
    assert result["command"]["argv"][2:] == args, result["command"]
    assert result["command"]["sandbox"] == ("bubblewrap" if sandbox == "auto" else "off")
    assert not pwned.exists(), f"{pwned} was created: an argument reached a shell"


# ---------------------------------------------------------------- 4. environment

ENV_PY = r"""import json, os, sys
secret = sys.argv[1].encode()
report = {"env": dict(os.environ), "ppid": os.getppid()}
try:
    with open(f"/proc/{os.getppid()}/environ", "rb") as f:
        report["ppid_environ"] = "secret" if secret in f.read() else "readable, no secret"
except OSError as e:
    report["ppid_environ"] = f"refused: {e.__class__.__name__}"
found, readable = [], 0
for pid in os.listdir("/proc"):
    if not pid.isdigit():
        continue
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            data = f.read()
    except OSError:
        continue
    readable += 1
    if secret in data:
        found.append(pid)
report["scan_found"] = found
report["scan_readable"] = readable
json.dump(report, sys.stdout)
"""


@pytest.mark.parametrize("sandbox", ["auto", "off"])
async def test_environment_is_an_allowlist_plus_granted(serve, world, sandbox):
    secret = f"server-secret-{uuid.uuid4().hex}"
    api_key = f"api-key-{uuid.uuid4().hex}"
    other = f"other-{uuid.uuid4().hex}"
    make_skill(
        world,
        "probe",
        [run_row("scripts/env.py", env=["API_KEY", "OTHER_KEY"])],
        {"scripts/env.py": ENV_PY},
        {"env": [{"name": "API_KEY", "secret": True}, {"name": "OTHER_KEY", "secret": True}]},
    )
    grant = json.dumps([{"skill": "probe", "script": "scripts/env.py", "env": ["API_KEY"]}])
    env = {
        "SERVER_SECRET": secret,
        "API_KEY": api_key,
        "OTHER_KEY": other,
        "MCP_SKILL_RUN": grant,
        "TZ": "UTC",
        "LD_PRELOAD": "",
        "PYTHONPATH": "/nonexistent",
    }
    call = {"skill": "probe", "script": "scripts/env.py", "args": [secret]}
    async with serve("--confirm", "ask", "--sandbox", sandbox, env=env) as client:
        preview = await ok(client, "skill_run", call)
        assert preview["status"] == "confirmation-required", preview
        names = preview["preview"]["command"]["env"]
        assert "API_KEY" in names and "OTHER_KEY" not in names and "SERVER_SECRET" not in names, names
        preview_text = json.dumps(preview)
        for value in (api_key, other):
            assert value not in preview_text, "the preview shows a variable's value"
        assert await job_count(client) == 0, "the preview started something"
        result = await ok(client, "skill_run", {**call, "confirm": preview["token"]})

    report = stdout_json(result)
    seen = report["env"]
    assert seen.get("API_KEY") == api_key, "the granted variable did not reach the script"
    assert "OTHER_KEY" not in seen, "a requested but ungranted variable reached the script"
    extra = set(seen) - ALLOWED_ENV - {"API_KEY"}
    assert not extra, f"variables beyond the allowlist: {sorted(extra)}"
    assert {"PATH", "HOME", "LANG", "TMPDIR"} <= set(seen), sorted(seen)
    assert seen.get("TZ") == "UTC"
    assert seen["PATH"] == "/usr/local/bin:/usr/bin:/bin"
    assert secret not in json.dumps(seen)
    assert not report["ppid_environ"].startswith("secret"), f"/proc/$PPID/environ leaks the secret: {report}"
    assert report["scan_found"] == [], f"the secret is readable in /proc/<pid>/environ of {report['scan_found']}"
    assert set(result["command"]["env"]) == set(seen) - {"PWD"}, (result["command"]["env"], sorted(seen))
    assert api_key not in json.dumps(result["command"])


# ------------------------------------------------------------------- 5. grants


async def test_hosted_marker_without_grant_runs_nothing(serve, world):
    make_skill(world, "probe", [run_row("scripts/echo.py")], {"scripts/echo.py": ECHO_PY})
    async with serve("--confirm", "auto", env={"MCP_HOST_METER_FILE": str(world / "meter")}) as client:
        listing = await ok(client, "skill_list")
        assert listing["grantFrom"] == "hosted-default", listing["grantFrom"]
        assert isinstance(listing.get("grantNote"), str) and listing["grantNote"], listing.get("grantNote")
        scripts = listing["skills"][0]["scripts"]
        assert scripts["runnable"] == [], scripts
        assert [u["script"] for u in scripts["ungranted"]] == ["scripts/echo.py"], scripts
        await refused(client, "skill_run", {"skill": "probe", "script": "scripts/echo.py"}, "ungranted")
        assert await job_count(client) == 0


@pytest.mark.parametrize(
    "grant",
    ["[{not json", '{"skill": "probe"}', '[{"skill": "probe", "script": 7}]'],
    ids=["unparseable", "not-a-list", "bad-row"],
)
async def test_malformed_grant_runs_nothing_and_says_why(serve, world, grant):
    make_skill(world, "probe", [run_row("scripts/echo.py")], {"scripts/echo.py": ECHO_PY})
    async with serve("--confirm", "auto", env={"MCP_SKILL_RUN": grant}) as client:
        listing = await ok(client, "skill_list")
        grant_problems = [p for p in listing["problems"] if p["reason"] == "grant"]
        assert grant_problems and all(p.get("detail") for p in grant_problems), listing["problems"]
        scripts = listing["skills"][0]["scripts"]
        assert scripts["runnable"] == [], scripts
        await refused(client, "skill_run", {"skill": "probe", "script": "scripts/echo.py"}, "ungranted")
        assert await job_count(client) == 0


async def test_grant_cannot_widen_the_declaration(serve, world):
    make_skill(world, "probe", [run_row("scripts/echo.py")], {"scripts/echo.py": ECHO_PY, "scripts/extra.py": ECHO_PY})
    grant = json.dumps([
        {"skill": "probe", "script": "scripts/extra.py"},
        {"skill": "probe", "script": "scripts/echo.py", "env": ["SERVER_SECRET"]},
    ])
    async with serve("--confirm", "auto", env={"MCP_SKILL_RUN": grant, "SERVER_SECRET": "s3cr3t"}) as client:
        listing = await ok(client, "skill_list")
        details = " ".join(p.get("detail", "") for p in listing["problems"] if p["reason"] == "grant")
        assert "scripts/extra.py" in details and "SERVER_SECRET" in details, listing["problems"]
        await refused(client, "skill_run", {"skill": "probe", "script": "scripts/extra.py"}, "not-declared")
        is_error, result = await tool(client, "skill_run", {"skill": "probe", "script": "scripts/echo.py"})
        if not is_error:  # the row's other half (the script) may stand; the variable never does
            assert "SERVER_SECRET" not in stdout_json(result)["env"]
            assert "s3cr3t" not in result["stdout"]
    # Both grant sources at once: nothing runs.
    grants_file = world / "grants.json"
    grants_file.write_text(json.dumps([{"skill": "probe", "script": "scripts/echo.py"}]))
    both = json.dumps([{"skill": "probe", "script": "scripts/echo.py"}])
    async with serve("--confirm", "auto", "--grants", str(grants_file), env={"MCP_SKILL_RUN": both}) as client:
        before = await job_count(client)  # the same data directory: the run above is retained
        await refused(client, "skill_run", {"skill": "probe", "script": "scripts/echo.py"}, "ungranted")
        assert await job_count(client) == before


# ------------------------------------------------------------ 6. interpreters

POLYGLOT = """#!/usr/bin/env python3
echo "ran-under-bash ${BASH_VERSION}"
"""


async def test_interpreter_is_never_inferred(serve, world):
    make_skill(
        world,
        "probe",
        [
            run_row("scripts/tool.py", interpreter="bash"),
            run_row("scripts/x.rb", interpreter="ruby"),
            {"script": "scripts/plain.py", "timeout": 5},
        ],
        {"scripts/tool.py": POLYGLOT, "scripts/x.rb": "puts 1\n", "scripts/plain.py": "print('ran')\n"},
    )
    async with serve("--confirm", "auto") as client:
        result = await ok(client, "skill_run", {"skill": "probe", "script": "scripts/tool.py"})
        assert result["exitCode"] == 0, result["stderr"]
        assert result["stdout"].startswith("ran-under-bash "), result["stdout"]
        assert len(result["stdout"].split()) == 2, "BASH_VERSION is empty: not bash"
        assert Path(result["command"]["program"]).name == "bash", result["command"]

        listing = await ok(client, "skill_list")
        unavailable = {u["script"]: u["reason"] for u in listing["skills"][0]["scripts"]["unavailable"]}
        assert "scripts/x.rb" in unavailable and "scripts/plain.py" in unavailable, listing["skills"][0]["scripts"]
        assert "ruby" in unavailable["scripts/x.rb"], unavailable
        for script in ("scripts/x.rb", "scripts/plain.py"):
            body = await refused(client, "skill_run", {"skill": "probe", "script": script}, "unavailable")
            assert unavailable[script] in body["error"]["message"], (unavailable[script], body["error"]["message"])
        assert await job_count(client) == 1


# ---------------------------------------------------------------- 7. timeouts

SLEEPER = "import time\nprint('start', flush=True)\ntime.sleep(60)\n"
# A grandchild in its own session (outside the process group the runner
# signals) that keeps stdout open; argv[0] carries a tag to find it by.
DETACH = """import os, sys, time
tag, then = sys.argv[1], sys.argv[2]
pid = os.fork()
if pid == 0:
    os.setsid()
    os.execv("/bin/sleep", [tag, "60"])
while os.getpgid(pid) == os.getpgrp():  # wait until it has left our group
    time.sleep(0.01)
print("parent-done", flush=True)
if then == "hang":
    time.sleep(60)
"""


async def test_timeout_kills_the_run(serve, world):
    make_skill(world, "probe", [run_row("scripts/sleep.py", timeout=2)], {"scripts/sleep.py": SLEEPER})
    async with serve("--confirm", "auto") as client:
        started = time.monotonic()
        result = await ok(client, "skill_run", {"skill": "probe", "script": "scripts/sleep.py"})
        elapsed = time.monotonic() - started
        assert result["timedOut"] is True, result
        assert result["state"] == "timed-out", result["state"]
        assert result["stdout"] == "start\n", result["stdout"]
        assert 1.8 <= elapsed < 6.0, f"a 2 s timeout returned after {elapsed:.1f} s"
        await ok(client, "skill_list")


@pytest.mark.parametrize("sandbox", ["auto", "off"])
async def test_detached_grandchild_does_not_hold_the_call(serve, world, sandbox):
    tag = f"so-grandchild-{uuid.uuid4().hex[:12]}"
    make_skill(
        world,
        "probe",
        [run_row("scripts/detach.py", timeout=20), run_row("scripts/hang.py", timeout=2)],
        {"scripts/detach.py": DETACH, "scripts/hang.py": DETACH},
    )
    try:
        async with serve("--confirm", "auto", "--sandbox", sandbox) as client:
            started = time.monotonic()
            result = await ok(client, "skill_run", {"skill": "probe", "script": "scripts/detach.py", "args": [tag, "exit"]})
            elapsed = time.monotonic() - started
            assert result["exitCode"] == 0 and result["stdout"] == "parent-done\n", result
            assert elapsed < 3.0, f"a detached grandchild held the call for {elapsed:.1f} s"
            if sandbox == "auto":  # the PID namespace dies with bwrap, and the grandchild with it
                await anyio.sleep(0.3)
                assert processes_running(tag) == [], "a sandboxed grandchild outlived its run"

            # The slot was released (the next run is not `busy`); a timeout with a grandchild still returns.
            started = time.monotonic()
            result = await ok(client, "skill_run", {"skill": "probe", "script": "scripts/hang.py", "args": [tag, "hang"]})
            elapsed = time.monotonic() - started
            assert result["timedOut"] is True and result["stdout"] == "parent-done\n", result
            # hard deadline: timeout 2 + kill grace 2 + drain 0.25 + slack 1
            assert elapsed < 2 + 2 + 0.25 + 1 + 1.0, f"timeout with a grandchild returned after {elapsed:.1f} s"
            await ok(client, "skill_list")
    finally:
        # Unsandboxed, a deliberately detached grandchild may live on (the fence does not promise
        # otherwise); it is this test's own process: end it by pid.
        for pid in processes_running(tag):
            kill_leftover(pid, tag)


@pytest.mark.skipif(os.geteuid() != 0, reason="a dedicated run-as uid needs a root server")
async def test_unsandboxed_leftovers_of_a_dedicated_uid_are_swept(serve, world):
    """Unsandboxed, a detached grandchild would outlive its run and could read the
    next run's environment (same uid). With a dedicated --run-as-uid and one run
    at a time, every process of that uid is killed when the run ends."""
    tag = f"so-sweep-{uuid.uuid4().hex[:12]}"
    make_skill(world, "probe", [run_row("scripts/detach.py", timeout=20)], {"scripts/detach.py": DETACH})
    try:
        async with serve("--confirm", "auto", "--sandbox", "off", "--run-as-uid", "61999") as client:
            result = await ok(client, "skill_run", {"skill": "probe", "script": "scripts/detach.py", "args": [tag, "exit"]})
            assert result["exitCode"] == 0 and result["command"]["runAs"] == 61999, result
            await anyio.sleep(0.3)
            assert processes_running(tag) == [], "a detached grandchild of a dedicated uid outlived its run"
    finally:
        for pid in processes_running(tag):
            kill_leftover(pid, tag)


async def _read_text(client: Client, job: str, path: str) -> str:
    chunk = await ok(client, "skill_job_read", {"job": job, "path": path})
    assert chunk["encoding"] == "utf-8", chunk
    return chunk["content"]


# ------------------------------------------------------------- 8. output caps

FLOOD = """import sys
block = b"x" * 65536
for _ in range(40):
    sys.stdout.buffer.write(block)
sys.stdout.buffer.flush()
sys.stderr.write("done\\n")
"""
YES = """import sys
line = b"y\\n" * 32768
while True:
    sys.stdout.buffer.write(line)
"""


async def test_output_is_capped_and_flagged(serve, world):
    make_skill(
        world,
        "probe",
        [run_row("scripts/flood.py"), run_row("scripts/yes.py", timeout=2)],
        {"scripts/flood.py": FLOOD, "scripts/yes.py": YES},
    )
    async with serve("--confirm", "auto") as client:
        result = await ok(client, "skill_run", {"skill": "probe", "script": "scripts/flood.py"})
        assert result["exitCode"] == 0, result["stderr"]
        assert result["stdoutBytes"] == 40 * 65536, result["stdoutBytes"]
        assert result["stdoutTruncated"] is True
        assert 0 < len(result["stdout"].encode()) <= MIB
        assert result["stderr"] == "done\n" and result["stderrTruncated"] is False
        stored = await ok(client, "skill_job_read", {"job": result["job"], "stream": "stdout", "limit": 16})
        assert stored["size"] <= MIB, stored

        started = time.monotonic()
        result = await ok(client, "skill_run", {"skill": "probe", "script": "scripts/yes.py"})
        assert time.monotonic() - started < 7
        assert result["timedOut"] is True
        assert result["stdoutTruncated"] is True
        assert result["stdoutBytes"] > MIB
        assert len(result["stdout"].encode()) <= MIB
        await ok(client, "skill_list")


# ------------------------------------------------------------ 9. non-zero exit


async def test_nonzero_exit_is_a_normal_result(serve, world):
    script = "import sys\nprint('partial')\nsys.stderr.write('boom: bad input\\n')\nsys.exit(3)\n"
    make_skill(world, "probe", [run_row("scripts/fail.py")], {"scripts/fail.py": script})
    async with serve("--confirm", "auto") as client:
        is_error, result = await tool(client, "skill_run", {"skill": "probe", "script": "scripts/fail.py"})
    assert is_error is False, result
    assert result["status"] == "completed" and result["state"] == "failed", result
    assert result["exitCode"] == 3 and result["signal"] is None and result["timedOut"] is False
    assert result["stdout"] == "partial\n"
    assert result["stderr"] == "boom: bad input\n"


# ------------------------------------------------------ 10. hostile resource use

FORK_BOMB = ":(){ :|:& };:\n"
# The classic bomb's first shell exits 0 at once (its children run in the
# background); this one keeps every level waiting on its pipeline.
WAITING_FORK_BOMB = "bomb() { bomb | bomb; }; bomb\n"
MEMORY_HOG = "b = bytearray(2 * 1024 ** 3)\nb[-1] = 1\nprint('allocated')\n"
DISK_FILLER = """block = b"\\0" * (1024 * 1024)
with open("fill.bin", "wb") as f:
    for _ in range(100):
        f.write(block)
print("wrote 100 MiB")
"""


@pytest.mark.parametrize("kind", ["fork-bomb", "waiting-fork-bomb", "memory-hog", "disk-filler"])
async def test_hostile_scripts_fail_and_the_server_keeps_serving(serve, world, kind):
    tag = uuid.uuid4().hex[:12]
    script, interpreter, source = {
        "fork-bomb": (f"scripts/bomb-{tag}.sh", "bash", FORK_BOMB),
        "waiting-fork-bomb": (f"scripts/bomb-{tag}.sh", "bash", WAITING_FORK_BOMB),
        "memory-hog": ("scripts/hog.py", "python", MEMORY_HOG),
        "disk-filler": ("scripts/fill.py", "python", DISK_FILLER),
    }[kind]
    make_skill(world, "probe", [run_row(script, interpreter, timeout=3)], {script: source})
    async with serve("--confirm", "auto") as client:
        started = time.monotonic()
        is_error, result = await tool(client, "skill_run", {"skill": "probe", "script": script})
        elapsed = time.monotonic() - started
        assert is_error is False, result
        assert elapsed < 3 + 2 + 0.25 + 1 + 1.0, f"{kind} returned after {elapsed:.1f} s"
        if kind == "fork-bomb":
            # The classic one-liner's own bash exits 0 at once; whether its children
            # hit the process cap first is a race. What must hold: the call returns in
            # bounds and no bomb process outlives the run (checked below). The
            # waiting variant, which keeps the script alive, must end as a failure.
            assert result["state"] in ("succeeded", "failed", "timed-out", "limit-exceeded"), result
        else:
            assert result["state"] in ("failed", "timed-out", "limit-exceeded"), (result["state"], result["stderr"][-500:])
            assert result["exitCode"] != 0 or result["timedOut"] or result["signal"] is not None or result.get("limitExceeded")
        if kind == "waiting-fork-bomb" and "per process only" not in (await ok(client, "skill_list"))["execution"]["sandbox"]["detail"]:
            # With a cgroup per run, the refused fork is seen and the run stopped at once.
            assert (result["state"], result.get("limitExceeded")) == ("limit-exceeded", "pids"), result
        if kind in ("memory-hog", "disk-filler"):
            assert "allocated" not in result["stdout"] and "wrote 100 MiB" not in result["stdout"], result["stdout"]
        if kind == "disk-filler":
            sizes = {f["path"]: f["size"] for f in result["outputs"]["files"]}
            assert sizes.get("fill.bin", 0) < 100 * MIB, sizes
        if "bomb" in kind:
            await anyio.sleep(0.3)
            assert processes_running(f"bomb-{tag}") == [], "fork bomb processes outlived the run"
        listing = await ok(client, "skill_list")
        assert listing["skills"][0]["name"] == "probe"
        assert (await ok(client, "skill_job_status", {"job": result["job"]}))["state"] == result["state"]


# ------------------------------------------------------------- 11. concurrency

NAP = "import time\ntime.sleep(2)\nprint('woke')\n"


async def _two_runs(client: Client) -> list[tuple[bool, dict]]:
    results: list[tuple[bool, dict] | None] = [None, None]

    async def one(i: int) -> None:
        results[i] = await tool(client, "skill_run", {"skill": "probe", "script": "scripts/nap.py", "args": [str(i)]})

    async with anyio.create_task_group() as tg:
        tg.start_soon(one, 0)
        tg.start_soon(one, 1)
    return results  # type: ignore[return-value]


async def test_one_run_at_a_time_by_default(serve, world):
    make_skill(world, "probe", [run_row("scripts/nap.py")], {"scripts/nap.py": NAP})
    async with serve("--confirm", "auto") as client:
        results = await _two_runs(client)
        codes = sorted(
            (body.get("error") or {}).get("code", "") if is_error else body["status"] for is_error, body in results
        )
        assert codes == ["busy", "completed"], results
        busy = next(body for is_error, body in results if is_error)
        assert "at most 1" in busy["error"]["message"], busy
        jobs = (await ok(client, "skill_job_list"))["jobs"]
        assert len(jobs) == 1, f"the busy call left a job behind: {[(j['id'], j['state']) for j in jobs]}"
        # And the slot is free again afterwards.
        await ok(client, "skill_run", {"skill": "probe", "script": "scripts/nap.py"})


async def test_max_concurrent_runs_two(serve, world):
    make_skill(world, "probe", [run_row("scripts/nap.py")], {"scripts/nap.py": NAP})
    async with serve("--confirm", "auto", "--max-concurrent-runs", "2") as client:
        started = time.monotonic()
        results = await _two_runs(client)
        elapsed = time.monotonic() - started
    for is_error, body in results:
        assert not is_error and body["status"] == "completed" and body["stdout"] == "woke\n", body
    assert elapsed < 3.8, f"two 2 s runs took {elapsed:.1f} s: they did not overlap"


# -------------------------------------------------------------------- 12. jobs

TRANSFORM = """import hashlib, os, sys
data = open("data/in.bin", "rb").read()
os.makedirs("out", exist_ok=True)
with open("out/result.bin", "wb") as f:
    f.write(bytes(b ^ 0x5A for b in data))
print(hashlib.sha256(data).hexdigest(), len(data), " ".join(sys.argv[1:]))
"""
LINKER = """import os
os.symlink("/etc/passwd", "out")
os.symlink("/", "root")
open("fine.txt", "w").write("fine")
os.symlink("fine.txt", "alias")
"""


async def test_job_lifecycle(serve, world):
    make_skill(
        world,
        "probe",
        [run_row("scripts/transform.py"), run_row("scripts/link.py")],
        {"scripts/transform.py": TRANSFORM, "scripts/link.py": LINKER},
    )
    payload = os.urandom(5 * MIB // 2)  # 2.5 MiB
    expected = bytes(b ^ 0x5A for b in payload)
    async with serve("--confirm", "auto") as client:
        job = await ok(client, "skill_job_create", {"skill": "probe"})
        assert job["state"] == "created" and job["inputs"] == [] and job["skill"] == "probe", job
        jid = job["id"]

        chunks = [payload[:MIB], payload[MIB : 2 * MIB], payload[2 * MIB :]]
        info = await ok(client, "skill_job_upload", {"job": jid, "path": "data/in.bin", "content": _b64(chunks[0])})
        assert info["size"] == MIB, info
        body = await refused(
            client, "skill_job_upload", {"job": jid, "path": "data/in.bin", "content": _b64(chunks[1]), "offset": 5}, "job-wrong-offset"
        )
        assert str(MIB) in body["error"]["message"], body
        await refused(
            client, "skill_job_upload", {"job": jid, "path": "data/in.bin", "content": _b64(b"x" * (MIB + 1))}, "job-chunk-too-large"
        )
        await refused(client, "skill_job_upload", {"job": jid, "path": "../escape", "content": _b64(b"x")}, "job-bad-path")
        info = await ok(client, "skill_job_upload", {"job": jid, "path": "data/in.bin", "content": _b64(chunks[1]), "offset": MIB})
        assert info["size"] == 2 * MIB
        info = await ok(client, "skill_job_upload", {"job": jid, "path": "data/in.bin", "content": _b64(chunks[2]), "offset": 2 * MIB})
        assert info["size"] == len(payload)
        assert info["sha256"] == "sha256:" + hashlib.sha256(payload).hexdigest(), info

        status = await ok(client, "skill_job_status", {"job": jid})
        assert [(i["path"], i["size"]) for i in status["inputs"]] == [("data/in.bin", len(payload))]
        await refused(client, "skill_job_read", {"job": jid, "path": "data/in.bin"}, "job-not-run-yet")

        result = await ok(client, "skill_job_run", {"job": jid, "script": "scripts/transform.py", "args": ["a b"]})
        assert result["exitCode"] == 0, result["stderr"]
        assert result["stdout"] == f"{hashlib.sha256(payload).hexdigest()} {len(payload)} a b\n"
        files = {f["path"]: f for f in result["outputs"]["files"]}
        assert files["out/result.bin"]["size"] == len(expected)
        assert files["out/result.bin"]["sha256"] == "sha256:" + hashlib.sha256(expected).hexdigest()
        assert files["out/result.bin"]["input"] == "not-an-input"
        assert files["data/in.bin"]["input"] == "unchanged"

        # Read the output back in 256 KiB chunks.
        got, offset = bytearray(), 0
        while True:
            chunk = await ok(client, "skill_job_read", {"job": jid, "path": "out/result.bin", "offset": offset, "limit": 262144})
            data = base64.b64decode(chunk["content"]) if chunk["encoding"] == "base64" else chunk["content"].encode()
            assert chunk["returned"] == len(data) <= 262144 and chunk["size"] == len(expected), chunk["returned"]
            got += data
            offset += len(data)
            if chunk["eof"]:
                break
        assert bytes(got) == expected, "the output read back differs from what the script wrote"

        await refused(client, "skill_job_read", {"job": jid, "path": "out/result.bin", "limit": 262145}, "job-read-too-large")
        await refused(client, "skill_job_upload", {"job": jid, "path": "late.txt", "content": _b64(b"late")}, "job-uploads-closed")
        await refused(client, "skill_job_run", {"job": jid, "script": "scripts/transform.py"}, "job-already-ran")
        stdout = await ok(client, "skill_job_read", {"job": jid, "stream": "stdout"})
        assert stdout["content"] == result["stdout"]

        # A script that plants links in its work directory.
        other = (await ok(client, "skill_job_create", {"skill": "probe"}))["id"]
        result = await ok(client, "skill_job_run", {"job": other, "script": "scripts/link.py"})
        assert result["exitCode"] == 0, result["stderr"]
        skipped = {s["path"]: s["kind"] for s in result["outputs"]["skipped"]}
        assert skipped.get("out") == "symlink" and skipped.get("root") == "symlink", result["outputs"]
        assert "out" not in {f["path"] for f in result["outputs"]["files"]}
        await refused(client, "skill_job_read", {"job": other, "path": "out"}, "job-escapes", "job-not-a-file")
        await refused(client, "skill_job_read", {"job": other, "path": "root/etc/passwd"}, "job-escapes", "job-not-a-file", "job-no-such-file")
        fine = await ok(client, "skill_job_read", {"job": other, "path": "alias"})
        assert fine["content"] == "fine"

        listed = await ok(client, "skill_job_list", {"skill": "probe"})
        assert {j["id"] for j in listed["jobs"]} == {jid, other}
        assert (await ok(client, "skill_job_delete", {"job": jid}))["deleted"] is True
        await refused(client, "skill_job_status", {"job": jid}, "job-not-found")
        assert [j["id"] for j in (await ok(client, "skill_job_list"))["jobs"]] == [other]


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


# ----------------------------------------------------------------- 13. restart

LONG = """import os, time
with open("starts.log", "a") as f:
    f.write("started\\n")
time.sleep(25)
"""


async def test_restart_marks_a_running_job_interrupted_and_never_reruns(serve, binary, world):
    tag = f"long-{uuid.uuid4().hex[:12]}"
    script = f"scripts/{tag}.py"
    make_skill(world, "probe", [run_row(script, timeout=30)], {script: LONG})
    server = FlaggedHttpServer(binary, world, ["--confirm", "auto"], None, world / "http.log")
    job_id = None
    try:
        url = await anyio.to_thread.run_sync(server.wait_ready)
        with anyio.fail_after(20):
            async with http_client(url, server.token) as watcher:

                async def long_call() -> None:
                    try:
                        async with http_client(url, server.token) as runner:
                            await runner.call_tool("skill_run", {"skill": "probe", "script": script})
                    except BaseException:  # the server is killed under this call
                        pass

                async with anyio.create_task_group() as tg:
                    tg.start_soon(long_call)
                    for _ in range(100):
                        jobs = (await ok(watcher, "skill_job_list"))["jobs"]
                        if jobs and jobs[0]["state"] == "running":
                            job_id = jobs[0]["id"]
                            break
                        await anyio.sleep(0.05)
                    assert job_id, "the run never showed as running"
                    await anyio.sleep(0.5)  # let the script log its start
                    os.kill(server.proc.pid, signal.SIGKILL)
                    server.proc.wait(timeout=5)
                    tg.cancel_scope.cancel()
        await anyio.sleep(0.3)
        assert processes_running(tag) == [], "the script outlived the killed server (bwrap --die-with-parent)"
    except BaseExceptionGroup:
        if job_id is None:
            raise
    finally:
        server.stop()

    # The job belongs to the HTTP principal: ask with the same token after the restart.
    again = FlaggedHttpServer(binary, world, ["--confirm", "auto"], None, world / "http-again.log", token=server.token)
    try:
        url = await anyio.to_thread.run_sync(again.wait_ready)
        async with http_client(url, again.token) as client:
            status = await ok(client, "skill_job_status", {"job": job_id})
            assert status["state"] == "interrupted", status
            assert status["run"]["note"] and "not re-run" in status["run"]["note"], status["run"]
            assert status["run"]["finishedAtMs"] is None
            await anyio.sleep(1.0)
            log = await _read_text(client, job_id, "starts.log")
            assert log == "started\n", f"the interrupted run was started again: {log!r}"
            await refused(client, "skill_job_run", {"job": job_id, "script": script}, "job-already-ran")
            assert (await ok(client, "skill_job_status", {"job": job_id}))["state"] == "interrupted"
    finally:
        again.stop()


# ----------------------------------------------------------------- 14. sandbox

SANDBOX_PROBE = """import json, os
json.dump({"cwd": os.getcwd(), "pid1": open("/proc/1/comm").read().strip(), "uid": os.getuid()}, open(1, "w"))
"""


async def test_sandbox_required_refuses_when_bwrap_is_unusable(serve, world):
    fake_bin = world / "fakebin"
    fake_bin.mkdir(mode=0o755)
    fake = fake_bin / "bwrap"
    fake.write_text("#!/bin/sh\necho 'fake bwrap: no user namespaces' >&2\nexit 1\n")
    fake.chmod(0o755)
    make_skill(world, "probe", [run_row("scripts/echo.py")], {"scripts/echo.py": ECHO_PY})
    env = {"PATH": f"{fake_bin}:/usr/local/bin:/usr/bin:/bin"}
    # bubblewrap only, and it does not work: nothing runs.
    async with serve("--confirm", "auto", "--sandbox", "required", "--sandbox-backend", "bwrap", env=env) as client:
        await refused(client, "skill_run", {"skill": "probe", "script": "scripts/echo.py"}, "sandbox-required")
        assert await job_count(client) == 0, "a refused run created a job"
        listing = await ok(client, "skill_list")
        sandbox = listing["execution"]["sandbox"]
        assert sandbox["mode"] == "required" and sandbox["active"] is False, sandbox
        assert str(fake) in sandbox["detail"], sandbox
        assert "apt-get install bubblewrap" in sandbox["detail"], "the detail says what to install"
    # --sandbox auto, bubblewrap only: falls back to plain processes, and says so.
    async with serve("--confirm", "ask", "--sandbox", "auto", "--sandbox-backend", "bwrap", env=env) as client:
        # A preview waits for the start-up self-test (skill_list may answer before it, as pending).
        preview = await ok(client, "skill_run", {"skill": "probe", "script": "scripts/echo.py"})
        assert preview["preview"]["command"]["sandbox"] == "off"
        assert "egress is NOT enforced" not in preview["preview"]["command"]["network"], "the probe declares no egress"
        sandbox = (await ok(client, "skill_list"))["execution"]["sandbox"]
        assert sandbox["active"] is False and "does not work" in sandbox["detail"], sandbox
    # The default backend: the built-in sandbox takes over from the broken bubblewrap, and says why.
    async with serve("--confirm", "ask", "--sandbox", "required", env=env) as client:
        preview = await ok(client, "skill_run", {"skill": "probe", "script": "scripts/echo.py"})
        assert preview["preview"]["command"]["sandbox"] == "builtin", preview
        sandbox = (await ok(client, "skill_list"))["execution"]["sandbox"]
        assert sandbox["active"] is True and sandbox["detail"].startswith("built-in sandbox"), sandbox
        assert "does not work" in sandbox["detail"], "the detail names why bubblewrap was not taken"


async def test_builtin_sandbox_runs_what_bubblewrap_runs(serve, world):
    """A machine without bubblewrap: the built-in sandbox, same view as bubblewrap's."""
    make_skill(world, "probe", [run_row("scripts/probe.py")], {"scripts/probe.py": SANDBOX_PROBE})
    async with serve("--confirm", "auto", "--sandbox", "required", "--sandbox-backend", "builtin") as client:
        result = await ok(client, "skill_run", {"skill": "probe", "script": "scripts/probe.py"})
        assert result["command"]["sandbox"] == "builtin", result["command"]
        seen = stdout_json(result)
        assert seen["cwd"] == "/work", seen
        assert result["command"]["network"].startswith("none"), result["command"]
        if os.geteuid() == 0:
            assert seen["uid"] != 0 and result["command"]["runAs"] != 0, (seen, result["command"])


async def test_sandbox_off_and_auto(serve, world):
    make_skill(world, "probe", [run_row("scripts/probe.py")], {"scripts/probe.py": SANDBOX_PROBE})
    async with serve("--confirm", "auto", "--sandbox", "off") as client:
        assert (await ok(client, "skill_list"))["execution"]["sandbox"]["active"] is False
        result = await ok(client, "skill_run", {"skill": "probe", "script": "scripts/probe.py"})
        assert result["command"]["sandbox"] == "off"
        seen = stdout_json(result)
        assert seen["cwd"].startswith(str(world / "data")), seen
        assert seen["pid1"] != "bwrap"
        assert result["command"]["network"].startswith("unrestricted")
    async with serve("--confirm", "auto", "--sandbox", "auto") as client:
        status = (await ok(client, "skill_list"))["execution"]["sandbox"]
        if not status["active"]:
            pytest.fail(f"bubblewrap is installed but not active: {status['detail']}")
        result = await ok(client, "skill_run", {"skill": "probe", "script": "scripts/probe.py"})
        assert result["command"]["sandbox"] == "bubblewrap"
        assert stdout_json(result)["cwd"] == "/work"
        assert result["command"]["network"].startswith("none")
    if os.geteuid() == 0:
        assert seen["uid"] != 0 and result["command"]["runAs"] != 0


# --------------------------------------------------------- 15. retention cap


async def test_job_cap(serve, world):
    make_skill(world, "probe", [run_row("scripts/echo.py")], {"scripts/echo.py": ECHO_PY})
    async with serve("--confirm", "auto") as client:
        retained = (await ok(client, "skill_job_list"))["retainedMax"]
        assert retained == 100
        ids = [(await ok(client, "skill_job_create", {"skill": "probe"}))["id"] for _ in range(retained)]
        assert len(set(ids)) == retained
        body = await refused(client, "skill_job_create", {"skill": "probe"}, "job-cap-reached")
        assert "delete" in body["error"]["message"]
        await refused(client, "skill_run", {"skill": "probe", "script": "scripts/echo.py"}, "job-cap-reached")
        await ok(client, "skill_job_delete", {"job": ids[0]})
        result = await ok(client, "skill_run", {"skill": "probe", "script": "scripts/echo.py"})
        assert result["exitCode"] == 0
        await refused(client, "skill_job_create", {"skill": "probe"}, "job-cap-reached")


# ------------------------------------------------------------ confirmation gate


async def test_confirmation_token_flow(serve, world):
    make_skill(world, "probe", [run_row("scripts/echo.py")], {"scripts/echo.py": ECHO_PY})
    call = {"skill": "probe", "script": "scripts/echo.py", "args": ["one"]}
    async with serve("--confirm", "ask") as client:
        preview = await ok(client, "skill_run", call)
        assert preview["status"] == "confirmation-required" and preview["token"], preview
        assert preview["expiresInSecs"] > 0
        shown = preview["preview"]
        assert (shown["skill"], shown["script"], shown["interpreter"]) == ("probe", "scripts/echo.py", "python")
        assert shown["job"] is None and shown["grantFrom"] == "declaration"
        command = shown["command"]
        assert command["argv"][-1] == "one" and Path(command["program"]).name.startswith("python")
        for key in ("cwd", "timeoutSecs", "env", "envMissing", "sandbox", "network", "runAs"):
            assert key in command, key
        assert command["timeoutSecs"] == 10
        assert await job_count(client) == 0, "a preview started something"

        await refused(client, "skill_run", {**call, "args": ["two"], "confirm": preview["token"]}, "call-changed")
        await refused(
            client, "skill_run", {**call, "inputs": [{"path": "in.txt", "content": "x"}], "confirm": preview["token"]}, "call-changed"
        )
        await refused(client, "skill_run", {**call, "confirm": "0" * 32}, "token-unknown")
        result = await ok(client, "skill_run", {**call, "confirm": preview["token"]})
        assert stdout_json(result)["argv"] == ["one"]
        await refused(client, "skill_run", {**call, "confirm": preview["token"]}, "token-reused")
        assert await job_count(client) == 1

        # The job flow goes through the same gate.
        jid = (await ok(client, "skill_job_create", {"skill": "probe"}))["id"]
        await ok(client, "skill_job_upload", {"job": jid, "path": "in.txt", "content": _b64(b"hello")})
        preview = await ok(client, "skill_job_run", {"job": jid, "script": "scripts/echo.py"})
        assert preview["status"] == "confirmation-required" and preview["preview"]["job"] == jid
        assert [i["path"] for i in preview["preview"]["inputs"]] == ["in.txt"]
        assert (await ok(client, "skill_job_status", {"job": jid}))["state"] == "created"
        result = await ok(client, "skill_job_run", {"job": jid, "script": "scripts/echo.py", "confirm": preview["token"]})
        assert result["status"] == "completed" and result["exitCode"] == 0


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_confirmation_by_elicitation(serve, world, mode):
    make_skill(world, "probe", [run_row("scripts/echo.py")], {"scripts/echo.py": ECHO_PY})
    asked: list[str] = []

    async def accept(context, params) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"run": True})

    async def decline(context, params) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="decline")

    call = {"skill": "probe", "script": "scripts/echo.py", "args": ["via-elicitation"]}
    async with serve("--confirm", "ask", elicitation=accept, mode=mode) as client:
        result = await ok(client, "skill_run", call)
        assert result["status"] == "completed", result
        assert stdout_json(result)["argv"] == ["via-elicitation"]
    assert asked and "scripts/echo.py" in asked[0], asked

    asked.clear()
    async with serve("--confirm", "ask", elicitation=decline, mode=mode) as client:
        before = await job_count(client)  # same data directory: the accepted run is retained
        result = await ok(client, "skill_run", call)
        assert result["status"] == "declined", result
        assert result["preview"]["script"] == "scripts/echo.py"
        assert await job_count(client) == before, "a declined run started something"
    assert asked


@pytest.mark.parametrize("value", ["refuse", "yes", "AUTO"])
async def test_confirm_refuse_and_unknown_values_run_nothing(serve, world, value):
    make_skill(world, "probe", [run_row("scripts/echo.py")], {"scripts/echo.py": ECHO_PY})
    async with serve("--confirm", value) as client:
        body = await refused(client, "skill_run", {"skill": "probe", "script": "scripts/echo.py"}, "runs-refused")
        assert body["preview"]["script"] == "scripts/echo.py", body
        assert body["preview"]["command"]["argv"][1].endswith("scripts/echo.py")
        assert (await ok(client, "skill_list"))["execution"]["confirm"] == "refuse"
        assert await job_count(client) == 0


# --------------------------------------------------------------------- HTTP


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_basic_run_over_http(binary, world, mode):
    make_skill(world, "probe", [run_row("scripts/echo.py")], {"scripts/echo.py": ECHO_PY})
    server = FlaggedHttpServer(binary, world, ["--confirm", "ask"], None, world / "http.log")
    try:
        url = await anyio.to_thread.run_sync(server.wait_ready)
        with _unwrapped(), anyio.fail_after(CLIENT_TIMEOUT):
            async with http_client(url, server.token, mode) as client:
                call = {"skill": "probe", "script": "scripts/echo.py", "args": ["over http", "$(id)"]}
                preview = await ok(client, "skill_run", call)
                assert preview["status"] == "confirmation-required", preview
                result = await ok(client, "skill_run", {**call, "confirm": preview["token"]})
                assert stdout_json(result)["argv"] == ["over http", "$(id)"]
                jid = (await ok(client, "skill_job_create", {"skill": "probe"}))["id"]
                await ok(client, "skill_job_upload", {"job": jid, "path": "in.txt", "content": _b64(b"abc")})
                preview = await ok(client, "skill_job_run", {"job": jid, "script": "scripts/echo.py"})
                result = await ok(client, "skill_job_run", {"job": jid, "script": "scripts/echo.py", "confirm": preview["token"]})
                assert result["exitCode"] == 0
                assert (await ok(client, "skill_job_read", {"job": jid, "path": "in.txt"}))["content"] == "abc"
    finally:
        server.stop()
