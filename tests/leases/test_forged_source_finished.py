"""A forged `source-finished` while a source still reads loses nothing.

Found by an adversary who had read the job's secret: one POST of `/source-finished`
per source made the coordinator take the final epoch while the sources were still
reading; the job exited 0 with 3,972 of 20,000 records, and every rerun said "already
finished". A source now injects a final barrier only at the end of its input, so what
it reads meanwhile is in the final epoch. Run for real: `nopstream run`, its control
server, and task processes reading a paced generator.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import aiohttp

from nopstream.node.wire import guard
from tests.leases.test_forged_requests import COUNT, output, start, wait_for


def test_a_forged_source_finished_while_the_sources_read_loses_nothing(tmp_path):
    home = tmp_path / "job"
    proc = start(home)
    try:
        run_dir = home / ".nopstream" / "runs" / "forged" / "run-1"
        wait_for(run_dir / "control-url")
        wait_for(run_dir / "secret")
        url = (run_dir / "control-url").read_text()
        secret = (run_dir / "secret").read_text()

        async def forge() -> list[int]:
            async with aiohttp.ClientSession(headers=guard.headers(secret)) as session:
                answers = []
                for subtask in (0, 1):
                    body = {"taskId": f"forged/main/numbers/{subtask}", "run": 1}
                    for _ in range(100):  # until the coordinator leads (503 before)
                        async with session.post(f"{url}/source-finished", json=body) as resp:
                            if resp.status != 503:
                                answers.append(resp.status)
                                break
                        await asyncio.sleep(0.05)
                return answers

        assert asyncio.run(forge()) == [200, 200]
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert output(home) == Counter(range(COUNT))
    logs = "".join(p.read_text() for p in run_dir.glob("logs/*numbers*.log"))
    assert "before the end of its input: deferred" in logs  # the forgery reached the sources
