"""TLS between a job's processes: one certificate per job, from a certificate authority made for it alone.

`authority.issue` makes a CA, signs one certificate with it (serving and client use both) and
forgets the CA's key: nothing else can ever be signed by it, so a peer whose certificate
chains to the job's CA *is* one of the job's processes. That is why clients check the
chain and not the host name (pods are reached by addresses known only once they run).
The files sit beside the job's secret (`guard`), in the same directory, as the operator's
Secret mounts them: `ca.crt`, `tls.crt`, `tls.key`. Servers ask for the client certificate
and refuse a handshake with one of another CA (`server_context`); `guard.Guard` refuses a
request without one unless a person's tool may send it (the dashboard, its API, a
savepoint), which the job's secret admits.
"""

from __future__ import annotations

import ssl
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from nopstream import safefiles
from nopstream.node.wire import guard

CA_FILE = "ca.crt"
CERT_FILE = "tls.crt"
KEY_FILE = "tls.key"
FILES = (CA_FILE, CERT_FILE, KEY_FILE)
"""A job's TLS files, as they are written and mounted."""


class TlsError(ValueError):
    """A job's TLS files are missing or unusable; the message names the file."""


@dataclass(frozen=True)
class JobCertificate:
    """The PEM files of a job's TLS: its CA's certificate, its certificate and that certificate's key."""

    ca: bytes
    cert: bytes
    key: bytes = field(repr=False)

    def files(self) -> dict[str, bytes]:
        """The files by name, as they are written and mounted."""
        return dict(zip(FILES, (self.ca, self.cert, self.key), strict=True))

    @classmethod
    def from_files(cls, files: Mapping[str, bytes]) -> JobCertificate:
        """The certificate of `files` (as `files` gives them, e.g. a Secret's data); KeyError naming a
        missing one."""
        ca, cert, key = (files[name] for name in FILES)
        return cls(ca=ca, cert=cert, key=key)

    def write(self, directory: Path) -> JobTls:
        """Write the files as new files readable by their owner only into the private `directory`."""
        for name, data in self.files().items():
            safefiles.replace_file(directory / name, data)
        return JobTls(directory)

    def client_context(self) -> ssl.SSLContext:
        """A client's context (`JobTls.client_context`) from these PEMs (loaded from a private temporary
        directory: OpenSSL loads a key from a file)."""
        with tempfile.TemporaryDirectory(prefix="nopstream-tls-") as directory:
            return self.write(Path(directory)).client_context()


@dataclass(frozen=True)
class JobTls:
    """A job's TLS files in `directory` (see the module)."""

    directory: Path

    @classmethod
    def read(cls, directory: Path) -> JobTls:
        """The files in `directory`, checked to load; TlsError naming the file otherwise."""
        tls = cls(directory)
        tls.server_context()
        tls.client_context()
        return tls

    def server_context(self) -> ssl.SSLContext:
        """A server's: it presents the job's certificate and verifies a client's against the job's CA."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._load(context)
        context.verify_mode = ssl.CERT_OPTIONAL  # the guard says which routes need one
        return context

    def client_context(self) -> ssl.SSLContext:
        """A client's: it trusts the job's CA only and presents the job's certificate."""
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
        context.check_hostname = False  # the CA signs one certificate: its chain names the job
        self._load(context)
        return context

    def _load(self, context: ssl.SSLContext) -> None:
        ca, cert, key = (self.directory / name for name in FILES)
        for path in (ca, cert, key):
            if not path.is_file():
                raise TlsError(f"{path}: the job's TLS file is missing")
        try:
            context.load_verify_locations(cafile=str(ca))
        except (OSError, ssl.SSLError) as err:
            raise TlsError(f"{ca}: not a PEM certificate ({err})") from None
        try:
            context.load_cert_chain(str(cert), str(key))
        except (OSError, ssl.SSLError) as err:
            raise TlsError(f"{cert}, {key}: not a certificate and its key ({err})") from None


def scheme(tls: JobTls | None) -> str:
    """The URL scheme of a job's servers."""
    return "http" if tls is None else "https"


def client_session(secret: str, tls: JobTls | None) -> aiohttp.ClientSession:
    """A session of a job's client: it sends the job's secret, and speaks TLS with the job's
    certificate when the job has it."""
    connector = None if tls is None else aiohttp.TCPConnector(ssl=tls.client_context())
    return aiohttp.ClientSession(headers=guard.headers(secret), connector=connector)


def server_context(tls: JobTls | None) -> ssl.SSLContext | None:
    """What a job's server listens with: TLS when the job has it."""
    return None if tls is None else tls.server_context()
