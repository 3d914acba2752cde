"""Fixtures for the end-to-end tests: the real skill-operator binary, driven by
the real Python `mcp` client over stdio and Streamable HTTP, in both the
handshake era (mode="legacy") and with era discovery (mode="auto").

Binary: $SKILL_OPERATOR_BIN, else target/release/skill-operator under the repo
root. A missing binary, interpreter or Python package stops the run before any
test, naming what is missing and the command that provides it (it is never a
skip): run the suite as `target/test-deps/venv/bin/pytest tests/e2e` after
`bash scripts/install-test-deps.sh`.
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import subprocess
import threading
import time
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any, AsyncIterator

INSTALL = "bash scripts/install-test-deps.sh"
try:
    import anyio
    import pytest
    import yaml
    from mcp import Client, StdioServerParameters
    from mcp.client.stdio import stdio_client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client
except ImportError as missing:  # another python than the test venv's
    raise SystemExit(
        f"e2e: missing: the Python module {missing.name} (run: {INSTALL}, "
        "then run the suite with target/test-deps/venv/bin/pytest tests/e2e)"
    ) from None

REPO_ROOT = Path(__file__).resolve().parents[2]
SAMPLES = REPO_ROOT / "config" / "samples" / "skills"
SAMPLE_NAMES = ["csv-stats", "json-pretty", "release-notes", "weather-brief", "word-count"]

LISTENING = re.compile(r"^skill-operator: listening on (http://127\.0\.0\.1:(\d+)/mcp)\s*$")
HTTP_START_TIMEOUT = 15.0
CLIENT_TIMEOUT = 30.0  # per connection: no single test may hang the suite

TRANSPORTS = ["stdio", "http"]
MODES = ["auto", "legacy"]


def _binary_path() -> Path:
    raw = os.environ.get("SKILL_OPERATOR_BIN")
    path = Path(raw) if raw else REPO_ROOT / "target" / "release" / "skill-operator"
    return path if path.is_absolute() else (REPO_ROOT / path)


def pytest_report_header(config: pytest.Config) -> str:
    return f"skill-operator binary: {_binary_path()}"


# Where the server looks for interpreters (never the caller's PATH).
INTERPRETER_DIRS = ("/usr/local/bin", "/usr/bin", "/bin")


def missing_dependencies(binary: Path) -> list[str]:
    """One line per piece the suite needs and does not find, with how to get it."""
    missing = []
    if not binary.is_file() or not os.access(binary, os.X_OK):
        shown = binary.relative_to(REPO_ROOT) if binary.is_relative_to(REPO_ROOT) else binary
        missing.append(f"missing: {shown} (run: cargo build --release, or set SKILL_OPERATOR_BIN)")
    for name in ("bash", "python3", "node"):
        if not any(os.access(Path(d) / name, os.X_OK) for d in INTERPRETER_DIRS):
            missing.append(f"missing: {name} in {', '.join(INTERPRETER_DIRS)} (run: {INSTALL}, as root)")
    return missing


def pytest_sessionstart(session: pytest.Session) -> None:
    missing = missing_dependencies(_binary_path())
    if missing:
        pytest.exit("\n".join(f"e2e: {line}" for line in missing), returncode=1)


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def binary() -> Path:
    path = _binary_path()
    if not path.is_file() or not os.access(path, os.X_OK):
        pytest.fail(
            f"skill-operator binary not found or not executable: {path}\n"
            "Build it (cargo build --release) or point SKILL_OPERATOR_BIN at it.",
            pytrace=False,
        )
    return path


# ----------------------------------------------------------------- skill files


def split_skill_md(text: str) -> tuple[dict[str, Any], str]:
    """(frontmatter, body) of a SKILL.md: the body is everything after the closing `---` line."""
    assert text.startswith("---\n"), "SKILL.md must start with a frontmatter fence"
    match = re.search(r"^---[ \t]*\n", text[4:], flags=re.MULTILINE)
    assert match, "SKILL.md frontmatter is not closed"
    frontmatter = yaml.safe_load(text[4 : 4 + match.start()])
    body = text[4 + match.end() :]
    return frontmatter, body


def skill_files(skill_dir: Path) -> dict[str, bytes]:
    """Every regular file of a skill, by '/'-separated path relative to the skill root."""
    return {
        p.relative_to(skill_dir).as_posix(): p.read_bytes()
        for p in sorted(skill_dir.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


def write_skill(root: Path, dirname: str, frontmatter: str, body: str = "\n# Skill\n\nDo the thing.\n") -> Path:
    skill = root / dirname
    skill.mkdir(parents=True)
    (skill / "SKILL.md").write_text(f"---\n{frontmatter.strip()}\n---\n{body}")
    return skill


# ------------------------------------------------------------------ processes


def token_file(path: Path, *tokens: str) -> Path:
    """A --http-token-file: one `PRINCIPAL TOKEN` (or `TOKEN`) per line, mode 0600."""
    path.write_text("".join(t + "\n" for t in tokens))
    path.chmod(0o600)
    return path


class HttpServer:
    """`skill-operator serve ... --http 127.0.0.1:0`, waited for by its listening line.
    The endpoint needs a bearer token: the server gets `--http-token-file` with
    `self.token` (principal `e2e`) unless `flags` already name a token file or
    `--http-no-auth`."""

    def __init__(
        self,
        binary: Path,
        skills_dirs: list[Path],
        log_path: Path,
        flags: list[str] | None = None,
        env: dict[str, str] | None = None,
        args: list[str] | None = None,
        token: str | None = None,
    ):
        flags = list(flags or [])
        if args is None:
            args = [str(binary), "serve"]
            for d in skills_dirs:
                args += ["--skills", str(d)]
        self.token = token or secrets.token_hex(16)
        if "--http-token-file" not in flags and "--http-no-auth" not in flags:
            flags += ["--http-token-file", str(token_file(log_path.with_suffix(".tokens"), f"e2e {self.token}"))]
        args = [*args, *flags, "--http", "127.0.0.1:0"]
        self.args = args
        self.log_path = log_path
        self.url: str | None = None
        self._lines: list[str] = []
        self._ready = threading.Event()
        self.proc = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,
        )
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        with open(self.log_path, "a") as log:
            for line in self.proc.stderr:
                log.write(line)
                log.flush()
                self._lines.append(line)
                match = LISTENING.match(line)
                if match and self.url is None:
                    self.url = match.group(1)
                    self._ready.set()
        self._ready.set()  # EOF: unblock the waiter, which then sees no URL

    def wait_ready(self) -> str:
        deadline = time.monotonic() + HTTP_START_TIMEOUT
        while not self._ready.wait(0.05):
            if time.monotonic() > deadline:
                break
        if self.url is None:
            code = self.proc.poll()
            self.stop()
            state = f"exited with {code}" if code is not None else f"no listening line in {HTTP_START_TIMEOUT:.0f}s"
            pytest.fail(
                f"{' '.join(self.args)}: {state}; stderr:\n{''.join(self._lines)[-4000:]}",
                pytrace=False,
            )
        return self.url

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=3)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=3)
        self._reader.join(timeout=2)


@asynccontextmanager
async def http_client(url: str, token: str | None, mode: str = "auto", **kwargs: Any) -> AsyncIterator[Client]:
    """The real client over Streamable HTTP, sending `Authorization: Bearer <token>`."""
    headers = {"Authorization": f"Bearer {token}"} if token else None
    async with create_mcp_http_client(headers=headers) as http:
        async with Client(streamable_http_client(url, http_client=http), mode=mode, **kwargs) as client:
            yield client


@pytest.fixture(params=TRANSPORTS)
def transport(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def connect(binary: Path, transport: str, mode: str, tmp_path: Path):
    """`async with connect(dir, ...) as client:` starts a server over those skill roots,
    connects the real client with this test's transport and mode, and kills the
    server when the block ends. Server stderr goes to tmp_path/server-*.log."""
    counter = iter(range(1000))

    @asynccontextmanager
    async def _connect(*skills_dirs: Path) -> AsyncIterator[Client]:
        dirs = list(skills_dirs) or [SAMPLES]
        log_path = tmp_path / f"server-{next(counter)}.log"
        if transport == "stdio":
            args = ["serve"]
            for d in dirs:
                args += ["--skills", str(d)]
            params = StdioServerParameters(command=str(binary), args=args, cwd=str(tmp_path))
            with open(log_path, "w") as errlog, _unwrapped(), anyio.fail_after(CLIENT_TIMEOUT):
                async with Client(stdio_client(params, errlog=errlog), mode=mode) as client:
                    yield client
        else:
            server = HttpServer(binary, dirs, log_path)
            try:
                url = await anyio.to_thread.run_sync(server.wait_ready)
                with _unwrapped(), anyio.fail_after(CLIENT_TIMEOUT):
                    async with http_client(url, server.token, mode) as client:
                        yield client
            finally:
                server.stop()

    return _connect


@contextmanager
def _unwrapped():
    """Re-raise a test's own failure (assert, pytest.fail/skip) instead of the
    ExceptionGroup that the client's task groups wrap it in on the way out."""
    try:
        yield
    except BaseExceptionGroup as group:
        leaves = list(_leaves(group))
        if len(leaves) == 1:
            raise leaves[0] from None
        raise


