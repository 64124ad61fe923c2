"""A real ax for the tests: a nats-server of our own (free port, temporary store) and
``ax --nats URL up`` on it, both killed at the end. ``AX_BIN`` and ``NATS_SERVER`` name the
binaries (the repository's debug build and its pinned nats-server by default)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterator, List, Optional

import pytest

import nats

ROOT = Path(__file__).resolve().parents[3]
AX_BIN = os.environ.get("AX_BIN", str(ROOT / "target" / "debug" / "ax"))
NATS_SERVER = os.environ.get("NATS_SERVER", str(ROOT / ".tools" / "nats-server" / "bin" / "nats-server"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(what: str, check, timeout: float = 60.0):
    """``check()``'s first truthy value, tried until ``timeout`` (no bare sleeps in tests)."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


class Cluster:
    """A nats-server and an ``ax up`` on it; the server can be restarted on the same port and
    store."""

    def __init__(self, auth: bool = False, demo: bool = False) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="ax-py-"))
        self.port = free_port()
        self.url = f"nats://127.0.0.1:{self.port}"
        self.auth = auth
        self.demo = demo
        self.nats: Optional[subprocess.Popen] = None
        self.ax: Optional[subprocess.Popen] = None
        self.start_nats()
        self.start_ax()

    def start_nats(self) -> None:
        log = open(self.dir / "nats.log", "ab")
        self.nats = subprocess.Popen(
            [NATS_SERVER, "-js", "-a", "127.0.0.1", "-p", str(self.port), "-sd", str(self.dir / "store")],
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
        wait_until("nats-server to listen", self._listening)

    def _listening(self) -> bool:
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
            return True
        except OSError:
            return False

    def stop_nats(self) -> None:
        if self.nats and self.nats.poll() is None:
            self.nats.terminate()
            self.nats.wait(timeout=30)
        wait_until("the port to be free", lambda: not self._listening())

    def restart_nats(self) -> None:
        self.stop_nats()
        self.start_nats()

    def start_ax(self) -> None:
        args: List[str] = [
            AX_BIN,
            "--nats",
            self.url,
            "up",
            "--data-dir",
            str(self.dir / "ax"),
            "--http-port",
            str(free_port()),
        ]
        if self.auth:
            args.append("--auth")
        if self.demo:
            args += ["--jobs", str(ROOT / "config" / "jobs"), "--plugin-dir", str(ROOT / "examples" / "plugins")]
        log = open(self.dir / "ax.log", "ab")
        self.ax = subprocess.Popen(args, stdout=log, stderr=log, start_new_session=True)
        wait_until("a Scheduler answering requests", self._answering, timeout=120)
        if self.demo:
            # `ax up` applies the demo jobs once it is up, in one apply: one of them found, all are.
            wait_until("the demo jobs applied", self._has_demo_jobs, timeout=120)

    def _has_demo_jobs(self) -> bool:
        found = subprocess.run(
            [AX_BIN, "--nats", self.url, "job", "get", "hello"], capture_output=True
        )
        return found.returncode == 0

    def _answering(self) -> bool:
        """True once a Scheduler answers a plain request (here: an unknown command)."""
        import asyncio

        async def ask() -> bool:
            try:
                nc = await nats.connect(self.url, max_reconnect_attempts=0)
            except Exception:
                return False
            try:
                await nc.request("ax.request.hello", b"{}", timeout=1)
                return True
            except Exception:
                return False
            finally:
                await nc.close()

        return asyncio.run(ask())

    def admin_token(self) -> str:
        path = self.dir / "ax" / "admin.token"
        return wait_until("the admin token", lambda: path.exists() and path.read_text().strip())

    def log(self) -> str:
        return (self.dir / "ax.log").read_text(errors="replace")

    def stop(self) -> None:
        for process in (self.ax, self.nats):
            if process and process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=30)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    cluster = Cluster()
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def demo() -> Iterator[Cluster]:
    """`ax up` with the demo jobs of config/jobs, as scripts/up runs it."""
    cluster = Cluster(demo=True)
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def secured() -> Iterator[Cluster]:
    cluster = Cluster(auth=True)
    yield cluster
    cluster.stop()
