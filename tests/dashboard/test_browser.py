"""The dashboard of a running job, in a real browser (Debian's headless Chromium through Selenium).

A real `nopstream run` (control server, task processes over loopback channels) runs
a paced source into a map with parallelism 2, which a file in the job's directory
makes slow; its channels get the smallest credit, so the source feels it at once.
The browser opens the address the command printed and this test reads what the page
shows: the vertex names in the graph and its table, a new epoch row appearing, the
source turning from OK to HIGH backpressure (and its node's colour) once the map is
slowed, and a run 2 with its cause and the killed task's failure after a task
process is SIGKILLed (which `nopstream status` prints too, from the same API). Then
the map is fast again, and the job ends with exactly its input in the sink.
Screenshots go to test-artifacts/dashboard/ (one per step; the README's picture is
one of them).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

from tests.conftest import ROOT, run_nopstream

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
ARTIFACTS = ROOT / "test-artifacts" / "dashboard"
COUNT = 200_000  # 50 s of input at most: a loaded machine opens the browser and sees epochs before it slows
HIGH_COLOUR = "rgb(198,40,40)"  # dashboard.js LEVEL_COLOURS.high
OK_COLOUR = "rgb(46,125,50)"

SLOW = """\
import os, time

def pace(x):
    if os.path.exists("slow"):
        time.sleep(0.004)  # at most 250 records/s per subtask: far below the source's 4,000
    return x
"""


def model() -> dict[str, Any]:
    return {
        "jobId": "watched",
        "checkpoint": {"intervalMs": 500, "storage": {"local": {"path": "cp"}}},
        "model": {
            "sources": [
                {
                    "id": "numbers",
                    "type": "generator",
                    "parallelism": 1,
                    "config": {"kind": "events", "count": COUNT, "ratePerSecond": 4000},
                }
            ],
            "operators": [{"id": "pace", "type": "map", "fn": "slowfns:pace", "parallelism": 2}],
            "sinks": [{"id": "out", "type": "file", "parallelism": 2, "config": {"path": "out"}}],
        },
    }


def until(what: str, check: Callable[[], Any], timeout: float = 30.0) -> Any:
    """`check()`'s first true answer, polled; fails naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        answer = check()
        if answer:
            return answer
        assert time.monotonic() < deadline, f"the dashboard never showed {what}"
        time.sleep(0.2)


def browser(profile: Path) -> webdriver.Chrome:
    """Headless Chromium that asks no network but loopback (the flags keep it from phoning home)."""
    assert CHROMIUM.exists() and CHROMEDRIVER.exists(), "run scripts/install-servers.sh browser"
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1400,1800",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(flag)
    return webdriver.Chrome(options=options, service=Service(str(CHROMEDRIVER)))


def task_children(pid: int) -> list[int]:
    """The runner's task processes (Linux /proc)."""
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except FileNotFoundError:
        return []


def test_the_dashboard_shows_the_graph_backpressure_epochs_and_a_recovery(tmp_path):
    home = tmp_path / "job"
    home.mkdir()
    (home / "slowfns.py").write_text(SLOW)
    (home / "job.yaml").write_text(yaml.safe_dump(model(), sort_keys=False))
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(home)]),
        # the smallest credit (64 KiB per channel): a slowed map blocks its source within a second
        "NOPSTREAM_CREDIT_BUDGET": str(128 << 10),
    }
    job = subprocess.Popen(
        [sys.executable, "-m", "nopstream", "run", "job.yaml"],
        cwd=home,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    driver = None
    try:
        assert job.stderr is not None
        first = job.stderr.readline()
        match = re.fullmatch(r"dashboard: (http://127\.0\.0\.1:\d+/dashboard/#token=[0-9a-f]{64})\n", first)
        assert match, f"the first line of `nopstream run` is not the dashboard's address: {first!r}"
        driver = browser(tmp_path / "chromium")
        driver.get(match.group(1))

        def rows(table: str, attribute: str) -> dict[str, str]:
            """The rows of a table as the page shows them now: their text by an attribute's value."""
            found: dict[str, str] = driver.execute_script(
                "return Object.fromEntries([...document.querySelectorAll(`#${arguments[0]} tbody tr`)]"
                ".map(r => [r.getAttribute(arguments[1]), r.innerText]));",
                table,
                attribute,
            )
            return found

        vertices = until("the vertices", lambda: rows("vertices", "data-vertex"))
        assert sorted(vertices) == ["numbers", "pace"]
        graph = driver.execute_script(
            "const cy = window.nopstream.cy;"
            "return {nodes: cy.nodes().map(n => n.id()).sort(),"
            " edges: cy.edges().map(e => [e.source().id(), e.target().id(), e.data('label')])};"
        )
        assert graph == {"nodes": ["numbers", "pace"], "edges": [["numbers", "pace", "REBALANCE"]]}
        assert driver.find_element(By.ID, "semantic-mode").text == "STRICT_EXACTLY_ONCE"
        until("the source at OK", lambda: level(driver) == ("ok", OK_COLOUR))
        shown = max(map(int, until("an epoch", lambda: rows("checkpoints", "data-epoch"))))
        until(f"an epoch after {shown}", lambda: max(map(int, rows("checkpoints", "data-epoch"))) > shown)
        driver.save_screenshot(str(ARTIFACTS / "1-running.png"))

        (home / "slow").touch()
        until("the source backpressured HIGH", lambda: level(driver) == ("high", HIGH_COLOUR), 30)
        driver.save_screenshot(str(ARTIFACTS / "2-backpressured.png"))

        victim = task_children(job.pid)[-1]
        os.kill(victim, signal.SIGKILL)
        run2 = until("run 2", lambda: rows("runs", "data-run").get("2"), 60)
        assert "exited with -9" in run2, run2
        failures = driver.find_element(By.ID, "failures").text
        assert "exited with -9" in failures, failures
        until("run 2 leading", lambda: driver.find_element(By.ID, "leader").text.startswith("run 2,"))
        driver.save_screenshot(str(ARTIFACTS / "3-recovered.png"))
        status = run_nopstream("status", "job.yaml", cwd=home)  # the same view, on a terminal
        assert status.code == 0, status.err
        lines = status.out.splitlines()
        assert lines[0].startswith("job 'watched' running (STRICT_EXACTLY_ONCE), run 2 led with token "), (
            lines
        )
        assert [
            line.split(":")[0] for line in lines if line.startswith("  numbers") or line.startswith("  pace")
        ] == [
            "  numbers x1",
            "  pace x2",
        ]
        assert any(line.startswith("  run 2 from epoch ") and "exited with -9" in line for line in lines), (
            lines
        )

        (home / "slow").unlink()
        assert job.wait(120) == 0, job.stderr.read()
    finally:
        if driver is not None:
            driver.quit()
        if job.poll() is None:
            job.kill()
            job.wait()
    out = Counter(
        json.loads(line)["value"]
        for f in (home / "out").glob("*.jsonl")
        for line in f.read_text().splitlines()
    )
    assert out == Counter(range(COUNT))


def level(driver: webdriver.Chrome) -> tuple[str, str]:
    """The source vertex's level in the table and its node's colour in the graph."""
    shown: list[str] = driver.execute_script(
        "const row = document.querySelector('#vertices tr[data-vertex=\"numbers\"]');"
        "return [row ? row.dataset.level : '',"
        " window.nopstream.cy.getElementById('numbers').style('background-color')];"
    )
    return shown[0], shown[1].replace(" ", "")
