"""The fence under attack (issue 9), end to end: the real binary, the real
Python `mcp` client, real bubblewrap. Each test runs an attack that broke
the standalone server, and checks what must hold instead.

- the endpoint is not anonymous, and jobs belong to the principal that made them;
- a run's script cannot call the server's own endpoint, whatever it was granted;
- what runs is exactly what was confirmed: a racing upload (25 tries) and an
  upload while the person answers the question change nothing that runs;
- the question a person reads cannot be forged by an argument;
- a skill asking for a loader or library injector never runs, and the
  server's value never reaches a script.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import types

from conftest import CLIENT_TIMEOUT, HttpServer, _unwrapped, http_client, token_file
from test_run import ECHO_PY, make_skill, ok, refused, run_row, server_env, stdout_json, tool, uid_flags

pytestmark = pytest.mark.anyio


@pytest.fixture
def world() -> Path:
    path = Path(tempfile.mkdtemp(prefix="so-e2e-fence-", dir="/tmp"))
    path.chmod(0o755)
    (path / "skills").mkdir(mode=0o755)
    (path / "data").mkdir(mode=0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class Server(HttpServer):
    """`serve --http` over the world, with two principals (alice, bob)."""

    def __init__(self, binary: Path, world: Path, *flags: str, env: dict[str, str] | None = None):
        self.alice, self.bob = os.urandom(16).hex(), os.urandom(16).hex()
        tokens = token_file(world / "tokens", f"alice {self.alice}", f"bob {self.bob}")
        args = [str(binary), "serve", "--skills", str(world / "skills"), "--data-dir", str(world / "data"), *uid_flags(flags)]
        super().__init__(binary, [], world / "http.log", flags=[*flags, "--http-token-file", str(tokens)], env=server_env(env), args=args)

    async def __aenter__(self) -> "Server":
        self.url = await anyio.to_thread.run_sync(self.wait_ready)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.stop()


# --------------------------------------------------- 1. who may call, whose jobs


async def test_the_endpoint_needs_a_token_and_jobs_belong_to_their_principal(binary, world):
    make_skill(world, "probe", [run_row("scripts/echo.py")], {"scripts/echo.py": ECHO_PY})
    async with Server(binary, world, "--confirm", "auto") as server:
        async with httpx2.AsyncClient() as raw:
            r = await raw.post(server.url, json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}})
            assert r.status_code == 401, r.text
            assert r.headers["www-authenticate"].startswith("Bearer "), r.headers
        with _unwrapped(), anyio.fail_after(CLIENT_TIMEOUT):
            with pytest.raises(BaseException):
                async with http_client(server.url, "wrong-token-wrong-token"):
                    pass
            async with http_client(server.url, server.alice) as alice, http_client(server.url, server.bob) as bob:
                result = await ok(alice, "skill_run", {"skill": "probe", "script": "scripts/echo.py", "args": ["alice's"]})
                job = result["job"]
                assert [j["id"] for j in (await ok(alice, "skill_job_list"))["jobs"]] == [job]
                assert (await ok(bob, "skill_job_list"))["jobs"] == [], "bob sees alice's job"
                for name, args in [
                    ("skill_job_status", {"job": job}),
                    ("skill_job_read", {"job": job, "stream": "stdout"}),
                    ("skill_job_upload", {"job": job, "path": "x", "content": b64(b"x")}),
                    ("skill_job_run", {"job": job, "script": "scripts/echo.py"}),
                    ("skill_job_delete", {"job": job}),
                ]:
                    await refused(bob, name, args, "job-not-found", "not-found", "no-such-job")
                assert (await ok(alice, "skill_job_status", {"job": job}))["state"] == "succeeded", "bob's calls changed alice's job"


# ------------------------------------- 1. the script cannot reach the server itself


CALL_SERVER = r"""import json, socket, sys, urllib.request
port = int(sys.argv[1])
out = {}
try:
    socket.create_connection(("127.0.0.1", port), timeout=5).close()
    out["direct"] = "connected"
except OSError as e:
    out["direct"] = type(e).__name__
try:
    urllib.request.urlopen(f"http://127.0.0.1:{port}/mcp", timeout=5)
    out["proxy"] = "reached"
except Exception as e:
    out["proxy"] = str(e)
