"""The systemd unit in deploy/ is valid as systemd itself reads it."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from nanobot.config import Config

UNIT = Path(__file__).resolve().parent.parent / "deploy" / "nanobot.service"
WORKERS_UNIT = UNIT.with_name("nanobot@.service")


def test_unit_is_a_notify_service_with_a_watchdog() -> None:
    text = UNIT.read_text()
    for line in ("Type=notify", "NotifyAccess=main", "Restart=on-failure", "ExecStart=/opt/nanobot/venv/bin/nanobot gateway",
                 "ProtectSystem=strict", "NoNewPrivileges=yes"):
        assert line in text.splitlines(), line
    assert any(line.startswith("WatchdogSec=") for line in text.splitlines())


def test_unit_sets_only_the_home_so_config_json_is_obeyed() -> None:
    """Environment variables beat config.json: the unit must not set anything the user configures."""
    settings = [line.split("=", 1)[1].split("=")[0] for line in UNIT.read_text().splitlines()
                if line.startswith("Environment=NANOBOT_")]
    assert settings == ["NANOBOT_HOME"]


def test_the_workers_template_gives_each_instance_its_home_and_shares_config_and_workspace() -> None:
    lines = WORKERS_UNIT.read_text().splitlines()
    assert "Environment=NANOBOT_HOME=/var/lib/nanobot/%i" in lines
    assert "Environment=NANOBOT_CONFIG=/etc/nanobot/config.json" in lines
    assert "Environment=NANOBOT_GATEWAY__WORKER_ID=%H:%i" in lines  # who it is, not how it behaves
    assert "StateDirectory=nanobot/%i nanobot/workspace" in lines
    settings = [line.split("=", 1)[1].split("=")[0] for line in lines if line.startswith("Environment=NANOBOT_")]
    assert settings == ["NANOBOT_HOME", "NANOBOT_CONFIG", "NANOBOT_GATEWAY__WORKER_ID"]
    # the same service and sandbox as the single unit, line for line, below [Service]'s paths
    single = {line for line in UNIT.read_text().splitlines() if "=" in line and not line.startswith("#")}
    shared = {line for line in lines if "=" in line and not line.startswith("#")}
    assert {line for line in single - shared if not line.startswith(("StateDirectory=", "WorkingDirectory=",
                                                                      "Environment=NANOBOT_HOME", "Description="))} \
        == set()


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
@pytest.mark.parametrize("source, name", [(UNIT, "nanobot.service"), (WORKERS_UNIT, "nanobot@2.service")])
def test_systemd_analyze_verify_accepts_the_unit(tmp_path: Path, source: Path, name: str) -> None:
    # The venv path does not exist on a test machine; everything else is checked as is.
    unit = tmp_path / name
    unit.write_text(source.read_text().replace("ExecStart=/opt/nanobot/venv/bin/nanobot", "ExecStart=/bin/true"))
    result = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and not result.stderr.strip(), result.stderr


def test_the_container_runs_the_wheel_as_a_user_and_compose_adds_postgresql() -> None:
    """No Docker engine runs where the tests run, so the files are checked for what matters:
    the wheel installed, a non-root user, the home on a volume; compose wires PostgreSQL in
    through database.url with the password from the environment, never in the file."""
    import yaml

    root = Path(__file__).resolve().parent.parent
    docker = (root / "Dockerfile").read_text()
    assert "pip wheel" in docker and "pip install --no-cache-dir /wheels/*.whl" in docker
    assert re.search(r"^USER nanobot$", docker, re.M) and "ENV NANOBOT_HOME=/var/lib/nanobot" in docker
    assert 'ENTRYPOINT ["nanobot"]' in docker and 'CMD ["gateway"]' in docker
    compose = yaml.safe_load((root / "compose.yaml").read_text())
    gateway, postgres = compose["services"]["gateway"], compose["services"]["postgres"]
    url = gateway["environment"]["NANOBOT_DATABASE__URL"]
    assert url.startswith("postgresql://nanobot:${NANOBOT_DB_PASSWORD}@postgres:5432/")
    assert gateway["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert "nanobot-home:/var/lib/nanobot" in " ".join(gateway["volumes"])
    # two workers: one database, config and workspace; a home and a worker id each
    second = compose["services"]["gateway-2"]
    assert second["environment"]["NANOBOT_DATABASE__URL"] == url and second["build"] == gateway["build"]
    assert {gateway["environment"]["NANOBOT_GATEWAY__WORKER_ID"], second["environment"]["NANOBOT_GATEWAY__WORKER_ID"]} \
        == {"gateway-1", "gateway-2"}
    shared = {"nanobot-config:/etc/nanobot", "nanobot-workspace:/srv/nanobot/workspace"}
    assert shared <= set(gateway["volumes"]) and shared <= set(second["volumes"])
    assert "nanobot-home-2:/var/lib/nanobot" in second["volumes"]
    # the page and the API: on the container's interface, published on the host's loopback only
    assert gateway["environment"]["NANOBOT_GATEWAY__API__LISTEN"] == "0.0.0.0:8765"
    assert gateway["ports"] == ["127.0.0.1:8765:8765"] and second["ports"] == ["127.0.0.1:8766:8765"]
    assert "/etc/nanobot /srv/nanobot/workspace" in docker  # the volumes start owned by the user
    assert postgres["environment"]["POSTGRES_PASSWORD"].startswith("${NANOBOT_DB_PASSWORD:?")
    assert Config(database={"url": url.replace("${NANOBOT_DB_PASSWORD}", "x")}).database.engine == "postgresql"


def test_compose_probes_readyz_and_the_dashboard_names_real_metrics() -> None:
    import json as json_module
    import re as re_module

    import yaml

    from nanobot.metrics import PrometheusMetrics

    root = Path(__file__).resolve().parent.parent
    compose = yaml.safe_load((root / "compose.yaml").read_text())
    for name in ("gateway", "gateway-2"):
        assert "/readyz" in " ".join(compose["services"][name]["healthcheck"]["test"])
    dashboard = json_module.loads((root / "deploy" / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    named = {m for e in exprs for m in re_module.findall(r"nanobot_[a-z_]+", e)}
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}
    exposed = {family.name + suffix for family in PrometheusMetrics("w").registry.collect()
               for suffix in suffixes[family.type]}
    assert named <= exposed, named - exposed
