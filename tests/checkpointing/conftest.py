"""A checkpoint storage per test: a local directory, or a bucket on the real MinIO server."""

from __future__ import annotations

import pytest

from nopstream.checkpoint.storage import LocalStorage
from nopstream.s3 import S3Storage


@pytest.fixture(params=["local", "s3"])
def storage(request, tmp_path):
    """Checkpoint storage of the parametrized kind."""
    if request.param == "local":
        return LocalStorage(tmp_path / "checkpoints")
    client = request.getfixturevalue("minio_client")
    bucket = request.getfixturevalue("bucket")
    return S3Storage(client, bucket, prefix="jobs")
