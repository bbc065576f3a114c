"""A throwaway PKI for a test cluster: a CA, serving and client certificates, SA keys, kubeconfigs."""

from __future__ import annotations

import base64
import datetime
import ipaddress
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALID = datetime.timedelta(days=2)


@dataclass(frozen=True)
class KeyPair:
    """Paths of a PEM certificate and its PEM private key."""

    cert: Path
    key: Path


def _key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _write_key(key: rsa.RSAPrivateKey, path: Path) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    path.chmod(0o600)


def _name(cn: str, orgs: tuple[str, ...] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    attrs += [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs]
    return x509.Name(attrs)


class Pki:
    """Issues certificates signed by one fresh CA, written under a directory."""

    def __init__(self, directory: Path) -> None:
        """Create the CA in `directory`."""
        self.dir = directory
        directory.mkdir(parents=True, exist_ok=True)
        self._ca_key = _key()
        now = datetime.datetime.now(datetime.UTC)
        self._ca_cert = (
            x509.CertificateBuilder()
            .subject_name(_name("nopstream-test-ca"))
            .issuer_name(_name("nopstream-test-ca"))
            .public_key(self._ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + _VALID)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self._ca_key, hashes.SHA256())
        )
        self.ca = KeyPair(directory / "ca.crt", directory / "ca.key")
        self.ca.cert.write_bytes(self._ca_cert.public_bytes(serialization.Encoding.PEM))
        _write_key(self._ca_key, self.ca.key)

    def issue(
        self,
        name: str,
        cn: str,
        *,
        orgs: tuple[str, ...] = (),
        server_names: tuple[str, ...] = (),
        server_ips: tuple[str, ...] = (),
        client: bool = True,
        expired: bool = False,
    ) -> KeyPair:
        """A certificate for `cn` (client, and serving when names or IPs are given); an `expired` one
        ended a day ago."""
        key = _key()
        now = datetime.datetime.now(datetime.UTC)
        starts, ends = now - datetime.timedelta(minutes=5), now + _VALID
        if expired:
            starts, ends = now - _VALID, now - datetime.timedelta(days=1)
        usages = [ExtendedKeyUsageOID.CLIENT_AUTH] if client else []
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(cn, orgs))
            .issuer_name(self._ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(starts)
            .not_valid_after(ends)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        )
        if server_names or server_ips:
            usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
            sans: list[x509.GeneralName] = [x509.DNSName(n) for n in server_names]
            sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in server_ips]
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        cert = builder.sign(self._ca_key, hashes.SHA256())
        pair = KeyPair(self.dir / f"{name}.crt", self.dir / f"{name}.key")
        pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(key, pair.key)
        return pair

    def etcd_access(self, directory: Path, name: str) -> Path:
        """An etcd access directory (`NOPSTREAM_ETCD_ACCESS`): this CA, and a client certificate whose
        common name, the etcd user, is `name`."""
        directory.mkdir()
        pair = self.issue(f"client-{name}", name)
        shutil.copy(self.ca.cert, directory / "ca.crt")
        shutil.copy(pair.cert, directory / "tls.crt")
        shutil.copy(pair.key, directory / "tls.key")
        return directory

    def service_account_keys(self) -> KeyPair:
        """An RSA key pair for signing service-account tokens (`cert` holds the public key)."""
        key = _key()
        pair = KeyPair(self.dir / "sa.pub", self.dir / "sa.key")
        pair.cert.write_bytes(
            key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
        _write_key(key, pair.key)
        return pair


def write_kubeconfig(
    path: Path,
    *,
    server: str,
    ca: Path,
    user: str,
    client: KeyPair | None = None,
    token: str | None = None,
    namespace: str = "default",
) -> Path:
    """A kubeconfig for one user, by client certificate or bearer token."""
    creds: dict[str, str] = {}
    if client is not None:
        creds = {"client-certificate": str(client.cert), "client-key": str(client.key)}
    if token is not None:
        creds = {"token": token}
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "test", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": user, "user": creds}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": user, "namespace": namespace}}],
        "current-context": "test",
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


def _b64(number: int) -> str:
    raw = number.to_bytes((number.bit_length() + 7) // 8, "big")
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


@dataclass(frozen=True)
class SigningKey:
    """An RSA key as JWKs: `private` for Hydra, `jwks` (the public half in a set) for the broker."""

    kid: str
    private: Path
    jwks: Path

    @classmethod
    def make(cls, directory: Path, kid: str = "nopstream-test") -> SigningKey:
        """A new 2048-bit key written into `directory`."""
        directory.mkdir(parents=True, exist_ok=True)
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        numbers = key.private_numbers()
        public = {"kty": "RSA", "kid": kid, "use": "sig", "alg": "RS256"} | {
            "n": _b64(numbers.public_numbers.n),
            "e": _b64(numbers.public_numbers.e),
        }
        private = public | {
            "d": _b64(numbers.d),
            "p": _b64(numbers.p),
            "q": _b64(numbers.q),
            "dp": _b64(numbers.dmp1),
            "dq": _b64(numbers.dmq1),
            "qi": _b64(numbers.iqmp),
        }
        keys = cls(kid, directory / "signing.jwk.json", directory / "jwks.json")
        keys.private.write_text(json.dumps(private))
        keys.private.chmod(0o600)
        keys.jwks.write_text(json.dumps({"keys": [public]}))
        return keys