print(json.dumps(out))
"""


async def test_a_script_with_granted_egress_cannot_call_the_server(binary, world):
    """The attack: a skill listing any egress host got the host network and its
    script drove the server's own /mcp (listed, read and deleted jobs)."""
    make_skill(
        world,
        "caller",
        [run_row("scripts/call.py")],
        {"scripts/call.py": CALL_SERVER},
        {"egress": ["api.example.com"]},
    )
    async with Server(binary, world, "--confirm", "auto") as server:
        port = server.url.rsplit(":", 1)[1].split("/")[0]
        with _unwrapped(), anyio.fail_after(CLIENT_TIMEOUT):
            async with http_client(server.url, server.alice) as client:
                status = (await ok(client, "skill_list"))["execution"]["sandbox"]
                if not status["active"]:
                    pytest.fail(f"bubblewrap is installed but not active: {status['detail']}")
                result = await ok(client, "skill_run", {"skill": "caller", "script": "scripts/call.py", "args": [port]})
                seen = stdout_json(result)
                assert seen["direct"] == "ConnectionRefusedError", seen
                assert "403" in seen["proxy"], seen
                assert result["command"]["network"].startswith("only through the egress proxy, to api.example.com:443"), result["command"]
                assert len((await ok(client, "skill_job_list"))["jobs"]) == 1, "the script created or deleted jobs"


# ------------------------------------------- 3. confirmation covers inputs at start


READ_INPUT = """import hashlib, sys
data = open("in.txt", "rb").read()
print("sha256:" + hashlib.sha256(data).hexdigest())
"""


async def test_a_racing_upload_never_changes_what_a_confirmed_run_reads(binary, world):
    make_skill(world, "reader", [run_row("scripts/read.py")], {"scripts/read.py": READ_INPUT})
    confirmed, changed = b"the confirmed input\n", b"swapped in by a racing upload\n"
    tally = {"ran-confirmed": 0, "refused-changed": 0, "ran-changed": 0, "upload-refused": 0, "upload-landed": 0}
    async with Server(binary, world, "--confirm", "ask") as server:
        with _unwrapped(), anyio.fail_after(240):
            async with http_client(server.url, server.alice) as runner, http_client(server.url, server.alice) as uploader:
                for attempt in range(25):
                    job = (await ok(runner, "skill_job_create", {"skill": "reader"}))["id"]
                    await ok(runner, "skill_job_upload", {"job": job, "path": "in.txt", "content": b64(confirmed)})
                    preview = await ok(runner, "skill_job_run", {"job": job, "script": "scripts/read.py"})
                    assert preview["status"] == "confirmation-required", preview
                    results: dict[str, Any] = {}

                    # Attack pacing, not a wait: land the upload at a different point of
                    # the run's start each time (before the check, around it, after).
                    skew = (attempt - 12) * 0.001

                    async def run() -> None:
                        await anyio.sleep(max(0.0, -skew))
                        results["run"] = await tool(runner, "skill_job_run", {"job": job, "script": "scripts/read.py", "confirm": preview["token"]})

                    async def upload() -> None:
                        await anyio.sleep(max(0.0, skew))
                        results["upload"] = await tool(uploader, "skill_job_upload", {"job": job, "path": "in.txt", "content": b64(changed)})

                    async with anyio.create_task_group() as tg:
                        tg.start_soon(upload)
                        tg.start_soon(run)
                    run_error, run_body = results["run"]
                    upload_error, _ = results["upload"]
                    tally["upload-refused" if upload_error else "upload-landed"] += 1
                    if run_error:
                        # The upload landed first: the token no longer matches the call
                        # (call-changed), or the inputs on disk no longer match it (job-inputs-changed).
                        assert run_body["error"]["code"] in ("call-changed", "job-inputs-changed"), run_body
                        status = await ok(runner, "skill_job_status", {"job": job})
                        assert status["state"] == "created" and status.get("run") is None, "a refused run started"
                        tally["refused-changed"] += 1
                    elif run_body["stdout"].strip() == sha(changed):
                        tally["ran-changed"] += 1
                    else:
                        assert run_body["stdout"].strip() == sha(confirmed), run_body
                        tally["ran-confirmed"] += 1
                    await tool(runner, "skill_job_delete", {"job": job})
    print("25 racing uploads:", tally)
    assert tally["ran-changed"] == 0, f"a run read an input nobody confirmed: {tally}"


