"""A real redis-server for tests: an ephemeral loopback port, its files in a temporary directory,
every write fsync'd before Redis answers (the settings docs/deploying.md asks for)."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

REDIS_SERVER = shutil.which("redis-server") or ("/usr/bin/redis-server" if Path("/usr/bin/redis-server").exists()
                                                else None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def require_redis() -> str:
    if REDIS_SERVER is None:
        pytest.skip("redis-server is not installed (make venv installs Debian's redis-server)")
    return REDIS_SERVER


class RedisServer:
    def __init__(self, directory: Path, port: int | None = None):
        self.directory = directory
        self.port = port or free_port()
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [require_redis(), "--bind", "127.0.0.1", "--port", str(self.port), "--dir", str(self.directory),
             "--appendonly", "yes", "--appendfsync", "always", "--save", "", "--protected-mode", "no",
             "--daemonize", "no", "--logfile", str(self.directory / "redis.log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.process.returncode}: "
                                   f"{(self.directory / 'redis.log').read_text()[-2000:]}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    return self
            time.sleep(0.05)
        raise RuntimeError("redis-server did not answer within 10 s")

    def kill(self) -> None:
        """kill -9: no chance to write anything more."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@contextlib.contextmanager
def running_redis(directory: Path):
    server = RedisServer(directory).start()
    try:
        yield server
    finally:
        server.stop()
