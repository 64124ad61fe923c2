"""docs/integration.md as a test: every ``python`` block, in order, in one namespace, with
``client`` connected to an ``ax up`` running the demo jobs and ``db`` open on its demo
database (top-level ``await`` allowed, as in a notebook); and the README's example, a complete
program, run as written."""

from __future__ import annotations

import ast
import asyncio
import inspect
import os
import re
import sqlite3
import subprocess
import sys

import ax_client

from conftest import ROOT

GUIDE = ROOT / "docs" / "integration.md"


def blocks() -> list:
    text = GUIDE.read_text()
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


async def test_every_example_of_the_guide_runs(demo):
    found = blocks()
    assert len(found) >= 7, f"{GUIDE} has {len(found)} python blocks"
    db = sqlite3.connect(demo.dir / "ax" / "demo.db", timeout=30)
    async with await ax_client.connect(demo.url) as client:
        namespace = {"client": client, "db": db, "asyncio": asyncio, "ax_client": ax_client}
        for number, source in enumerate(found, start=1):
            code = compile(source, f"{GUIDE.name} block {number}", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
            ran = eval(code, namespace)  # noqa: S307 (the repository's own documentation)
            if inspect.iscoroutine(ran):
                await ran
    db.close()


def test_the_readme_example_runs_as_written(demo, tmp_path):
    readme = (ROOT / "README.md").read_text()
    found = re.findall(r"```python\n(.*?)```", readme, flags=re.S)
    assert len(found) == 1, f"README.md has {len(found)} python blocks"
    # Run from a folder with the URL `ax up` records, as a user next to `scripts/up` would.
    (tmp_path / ".ax").mkdir()
    (tmp_path / ".ax" / "nats.url").write_text(demo.url + "\n")
    env = {k: v for k, v in os.environ.items() if k != "AX_NATS_URL"}
    ran = subprocess.run(
        [sys.executable, "-c", found[0]], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip().endswith(" success"), ran.stdout
