"""Numbers in request bodies are JSON numbers and flags are JSON booleans: ``true`` is not
1 and ``"8 "`` is not 8, on every write, through the service.

Each valid body is sent again with one number or flag replaced by a look-alike; every
such body is a 422 at that field, and none of them stores anything.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.api.builders import upload
from tests.api.documents import sample_profile

Path = tuple[str | int, ...]

# Free-form values, where a string or a flag is a value in its own right; and peak_bytes,
# which a profile's JSON carries but the service derives (and ignores when sent).
_FREE = {"variant", "details", "options", "peak_bytes"}
# Byte counts that people may write as text ("2GiB"): a flag is still refused there.
_TEXT_ALLOWED = {"memory_limit_bytes"}


def _leaves(document: Any, path: Path = ()) -> Iterator[tuple[Path, Any]]:
    """Every number and flag in ``document`` with its path; of a list, the first item's."""
    if isinstance(document, dict):
        for name, value in document.items():
            if name not in _FREE:
                yield from _leaves(value, (*path, name))
    elif isinstance(document, list):
        if document:
            yield from _leaves(document[0], (*path, 0))
    elif isinstance(document, bool | int | float):
        yield path, document


def _look_alikes(path: Path, value: Any) -> list[Any]:
    """What a loose parser would take for ``value``."""
    if isinstance(value, bool):
        return [int(value), str(value).lower()]
    alikes: list[Any] = [True]
    if path[-1] not in _TEXT_ALLOWED:
        alikes.append(f"{value} ")
    return alikes


def _replaced(document: dict[str, Any], path: Path, value: Any) -> dict[str, Any]:
    changed = copy.deepcopy(document)
    target: Any = changed
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value
    return changed


def _profile() -> dict[str, Any]:
    document: dict[str, Any] = sample_profile().model_dump(mode="json")
    document["parallel"]["bucket_cap_mb"] = 25.0
    document["workload"]["seq_len"] = 128
    return document


BODIES: dict[str, dict[str, Any]] = {
    "/api/v1/profiles": _profile(),
    "/api/v1/devices": {
        "key": "c" * 24,
        "kind": "cpu",
        "name": "cpu-test",
        "capacity_bytes": 2**30,
    },
    "/api/v1/workloads": {
        "key": "v" * 24,
        "name": "gpt-test",
        "precision": "fp32",
        "activation_checkpointing": False,
        "parameter_count": 1000,
        "optimizer": "AdamW",
        "seq_len": 128,
    },
    "/api/v1/jobs": {
        "target": "examples.gpt:workload",
        "device": "cpu-test",
        "settings": {
            "memory_limit_bytes": 2**30,
            "headroom": 0.1,
            "size_cap": 64,
            "warmup_steps": 2,
            "world_size": 1,
            "parallel": "fsdp",
            "tp": 1,  # the mesh's degree reaches the worker's command line: strict too
        },
    },
    "/api/v1/workers": {
        "name": "host-1",
        "device_key": "e" * 24,
        "device": {"kind": "cpu", "name": "cpu-other", "capacity_bytes": 2**30},
    },
}


def _counts(http: httpx.Client) -> dict[str, int]:
    counts = {}
    for what in ("profiles", "devices", "workloads", "jobs", "workers"):
        response = http.get(f"/api/v1/{what}")
        assert response.status_code == 200, response.text
        counts[what] = response.json()["count"]
    return counts


def test_every_number_and_flag_is_checked(http: httpx.Client) -> None:
    # The cases cover what they claim to: the bodies are valid, and their fields reach
    # every kind of number and flag in a profile.
    paths = {path for url in BODIES for path, _ in _leaves(BODIES[url])}
    assert ("probes", 0, "fits") in paths
    assert ("probes", 0, "breakdown", "activations_bytes") in paths
    assert ("parallel", "gradient_as_bucket_view") in paths
    assert ("settings", "headroom") in paths
    for url, body in BODIES.items():
        response = http.post(url, json=body)
        assert response.status_code == 201, f"{url}: {response.text}"


@pytest.mark.parametrize("url", list(BODIES))
def test_a_look_alike_number_is_refused_and_changes_nothing(http: httpx.Client, url: str) -> None:
    before = _counts(http)
    taken = []
    for path, value in _leaves(BODIES[url]):
        for alike in _look_alikes(path, value):
            response = http.post(url, json=_replaced(BODIES[url], path, alike))
            named = [str(part) for part in path]
            fields = response.json()["error"].get("fields", []) if response.is_error else []
            at_field = any(field["location"][1 : len(named) + 1] == named for field in fields)
            if response.status_code != 422 or not at_field:
                taken.append(f"{'.'.join(named)}={alike!r}: {response.status_code}")
    assert taken == []
    assert _counts(http) == before


def test_a_flag_for_a_size_no_longer_makes_nothing_fit(http: httpx.Client) -> None:
    # As reported: `true` taken for 1 made one OOM report lower every answer to nothing.
    upload(http, sample_profile(max_micro_batch_size=8))
    body = {"workload": "gpt-test", "device": "cpu-test", "micro_batch_size": True}
    assert http.post("/api/v1/oom-reports", json=body).status_code == 422
    body["micro_batch_size"] = "8 "
    assert http.post("/api/v1/oom-reports", json=body).status_code == 422
    answer = http.get(
        "/api/v1/recommendation",
        params={"workload": "gpt-test", "device": "cpu-test", "global_batch_size": 16},
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["micro_batch_size"] == 8


def test_json_integers_are_still_floats(http: httpx.Client) -> None:
    document = _profile()
    document["headroom"] = 0  # an integer where a float is asked for
    document["wall_time_s"] = 2
    response = http.post("/api/v1/profiles", json=document)
    assert response.status_code == 201, response.text
    assert response.json()["wall_time_s"] == 2.0