def _leaves(group: BaseExceptionGroup):
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            yield from _leaves(exc)
        else:
            yield exc


# ------------------------------------------------------------------- helpers


async def call(client: Client, tool: str, arguments: dict[str, Any] | None = None) -> dict[str, Any]:
    """Call a tool that must succeed; return its structuredContent."""
    result = await client.call_tool(tool, arguments or {})
    text = " ".join(getattr(c, "text", "") for c in result.content)
    assert not result.is_error, f"{tool} returned isError: {text}"
    assert isinstance(result.structured_content, dict), f"{tool} has no structuredContent object: {text[:500]}"
    return result.structured_content


async def call_error(client: Client, tool: str, arguments: dict[str, Any]) -> str:
    """Call a tool that must fail as a tool result (isError: true); return its text."""
    result = await client.call_tool(tool, arguments)
    text = " ".join(getattr(c, "text", "") for c in result.content)
    assert result.is_error, f"{tool} {arguments} should have returned isError, got {result.structured_content!r}"
    assert text.strip(), f"{tool} error result carries no text message"
    return text


def root_path(root: Any) -> Path:
    """A `roots` entry of skill_list: a path string or an object with `path`."""
    raw = root["path"] if isinstance(root, dict) else root
    return Path(raw).resolve()


async def all_resources(client: Client) -> list[Any]:
    out: list[Any] = []
    cursor = None
    for _ in range(100):
        page = await client.list_resources(cursor=cursor)
        out.extend(page.resources)
        cursor = page.next_cursor
        if not cursor:
            return out
    raise AssertionError("resources/list pagination did not end after 100 pages")


async def all_prompts(client: Client) -> list[Any]:
    out: list[Any] = []
    cursor = None
    for _ in range(100):
        page = await client.list_prompts(cursor=cursor)
        out.extend(page.prompts)
        cursor = page.next_cursor
        if not cursor:
            return out
    raise AssertionError("prompts/list pagination did not end after 100 pages")



def pytest_configure(config):
    """With SKILL_OPERATOR_REQUIRE_GATED=1 a missing machine prerequisite of
    a gated test (root, for the dedicated run-as uid tests) fails the run
    instead of skipping them: a machine that has it must prove it ran them."""
    import os

    if os.environ.get("SKILL_OPERATOR_REQUIRE_GATED") == "1" and os.geteuid() != 0:
        raise pytest.UsageError("SKILL_OPERATOR_REQUIRE_GATED=1 but not root: the run-as uid tests would be skipped")
