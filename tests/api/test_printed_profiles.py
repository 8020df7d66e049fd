"""``tuner profile --json`` prints what ``POST /api/v1/profiles`` stores, as printed: every
flag combination, as real ``tuner`` subprocesses on tiny CPU workloads, posted to the real
service; and with ``--explore`` every part of the output is the chosen variant's."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.api.conftest import service_over_sqlite
from tests.helpers import REPO_ROOT, subprocess_env, tuner_executable
from tuner.client import TunerClient
from tuner.core.errors import BadInputError
from tuner.core.reports import LengthsReport, ProfileReport
from tuner.core.results import Profile

MLP = ["examples.mlp:workload", "-o", "hidden=64", "-o", "layers=1", "--memory-limit", "4MiB",
       "--max", "64"]  # fmt: skip
# The smallest GPT whose DDP profile is quick (as in test_world_sizes.py).
DDP_GPT = ["examples.gpt:workload", "-o", "layers=1", "-o", "dim=64", "-o", "heads=2", "-o",
           "vocab=2048", "-o", "seq_len=8", "--memory-limit", "6MiB", "--max", "16"]  # fmt: skip
DDP = [*DDP_GPT, "--world-size", "2", "--parallel", "ddp", "--no-explore"]
# Nothing fits as loaded; only checkpointing with bf16 fits one sample (test_explore_cli.py).
STACK = ["tests.variant_workloads:activations_heavy", "--memory-limit", "1000000"]
LENGTHS_GPT = ["examples.gpt:workload", "-o", "vocab=64", "-o", "dim=16", "-o", "layers=1",
               "-o", "heads=2", "--memory-limit", "1MiB", "--seq-lens", "64,16,32"]  # fmt: skip

# Each flag of `tuner profile` that changes the document, alone and with the others it
# combines with (--seq-lens refuses --explore and --parallel).
COMBINATIONS = {
    "options": MLP,
    "global-batch-size": [*MLP, "--global-batch-size", "100"],
    "upload": [*MLP, "--upload"],
    "global-batch-size+upload": [*MLP, "--global-batch-size", "100", "--upload"],
    "parallel": DDP,
    "parallel+global-batch-size+upload": [*DDP, "--global-batch-size", "32", "--upload"],
    "explore": [*STACK, "--explore"],
    "explore+global-batch-size+upload": [
        *STACK,
        "--explore",
        "--global-batch-size",
        "4",
        "--upload",
    ],
    "seq-lens": LENGTHS_GPT,
    "seq-lens+global-batch-size+upload": [*LENGTHS_GPT, "--global-batch-size", "32", "--upload"],
}


@dataclass(frozen=True)
class Service:
    url: str
    token: str

    def http(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {self.token}"}, timeout=30
        )


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    with service_over_sqlite(tmp_path_factory.mktemp("printed")) as (server, token):
        yield Service(server.url, token)


def printed(service: Service, arguments: list[str]) -> dict[str, Any]:
    """What ``tuner profile ARGUMENTS --device cpu --json`` printed, uploading to ``service``."""
    env = {**subprocess_env(), "TUNER_URL": service.url, "TUNER_TOKEN": service.token}
    done = subprocess.run(
        [str(tuner_executable()), "profile", *arguments, "--device", "cpu", "--json"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    document: dict[str, Any] = json.loads(done.stdout)
    return document


def own_fields(document: dict[str, Any]) -> dict[str, Any]:
    """The profile's own fields of a printed or stored profile, as JSON."""
    own = {k: v for k, v in document.items() if k in Profile.model_fields}
    return Profile.model_validate(own).model_dump(mode="json")


@pytest.mark.slow
@pytest.mark.parametrize("name", list(COMBINATIONS))
def test_the_printed_json_posts_and_validates_as_it_is(service: Service, name: str) -> None:
    arguments = COMBINATIONS[name]
    document = printed(service, arguments)
    uploaded = "--upload" in arguments
    with service.http() as http:
        posted = http.post("/api/v1/profiles", json=document)
    # Stored by --upload already: the same document again is recognised (200), not refused.
    assert posted.status_code == (200 if uploaded else 201), posted.text
    answer = posted.json()

    if "--seq-lens" in arguments:
        report = LengthsReport.model_validate(document)
        assert [p.workload.seq_len for p in report.profiles] == [16, 32, 64]
        stored = answer["data"]
        assert answer["count"] == len(document["profiles"]) == 3
        pairs = list(zip(document["profiles"], stored, strict=True))
    else:
        ProfileReport.model_validate(document)
        pairs = [(document, answer)]
        with TunerClient(service.url, token=service.token) as client:
            assert client.upload_profile(document).id == answer["id"]
    for one, kept in pairs:
        assert own_fields(kept) == own_fields(one)
        if uploaded:
            assert one["profile_id"] == kept["id"]
        if "--global-batch-size" in arguments and one["max_micro_batch_size"]:
            assert one["micro_batch_size"] == one["recommendation"]["micro_batch_size"]


@pytest.mark.slow
def test_explore_prints_the_chosen_variant_and_its_stored_id(service: Service) -> None:
    document = printed(service, [*STACK, "--explore", "--global-batch-size", "4", "--upload"])
    [chosen] = [v for v in document["variants"] if v["chosen"]]
    assert chosen["variant"] == {"checkpointing": True, "precision": "bf16"}
    # M*, probes, plan, id and options: all the chosen variant's, none the loaded one's.
    assert document["variant"] == chosen["variant"]
    assert document["max_micro_batch_size"] == chosen["max_micro_batch_size"] == 1
    assert document["recommendation"] == chosen["recommendation"]
    assert document["micro_batch_size"] == 1
    assert any(p["micro_batch_size"] == 1 and p["fits"] for p in document["probes"])
    with service.http() as http:
        stored = http.get(f"/api/v1/profiles/{document['profile_id']}").json()
    assert stored["variant"] == chosen["variant"]
    assert stored["max_micro_batch_size"] == 1
    # The choice is the profile's own: printed, stored, and checked against the variants.
    assert document["variant_chosen"] is stored["variant_chosen"] is True
    with service.http() as http:
        denied = http.post("/api/v1/profiles", json={**document, "variant_chosen": False})
        assert denied.status_code == 422
        assert "variant_chosen is false but the variants mark one chosen" in denied.text
        # A document printed before profiles carried the mark still posts as printed.
        older = {k: v for k, v in document.items() if k != "variant_chosen"}
        assert http.post("/api/v1/profiles", json=older).status_code == 200


@pytest.mark.slow
def test_a_misspelt_or_contradicting_key_is_still_refused(service: Service) -> None:
    document = printed(service, [*MLP, "--global-batch-size", "100"])
    with service.http() as http:
        before = http.get("/api/v1/profiles").json()["count"]
        typo = http.post("/api/v1/profiles", json={**document, "advise": []})
        assert typo.status_code == 422
        assert "advise" in typo.text
        wrong = {**document, "micro_batch_size": document["micro_batch_size"] + 1}
        contradicting = http.post("/api/v1/profiles", json=wrong)
        assert contradicting.status_code == 422
        assert "micro_batch_size" in contradicting.text
        assert http.get("/api/v1/profiles").json()["count"] == before  # nothing stored
    with TunerClient(service.url, token=service.token) as client:
        with pytest.raises(BadInputError, match="advise"):
            client.upload_profile({**document, "advise": []})
        with pytest.raises(BadInputError, match="seq-lens"):
            client.upload_profile({"profiles": [document]})
