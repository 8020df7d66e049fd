"""`tuner serve --workers N`: processes sharing one port, each with its own caches, all
exact: a write seen by one is seen by every other on its next request."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import pytest

from api.db import Database
from tests.api.conftest import make_token
from tests.api.documents import sample_profile
from tests.services import tuner_serve

QUESTION = {"workload": "w" * 24, "device": "d" * 24, "global_batch_size": 64}


def _ask_on_new_connections(url: str, token: str, times: int) -> set[int]:
    """Each request on its own connection, so the kernel spreads them over the processes."""
    sizes = set()
    for _ in range(times):
        with httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=30) as client:
            response = client.get(url + "/api/v1/recommendation", params=QUESTION)
            assert response.status_code == 200, response.text
            sizes.add(response.json()["micro_batch_size"])
    return sizes


@pytest.mark.slow
def test_an_oom_reported_to_one_process_lowers_every_processs_answer(
    migrated_url: str, database: Database
) -> None:
    token = make_token(database, "write", "read")
    with tuner_serve(migrated_url, "--workers", "2") as url:
        headers = {"Authorization": f"Bearer {token}"}
        profile = sample_profile(max_micro_batch_size=16).model_dump(mode="json")
        assert httpx.post(url + "/api/v1/profiles", json=profile, headers=headers).is_success
        assert _ask_on_new_connections(url, token, 20) == {16}  # cached in both processes
        report = {**{k: QUESTION[k] for k in ("workload", "device")}, "micro_batch_size": 12}
        response = httpx.post(url + "/api/v1/oom-reports", json=report, headers=headers)
        assert response.status_code == 201
        assert _ask_on_new_connections(url, token, 20) == {11}


def test_each_server_process_freezes_its_start_up_objects_out_of_collections(
    migrated_url: str,
) -> None:
    check = (
        "import gc; from api.cli.serve import serving_app; serving_app(); "
        "assert gc.get_freeze_count() > 10_000, gc.get_freeze_count()"
    )
    env = {**os.environ, "TUNER_DATABASE_URL": migrated_url}
    subprocess.run([sys.executable, "-c", check], env=env, check=True, timeout=120)
