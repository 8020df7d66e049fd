"""The deployment the documentation ships (docs/deploy/) is the one it shows and explains."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

REPO_ROOT = Path(__file__).resolve().parent.parent
DEPLOY = REPO_ROOT / "docs" / "deploy"


def test_the_deploy_page_shows_the_nginx_configuration_that_ships() -> None:
    page = (REPO_ROOT / "docs" / "deploy.md").read_text()
    shown = re.findall(r"```nginx\n(.*?)```", page, flags=re.DOTALL)
    assert shown == [(DEPLOY / "nginx.conf").read_text()]


def test_the_compose_file_publishes_only_the_proxy_and_trusts_only_its_address() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    service, proxy = compose["services"]["tuner"], compose["services"]["proxy"]
    assert "ports" not in service  # reachable on the project's network only
    assert service["build"]["target"] == "service"
    proxy_address = proxy["networks"]["tuner"]["ipv4_address"]
    assert service["environment"]["TUNER_FORWARDED_ALLOW_IPS"] == proxy_address
    assert "proxy_pass http://tuner:8000;" in (DEPLOY / "nginx.conf").read_text()
