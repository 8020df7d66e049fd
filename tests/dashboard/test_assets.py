"""What the dashboard is built from: vendored libraries exactly as the manifest records
them, templates and scripts that the Content-Security-Policy allows, static files served by
the service itself, and the number formats the pages use."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import sys
import tarfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from api.dashboard import vendor as dashboard_vendor
from api.dashboard.format import fmt_ago, fmt_bytes, fmt_percent, fmt_rate, fmt_seconds
from api.dashboard.web import CONTENT_SECURITY_POLICY, STATIC, TEMPLATES, safe_next, stack
from tests.services import ServerThread

VENDOR = STATIC / "vendor"


def test_every_vendored_file_matches_its_manifest_sha256() -> None:
    manifest = json.loads((VENDOR / "manifest.json").read_text())
    checked = 0
    for package in manifest["packages"]:
        assert re.fullmatch(r"\d+\.\d+\.\d+", package["version"])
        assert package["integrity"].startswith("sha512-")
        assert package["tarball"].startswith("https://registry.npmjs.org/")
        for entry in package["files"]:
            data = (VENDOR / entry["path"]).read_bytes()
            assert hashlib.sha256(data).hexdigest() == entry["sha256"], entry["path"]
            checked += 1
    assert checked >= 3
    assert dashboard_vendor.verify() == []


def test_verify_names_a_changed_file_and_an_unlisted_one(tmp_path: Path) -> None:
    copy = tmp_path / "vendor"
    shutil.copytree(VENDOR, copy)
    (copy / "htmx" / "htmx.min.js").write_text("/* tampered */")
    (copy / "extra.js").write_text("")
    problems = dashboard_vendor.verify(copy)
    assert any(p.startswith("htmx/htmx.min.js: sha256") for p in problems)
    assert "extra.js: not in the manifest" in problems


def test_the_libraries_stay_small() -> None:
    # uPlot and htmx are tens of kilobytes; a bundle that grew tenfold is a mistake.
    total = sum(path.stat().st_size for path in VENDOR.rglob("*.js"))
    assert total < 200_000


def test_templates_carry_no_inline_script_or_style() -> None:
    for template in TEMPLATES.glob("*.html"):
        text = re.sub(r"{#.*?#}", "", template.read_text(), flags=re.S)  # Jinja comments
        assert not re.search(r"<script(?![^>]*\bsrc=)", text), template.name
        assert "<style" not in text, template.name
        assert not re.search(r"\sstyle=", text), template.name
        assert not re.search(r"\son[a-z]+=", text), template.name  # no onclick= handlers
        assert "hx-on" not in text, template.name


def test_the_csp_allows_only_this_origin_for_scripts_and_styles() -> None:
    policy = dict(part.split(" ", 1) for part in CONTENT_SECURITY_POLICY.split("; "))
    assert policy["script-src"] == "'self'"
    assert policy["style-src"] == "'self'"
    assert policy["default-src"] == "'none'"
    assert "unsafe" not in CONTENT_SECURITY_POLICY


def test_static_files_are_served_by_the_service(service: ServerThread) -> None:
    with httpx.Client(base_url=service.url, timeout=10) as client:
        for path, kind in (
            ("/static/vendor/uplot/uPlot.iife.min.js", "javascript"),
            ("/static/vendor/htmx/htmx.min.js", "javascript"),
            ("/static/vendor/uplot/uPlot.min.css", "text/css"),
            ("/static/dashboard.js", "javascript"),
            ("/static/dashboard.css", "text/css"),
        ):
            response = client.get(path)
            assert response.status_code == 200, path
            assert kind in response.headers["content-type"]
            assert response.content == (STATIC / path.removeprefix("/static/")).read_bytes()
        login = client.get("/login")
        assert login.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
        assert login.headers["cache-control"] == "no-store"
        # Every script and stylesheet a page names is one of ours, on this origin.
        for url in re.findall(r'(?:src|href)="([^"]+\.(?:js|css)[^"]*)"', login.text):
            assert url.startswith("/static/"), url
            assert client.get(url).status_code == 200


def test_dashboard_routes_stay_out_of_the_api_schema(service: ServerThread) -> None:
    paths = httpx.get(service.url + "/openapi.json", timeout=10).json()["paths"]
    assert all(path.startswith(("/api/", "/healthz")) for path in paths)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (None, "—"),
        (0, "0 B"),
        (512, "512 B"),
        (1536, "1.50 KiB"),
        (200 * 2**20, "200 MiB"),
        (int(1.5 * 2**30), "1.50 GiB"),
        (80 * 2**30, "80.0 GiB"),
        (-3 * 2**20, "−3.00 MiB"),
    ],
)
def test_memory_reads_in_binary_units(value: int | None, text: str) -> None:
    assert fmt_bytes(value) == text


def test_rates_times_and_fractions_read_naturally() -> None:
    assert fmt_rate(1234.4) == "1,234/s"
    assert fmt_rate(12.34) == "12.3/s"
    assert fmt_rate(1.234) == "1.23/s"
    assert fmt_seconds(0.25) == "250 ms"
    assert fmt_seconds(120) == "2 min"
    assert fmt_seconds(3725) == "1 h 2 min"
    assert fmt_percent(0.05) == "5%"
    assert fmt_percent(0.125) == "12.5%"
    now = datetime(2026, 11, 21, tzinfo=UTC)
    assert fmt_ago(now - timedelta(seconds=5), now) == "5 s ago"
    assert fmt_ago(now - timedelta(hours=3), now) == "3 h ago"
    assert fmt_ago(now - timedelta(days=60), now) == "2026-09-22 00:00 UTC"


def test_login_only_returns_to_pages_of_this_site() -> None:
    assert safe_next("/profiles/3?x=1") == "/profiles/3?x=1"
    for hostile in ("//evil.example", "https://evil.example", "/\\evil.example", "", None):
        assert safe_next(hostile) == "/"


def test_a_stacked_bar_never_overflows_and_skips_negative_parts() -> None:
    parts = stack([("a", 60, "x"), ("noise", -5, "y"), ("b", 70, "z")], whole=100)
    assert [(s.x, s.width) for s in parts] == [(0, 600), (600, 0), (600, 400)]


def _fake_npm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, corrupt: bool = False) -> None:
    """An `npm` on PATH whose `pack` writes tarballs made from the vendored files, and
    reports their integrity as the registry would (or a wrong one)."""
    manifest = json.loads((VENDOR / "manifest.json").read_text())
    tarballs = tmp_path / "registry"
    tarballs.mkdir()
    answers = {}
    for package in manifest["packages"]:
        name = f"{package['package']}-{package['version']}.tgz"
        with tarfile.open(tarballs / name, "w:gz") as archive:
            for entry in package["files"]:
                archive.add(VENDOR / entry["path"], arcname=entry["source"])
        digest = hashlib.sha512((tarballs / name).read_bytes()).digest()
        integrity = "sha512-" + base64.b64encode(digest).decode()
        answers[f"{package['package']}@{package['version']}"] = {
            "filename": name,
            "version": package["version"],
            "integrity": "sha512-wrong" if corrupt else integrity,
        }
    script = tmp_path / "bin" / "npm"
    script.parent.mkdir()
    script.write_text(
        f"#!{sys.executable}\n"
        "import json, shutil, sys\n"
        f"answers = {answers!r}\n"
        "spec, destination = sys.argv[2], sys.argv[sys.argv.index('--pack-destination') + 1]\n"
        f"shutil.copy({str(tarballs)!r} + '/' + answers[spec]['filename'], destination)\n"
        "print(json.dumps([answers[spec]]))\n"
    )
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{script.parent}:{os.environ['PATH']}")


def test_refresh_unpacks_checked_tarballs_into_the_manifest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    copy = tmp_path / "vendor"
    shutil.copytree(VENDOR, copy)
    (copy / "uplot" / "uPlot.min.css").write_text("/* stale */")
    _fake_npm(tmp_path, monkeypatch)
    manifest = dashboard_vendor.refresh([], copy)
    assert dashboard_vendor.verify(copy) == []
    assert (copy / "uplot" / "uPlot.min.css").read_bytes() == (
        VENDOR / "uplot" / "uPlot.min.css"
    ).read_bytes()
    files = {e["path"]: e["sha256"] for p in manifest["packages"] for e in p["files"]}
    original = json.loads((VENDOR / "manifest.json").read_text())
    assert files == {e["path"]: e["sha256"] for p in original["packages"] for e in p["files"]}


def test_refresh_refuses_a_tarball_that_fails_its_integrity(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    copy = tmp_path / "vendor"
    shutil.copytree(VENDOR, copy)
    _fake_npm(tmp_path, monkeypatch, corrupt=True)
    with pytest.raises(dashboard_vendor.VendorError, match="does not match npm's integrity"):
        dashboard_vendor.refresh([], copy)
    with pytest.raises(dashboard_vendor.VendorError, match="not in the manifest: left-pad"):
        dashboard_vendor.refresh(["left-pad@1.3.0"], copy)


def test_the_verify_command_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    assert dashboard_vendor.main(["verify"]) == 0
    assert capsys.readouterr().err == ""
