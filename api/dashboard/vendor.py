"""The dashboard's vendored JavaScript libraries: committed files under
``api/dashboard/static/vendor``, each listed in ``manifest.json`` with its npm package,
version, the tarball's integrity as the registry publishes it, and the file's own SHA-256.

    python -m api.dashboard.vendor verify            # the files are what the manifest says
    python -m api.dashboard.vendor refresh [NAME@VERSION ...]   # fetch with `npm pack`

``refresh`` needs ``npm`` and the registry; nothing at run time does. It checks each tarball
against its ``sha512`` integrity before unpacking only the files the manifest names.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

VENDOR = Path(__file__).resolve().parent / "static" / "vendor"
MANIFEST = VENDOR / "manifest.json"


class VendorError(Exception):
    """A vendored file differs from its manifest entry, or a download from its integrity."""


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def load_manifest(path: Path = MANIFEST) -> dict[str, Any]:
    manifest: dict[str, Any] = json.loads(path.read_text())
    return manifest


def verify(vendor: Path = VENDOR) -> list[str]:
    """Every listed file exists with its recorded SHA-256, and nothing unlisted is served.
    Returns the problems found (empty when all is well)."""
    manifest = load_manifest(vendor / "manifest.json")
    problems: list[str] = []
    listed = {"manifest.json", "README.md"}
    for package in manifest["packages"]:
        for entry in package["files"]:
            listed.add(entry["path"])
            target = vendor / entry["path"]
            if not target.is_file():
                problems.append(f"{entry['path']}: missing ({package['package']})")
            elif (actual := sha256_of(target)) != entry["sha256"]:
                problems.append(
                    f"{entry['path']}: sha256 {actual} differs from the manifest's "
                    f"{entry['sha256']} ({package['package']}@{package['version']})"
                )
    for path in sorted(vendor.rglob("*")):
        relative = path.relative_to(vendor).as_posix()
        if path.is_file() and relative not in listed:
            problems.append(f"{relative}: not in the manifest")
    return problems


def _integrity(tarball: Path) -> str:
    digest = hashlib.sha512(tarball.read_bytes()).digest()
    return "sha512-" + base64.b64encode(digest).decode()


def _pack(spec: str, directory: Path) -> dict[str, Any]:
    result = subprocess.run(
        ["npm", "pack", spec, "--json", "--pack-destination", str(directory)],
        check=True,
        capture_output=True,
        text=True,
    )
    packed: list[dict[str, Any]] = json.loads(result.stdout)
    return packed[0]


def refresh(specs: list[str], vendor: Path = VENDOR) -> dict[str, Any]:
    """Download each manifest package (at the versions in ``specs``, else its own) with
    ``npm pack``, check the tarball's integrity, unpack the listed files, and rewrite the
    manifest with the new versions, integrities and hashes."""
    manifest = load_manifest(vendor / "manifest.json")
    wanted = dict(spec.rsplit("@", 1) for spec in specs)
    unknown = set(wanted) - {package["package"] for package in manifest["packages"]}
    if unknown:
        raise VendorError(f"not in the manifest: {', '.join(sorted(unknown))}")
    with tempfile.TemporaryDirectory() as scratch:
        for package in manifest["packages"]:
            version = wanted.get(package["package"], package["version"])
            packed = _pack(f"{package['package']}@{version}", Path(scratch))
            tarball = Path(scratch) / packed["filename"]
            if _integrity(tarball) != packed["integrity"]:
                raise VendorError(f"{packed['filename']} does not match npm's integrity")
            with tarfile.open(tarball) as archive:
                for entry in package["files"]:
                    member = archive.extractfile(entry["source"])
                    if member is None:
                        raise VendorError(f"{entry['source']} is not a file in {tarball.name}")
                    target = vendor / entry["path"]
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(member.read())
                    entry["sha256"] = sha256_of(target)
            package.update(
                version=packed["version"],
                integrity=packed["integrity"],
                tarball=f"https://registry.npmjs.org/{package['package']}/-/{packed['filename']}",
            )
    (vendor / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def main(
    argv: list[str] | None = None,
    vendor: Path = VENDOR,
    prog: str = "python -m api.dashboard.vendor",
) -> int:
    """The command line over ``vendor`` (``api.openapi_ui`` runs it over its own files)."""
    parser = argparse.ArgumentParser(prog=prog, description=__doc__)
    actions = parser.add_subparsers(dest="action", required=True)
    actions.add_parser("verify", help="check the vendored files against the manifest")
    update = actions.add_parser("refresh", help="download the packages again with npm pack")
    update.add_argument("specs", nargs="*", metavar="NAME@VERSION")
    args = parser.parse_args(argv)
    if args.action == "refresh":
        manifest = refresh(args.specs, vendor)
        for package in manifest["packages"]:
            print(f"{package['package']}@{package['version']} {package['integrity']}")
    problems = verify(vendor)
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
