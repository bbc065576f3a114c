"""docs/python.md, run as written: its files written, its commands run, their printed lines checked."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

from tests.conftest import ROOT

PAGE = ROOT / "docs" / "python.md"
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def steps(text: str) -> list[tuple[str, str]]:
    """The page's `python` blocks that name a file, and its `console` blocks, in order."""
    found = []
    for lang, body in BLOCK.findall(text):
        if lang == "python" and body.startswith("# file: "):
            found.append(("file", body))
        elif lang == "console":
            found.append(("console", body))
    return found


def test_the_python_tutorial_runs_as_written(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, command in (("python", sys.executable), ("nopstream", f"{sys.executable} -m nopstream")):
        (bin_dir / name).write_text(f'#!/bin/sh\nexec {command} "$@"\n')  # this virtualenv's, on PATH
        (bin_dir / name).chmod(0o755)
    work = tmp_path / "work"
    work.mkdir()
    (temp := tmp_path / "tmp").mkdir()
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(work)]),
        # the page's pytest keeps its temporary directories here: in the shared one it pruned the
        # directories earlier runs left (40 s once) and could meet another session's
        "TMPDIR": str(temp),
    }
    done = steps(PAGE.read_text())
    assert [kind for kind, _ in done] == ["file", "file", "console", "console", "console"]
    for kind, body in done:
        if kind == "file":
            name, _, code = body.partition("\n")
            (work / name.removeprefix("# file: ")).write_text(code)
            continue
        for command, expected in re.findall(r"^\$ (.*)\n((?:(?!\$ ).*\n)*)", body, flags=re.MULTILINE):
            ran = subprocess.run(
                ["bash", "-c", command], cwd=work, env=env, capture_output=True, text=True, timeout=600
            )
            printed = ran.stdout + ran.stderr
            assert ran.returncode == 0, f"$ {command}\n{printed}"
            lines = printed.splitlines()
            for line in expected.splitlines():  # each shown line, in order, among what it printed
                assert any(line in got for got in lines), f"$ {command}: {line!r} not in\n{printed}"
                lines = lines[next(i for i, got in enumerate(lines) if line in got) + 1 :]


def test_the_readmes_python_example_runs_with_its_functions(tmp_path):
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## From Python") :]
    (code,) = [body for lang, body in BLOCK.findall(section)[:1] if lang == "python"]
    shutil.copytree(ROOT / "examples" / "data" / "wordcount", tmp_path / "examples" / "data" / "wordcount")
    (tmp_path / "example.py").write_text(code)
    ran = subprocess.run(
        [sys.executable, "example.py"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ran.returncode == 0, ran.stderr
    words = {
        w for f in (tmp_path / "examples/data/wordcount").iterdir() for w in f.read_text().lower().split()
    }
    epochs, count = ran.stdout.rsplit(" ", 1)
    assert epochs.startswith("(") and int(count) == len(words), ran.stdout
