"""Fixtures: one coordination backend per test, the local one and one on a real etcd server."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from nopstream.cluster.etcd import EtcdBackend
from nopstream.cluster.layout import Layout
from nopstream.cluster.local import LocalBackend

_jobs = itertools.count()


@pytest.fixture(params=["local", "etcd"])
def backend_factory(request):
    """Makes a backend of the parametrized kind inside a running event loop."""
    if request.param == "local":
        return LocalBackend
    server = request.getfixturevalue("etcd_server")
    host, port = server.endpoint
    return lambda: EtcdBackend(host, port)


@pytest.fixture
def layout():
    """A fresh job's key layout (tests share the session's etcd server)."""
    return Layout("test", f"job-{next(_jobs)}", "main")


@pytest.fixture
def run_async():
    """Run a coroutine function with a fresh backend, closing it afterwards."""

    def runner(factory, scenario, timeout: float = 60.0):
        async def main():
            backend = factory()
            try:
                return await asyncio.wait_for(scenario(backend), timeout)
            finally:
                await backend.close()

        return asyncio.run(main())

    return runner
