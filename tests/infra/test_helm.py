"""helm, built from its Go module, renders a chart."""

from __future__ import annotations

import subprocess

from e2e import servers


def test_helm_renders_a_chart(tmp_path):
    helm = servers.binary("helm")
    env = {
        "HELM_CACHE_HOME": str(tmp_path / "cache"),
        "HELM_CONFIG_HOME": str(tmp_path / "config"),
        "HELM_DATA_HOME": str(tmp_path / "data"),
        "PATH": "/usr/bin:/bin",
    }
    version = subprocess.run(
        [helm, "version", "--template", "{{.Version}}"], capture_output=True, text=True, check=True, env=env
    )
    assert version.stdout == "v3.22.0"
    subprocess.run([helm, "create", str(tmp_path / "demo")], check=True, capture_output=True, env=env)
    rendered = subprocess.run(
        [helm, "template", "rel", str(tmp_path / "demo")], capture_output=True, text=True, check=True, env=env
    )
    assert "kind: Deployment" in rendered.stdout
    assert "name: rel-demo" in rendered.stdout
