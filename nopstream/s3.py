"""S3 objects through the `minio` client (the only module that imports it).

Checkpoint storage, and the object access the s3 source and sink build on.

An S3 PUT is atomic for readers, so segments and the manifest are single objects;
writers put the manifest key last, as the commit point.

Credentials (`credentials`): the files `accessKey` and `secretKey` in the directory
NOPSTREAM_S3_CREDENTIALS names (a mounted Secret, on a cluster), else the variables
NOPSTREAM_S3_ACCESS_KEY and NOPSTREAM_S3_SECRET_KEY (a machine of your own). An `https://`
endpoint is verified against `ca.crt` in that directory, else the file
NOPSTREAM_S3_CA_FILE names, else the system's CAs (`ca_file`).
An endpoint that cannot be reached (after the client's retries) is a StorageError naming
what was asked, as is any S3 error a method does not handle itself.
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import urllib3
from minio import Minio
from minio.commonconfig import CopySource
from minio.error import MinioException, S3Error

from nopstream.errors import StorageError

CREDENTIALS_ENV = "NOPSTREAM_S3_CREDENTIALS"
CA_ENV = "NOPSTREAM_S3_CA_FILE"
CA_FILE = "ca.crt"


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


def ca_file() -> str | None:
    """The CA file an `https://` endpoint is verified against (None: the system's); StorageError when
    the file named is missing."""
    mounted = os.environ.get(CREDENTIALS_ENV, "").strip()
    if mounted and (Path(mounted) / CA_FILE).is_file():
        return str(Path(mounted) / CA_FILE)
    named = os.environ.get(CA_ENV, "").strip()
    if named and not Path(named).is_file():
        raise StorageError(f"{CA_ENV}={named}: no such file")
    return named or None


def _http(ca: str) -> urllib3.PoolManager:
    """minio's own HTTP client (its timeouts and retries, as `Minio` makes it), trusting only `ca`."""
    timeout = timedelta(minutes=5).seconds
    return urllib3.PoolManager(
        timeout=urllib3.Timeout(connect=timeout, read=timeout),
        maxsize=10,
        cert_reqs="CERT_REQUIRED",
        ca_certs=ca,
        retries=urllib3.Retry(total=5, backoff_factor=0.2, status_forcelist=[500, 502, 503, 504]),
    )


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
        ca = ca_file() if secure else None
        http = None if ca is None else _http(ca)
        client = Minio(host, access_key=access_key, secret_key=secret_key, secure=secure, http_client=http)
        return cls(client, bucket, prefix)

    @contextlib.contextmanager
    def _asking(self, what: str) -> Iterator[None]:
        """StorageError saying `what` could not be done when the endpoint does not answer or refuses
        with an S3 error the caller left through, or answers something that is not S3."""
        try:
            yield
        except urllib3.exceptions.HTTPError as exc:
            cause = exc.reason if isinstance(exc, urllib3.exceptions.MaxRetryError) else exc
            raise StorageError(f"cannot {what}: the S3 endpoint could not be reached ({cause})") from None
        except S3Error as exc:
            raise StorageError(f"cannot {what}: {exc.code} ({exc.message})") from None
        except MinioException as exc:  # not S3 at all: plain HTTP to a TLS port, a proxy's page
            raise StorageError(
                f"cannot {what}: the S3 endpoint answered {str(exc).splitlines()[0]}"
            ) from None

    def put(self, path: str, data: bytes) -> None:
        """One PUT: readers see all of it or nothing."""
        with self._asking(f"write {self.describe()}/{path}"):
            self.client.put_object(self.bucket, self.prefix + path, io.BytesIO(data), len(data))

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
        with self._asking(f"read {self.describe()}/{path}"):
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
                raise
            try:
                data: bytes = response.read()
                return data
            finally:
                response.close()
                response.release_conn()

    def copy(self, source: str, target: str) -> None:
        """Server-side copy of one object to another key of the same bucket."""
        with self._asking(f"copy {self.describe()}/{source}"):
            self.client.copy_object(
                self.bucket, self.prefix + target, CopySource(self.bucket, self.prefix + source)
            )

    def exists(self, path: str) -> bool:
        """Whether an object exists."""
        return self.stat(path) is not None

    def etag(self, path: str) -> str | None:
        """An object's ETag (its content's MD5 when written in one PUT or copied), or None when missing."""
        found = self.stat(path)
        return found.etag if found is not None else None

    def stat(self, path: str) -> ObjectStat | None:
        """An object's size and ETag, or None when it is missing."""
        with self._asking(f"stat {self.describe()}/{path}"):
            try:
                found = self.client.stat_object(self.bucket, self.prefix + path)
            except S3Error as exc:
                if exc.code in ("NoSuchKey", "NoSuchObject"):
                    return None
                raise
        return ObjectStat(int(found.size or 0), str(found.etag))

    def list(self, prefix: str) -> list[str]:
        """Every object under a prefix."""
        return sorted(self.listing(prefix))

    def listing(self, prefix: str) -> dict[str, ObjectStat]:
        """Every object under a prefix with its size and ETag, as the listing gives them (no HEAD each)."""
        with self._asking(f"list {self.describe()}/{prefix}"):
            objects = self.client.list_objects(self.bucket, prefix=self.prefix + prefix, recursive=True)
            return {
                o.object_name[len(self.prefix) :]: ObjectStat(int(o.size or 0), str(o.etag)) for o in objects
            }

    def delete(self, path: str) -> None:
        """Remove an object."""
        with self._asking(f"delete {self.describe()}/{path}"):
            self.client.remove_object(self.bucket, self.prefix + path)

    def describe(self) -> str:
        """The bucket and prefix."""
        return f"s3://{self.bucket}/{self.prefix.rstrip('/')}".rstrip("/")