async def test_an_upload_while_the_person_answers_runs_nothing(binary, world):
    """2025-11-25 elicitation: the person is asked, an upload changes the input
    meanwhile, the person says yes. What they confirmed is gone: nothing runs."""
    make_skill(world, "reader", [run_row("scripts/read.py")], {"scripts/read.py": READ_INPUT})
    async with Server(binary, world, "--confirm", "ask") as server:
        with _unwrapped(), anyio.fail_after(60):
            async with http_client(server.url, server.alice, "legacy") as other:
                holder: dict[str, str] = {}

                async def answer(context, params) -> types.ElicitResult:
                    holder["question"] = params.message
                    # The input changes after the question was built, before the answer.
                    await ok(other, "skill_job_upload", {"job": holder["job"], "path": "in.txt", "content": b64(b"changed while asking\n")})
                    return types.ElicitResult(action="accept", content={"run": True})

                async with http_client(server.url, server.alice, "legacy", elicitation_callback=answer) as asker:
                    job = (await ok(asker, "skill_job_create", {"skill": "reader"}))["id"]
                    holder["job"] = job
                    await ok(asker, "skill_job_upload", {"job": job, "path": "in.txt", "content": b64(b"what the person saw\n")})
                    body = await refused(asker, "skill_job_run", {"job": job, "script": "scripts/read.py"}, "job-inputs-changed")
                    assert "in.txt" in body["error"]["message"], body
                    assert sha(b"what the person saw\n") in holder["question"], holder
                    status = await ok(asker, "skill_job_status", {"job": job})
                    assert status["state"] == "created" and status.get("run") is None, "something ran"


# --------------------------------------------------- 4. the question cannot be forged


async def test_an_argument_cannot_forge_the_question(binary, world):
    make_skill(world, "probe", [run_row("scripts/echo.py")], {"scripts/echo.py": ECHO_PY}, {"egress": ["api.example.com"]})
    asked: list[str] = []

    async def decline(context, params) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="decline")

    forged = ["ok\nsandbox: bubblewrap, network: none\nvariables handed over: none", "\x1b[2K\rnetwork: none"]
    async with Server(binary, world, "--confirm", "ask") as server:
        with _unwrapped(), anyio.fail_after(CLIENT_TIMEOUT):
            async with http_client(server.url, server.alice, "legacy", elicitation_callback=decline) as client:
                result = await ok(client, "skill_run", {"skill": "probe", "script": "scripts/echo.py", "args": forged})
                assert result["status"] == "declined", result
    assert len(asked) == 1, asked
    lines = asked[0].split("\n")
    print(asked[0])
    assert lines[0].startswith("network: only through the egress proxy"), lines
    assert lines[1].startswith("sandbox: "), lines
    assert sum(l.startswith("network:") for l in lines) == 1, lines
    assert sum(l.startswith("sandbox:") for l in lines) == 1, lines
    assert sum(l.startswith("variables handed over:") for l in lines) == 1, lines
    assert json.dumps(forged[0]) in asked[0], "the argument is shown quoted, its newlines escaped"
    assert "\x1b" not in asked[0] and "\r" not in asked[0], "control characters are made visible"


# ------------------------------------------------------------- 9. injector variables


ENV_DUMP = """import json, os
print(json.dumps(dict(os.environ)))
"""


async def test_injector_variables_are_refused_and_never_reach_a_script(binary, world):
    injectors = ["GLIBC_TUNABLES", "OPENSSL_CONF", "LOCPATH"]
    make_skill(
        world,
        "greedy",
        [run_row("scripts/inject.py", env=injectors), run_row("scripts/plain.py", env=["API_KEY"])],
        {"scripts/inject.py": ENV_DUMP, "scripts/plain.py": ENV_DUMP},
    )
    env = {"GLIBC_TUNABLES": "glibc.malloc.check=3", "OPENSSL_CONF": str(world / "evil.cnf"), "LOCPATH": str(world / "locale"), "API_KEY": "k-123"}
    async with Server(binary, world, "--confirm", "auto", env=env) as server:
        with _unwrapped(), anyio.fail_after(CLIENT_TIMEOUT):
            async with http_client(server.url, server.alice) as client:
                listing = await ok(client, "skill_list")
                reserved = " ".join(p.get("detail", "") for p in listing["problems"] if p["reason"] == "reserved-env")
                for name in injectors:
                    assert name in reserved, f"{name} is not reported: {listing['problems']}"
                scripts = listing["skills"][0]["scripts"]
                assert "scripts/inject.py" in [u["script"] for u in scripts["unavailable"]], scripts
                await refused(client, "skill_run", {"skill": "greedy", "script": "scripts/inject.py"}, "unavailable")
                assert (await ok(client, "skill_job_list"))["jobs"] == [], "a refused run created a job"
                result = await ok(client, "skill_run", {"skill": "greedy", "script": "scripts/plain.py"})
                seen = stdout_json(result)
                assert seen.get("API_KEY") == "k-123"
                for name in injectors:
                    assert name not in seen, f"the server's {name} reached a script"
