"""S3 objects through the `minio` client (the only module that imports it).

Checkpoint storage, and the object access the s3 source and sink build on.

An S3 PUT is atomic for readers, so segments and the manifest are single objects;
writers put the manifest key last, as the commit point.

Credentials (`credentials`): the files `accessKey` and `secretKey` in the directory
NOPSTREAM_S3_CREDENTIALS names (a mounted Secret, on a cluster), else the variables
NOPSTREAM_S3_ACCESS_KEY and NOPSTREAM_S3_SECRET_KEY (a machine of your own).
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass
from pathlib import Path

from minio import Minio
from minio.commonconfig import CopySource
from minio.error import S3Error

from nopstream.errors import StorageError

CREDENTIALS_ENV = "NOPSTREAM_S3_CREDENTIALS"


def credentials() -> tuple[str, str]:
    """(access key, secret key): from the mounted files when NOPSTREAM_S3_CREDENTIALS names them."""
    mounted = os.environ.get(CREDENTIALS_ENV, "").strip()
    if not mounted:
        return os.environ.get("NOPSTREAM_S3_ACCESS_KEY", ""), os.environ.get("NOPSTREAM_S3_SECRET_KEY", "")
    keys = []
    for name in ("accessKey", "secretKey"):
        try:
            keys.append((Path(mounted) / name).read_text().strip())
        except OSError as err:
            raise StorageError(
                f"{CREDENTIALS_ENV}={mounted}: cannot read {name} ({err.strerror or err})"
            ) from None
    return keys[0], keys[1]


@dataclass(frozen=True)
class ObjectStat:
    """What a HEAD tells of an object."""

    size: int
    etag: str


class S3Storage:
    """A bucket and key prefix on an S3 endpoint."""

    def __init__(self, client: Minio, bucket: str, prefix: str = "") -> None:
        """Store under `bucket`/`prefix`."""
        self.client = client
        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""

    @classmethod
    def connect(cls, endpoint: str, bucket: str, *, prefix: str = "") -> S3Storage:
        """A storage on the S3 endpoint `http://host:port` (`https://`: TLS; no scheme: plain HTTP)."""
        access_key, secret_key = credentials()
        secure = endpoint.startswith("https://")
        host = endpoint.removeprefix("http://").removeprefix("https://")
        return cls(Minio(host, access_key=access_key, secret_key=secret_key, secure=secure), bucket, prefix)

    def put(self, path: str, data: bytes) -> None:
        """One PUT: readers see all of it or nothing."""
        try:
            self.client.put_object(self.bucket, self.prefix + path, io.BytesIO(data), len(data))
        except S3Error as exc:
            raise StorageError(f"cannot write {self.describe()}/{path}: {exc.code}") from exc

    def put_many(self, objects: dict[str, bytes]) -> None:
        """One PUT per object."""
        for path, data in objects.items():
            self.put(path, data)

    def get(self, path: str) -> bytes:
        """An object's bytes."""
        return self.get_range(path, 0)

    def get_range(self, path: str, offset: int, length: int = 0, *, etag: str | None = None) -> bytes:
        """`length` bytes of an object from `offset` (0: to its end; empty at or past the end);
        with `etag`, StorageError unless the object still has that ETag."""
        # an entity tag is quoted on the wire (RFC 9110); the client hands ETags out unquoted
        headers: dict[str, str | list[str] | tuple[str]] | None = {"If-Match": f'"{etag}"'} if etag else None
        try:
            response = self.client.get_object(
                self.bucket, self.prefix + path, offset=offset, length=length, request_headers=headers
            )
        except S3Error as exc:
            if exc.code == "NoSuchKey":
                raise StorageError(f"{self.describe()}/{path} is missing") from None
            if exc.code == "InvalidRange":
                return b""
            if exc.code == "PreconditionFailed":
                raise StorageError(
                    f"{self.describe()}/{path} changed under a running job: its ETag is no longer {etag}"
                ) from None
            raise StorageError(f"cannot read {self.describe()}/{path}: {exc.code}") from exc
        try:
            data: bytes = response.read()
            return data
        finally:
            response.close()
            response.release_conn()

    def copy(self, source: str, target: str) -> None:
        """Server-side copy of one object to another key of the same bucket."""
        try:
            self.client.copy_object(
                self.bucket, self.prefix + target, CopySource(self.bucket, self.prefix + source)
            )
        except S3Error as exc:
            raise StorageError(f"cannot copy {self.describe()}/{source}: {exc.code}") from exc

    def exists(self, path: str) -> bool:
        """Whether an object exists."""
        return self.stat(path) is not None

    def etag(self, path: str) -> str | None:
        """An object's ETag (its content's MD5 when written in one PUT or copied), or None when missing."""
        found = self.stat(path)
        return found.etag if found is not None else None

    def stat(self, path: str) -> ObjectStat | None:
        """An object's size and ETag, or None when it is missing."""
        try:
            found = self.client.stat_object(self.bucket, self.prefix + path)
        except S3Error as exc:
            if exc.code in ("NoSuchKey", "NoSuchObject"):
                return None
            raise StorageError(f"cannot stat {self.describe()}/{path}: {exc.code}") from exc
        return ObjectStat(int(found.size or 0), str(found.etag))

    def list(self, prefix: str) -> list[str]:
        """Every object under a prefix."""
        return sorted(self.listing(prefix))

    def listing(self, prefix: str) -> dict[str, ObjectStat]:
        """Every object under a prefix with its size and ETag, as the listing gives them (no HEAD each)."""
        objects = self.client.list_objects(self.bucket, prefix=self.prefix + prefix, recursive=True)
        return {o.object_name[len(self.prefix) :]: ObjectStat(int(o.size or 0), str(o.etag)) for o in objects}

    def delete(self, path: str) -> None:
        """Remove an object."""
        self.client.remove_object(self.bucket, self.prefix + path)

    def describe(self) -> str:
        """The bucket and prefix."""
        return f"s3://{self.bucket}/{self.prefix.rstrip('/')}".rstrip("/")
