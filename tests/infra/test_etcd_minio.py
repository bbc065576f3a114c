"""The real etcd and MinIO servers start, serve, and stop by PID."""

from __future__ import annotations

import asyncio
import io
import os

import aetcd

from e2e import servers


def test_etcd_put_get_with_a_lease(etcd_server):
    async def scenario():
        host, port = etcd_server.endpoint
        async with aetcd.Client(host=host, port=port) as client:
            lease = await client.lease(ttl=5)
            await client.put(b"/infra/leased", b"hello", lease=lease)
            got = await client.get(b"/infra/leased")
            assert got is not None and got.value == b"hello"
            assert got.lease == lease.id
            await lease.revoke()
            assert await client.get(b"/infra/leased") is None

    asyncio.run(scenario())


def test_minio_put_get(minio_client, bucket):
    data = b"exactly once\n" * 100
    minio_client.put_object(bucket, "dir/object.txt", io.BytesIO(data), len(data))
    response = minio_client.get_object(bucket, "dir/object.txt")
    try:
        assert response.read() == data
    finally:
        response.close()
        response.release_conn()
    assert [o.object_name for o in minio_client.list_objects(bucket, prefix="dir/")] == ["dir/object.txt"]


def test_servers_stop_by_pid(tmp_path):
    etcd = servers.start_etcd(tmp_path)
    minio = servers.start_minio(tmp_path)
    pids = [etcd.process.pid, minio.process.pid]
    etcd.stop()
    minio.stop()
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        raise AssertionError(f"process {pid} is still there")
