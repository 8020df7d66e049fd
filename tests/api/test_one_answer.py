"""What users met when the meaning of a question was decided in several places, each a test
that failed before :mod:`tuner.answer` decided it once (real server, SQLite and PostgreSQL):

- "free at M*" read one figure on the profiles list and another on the profile's page, and
  the service's ``expected_headroom_bytes`` differed from a local plan's, because only some
  of them counted the copies CPU collectives make;
- a dashboard link that names the workload and device selected other rows in the menus
  than the ones it answered from, so the next edit asked about other rows;
- an OOM report by name capped whatever the name meant (another workload of that name),
  while the profile the failing plan came from kept recommending the size that failed.
"""

from __future__ import annotations

import html
import json
import re

import httpx

from api.dashboard import queries
from api.db import Database
from tests.api.builders import at, upload
from tests.api.documents import MiB, sample_profile
from tuner.answer.local import answer_from
from tuner.core.results import MemoryBreakdown, Profile

COPIES = 3 * MiB


def with_collective_copies(profile: Profile) -> Profile:
    """A profile measured on CPU ranks under gloo: the process held the collectives'
    copies beside each step's peak."""
    probes = []
    for probe in profile.probes:
        breakdown = probe.breakdown or MemoryBreakdown()
        probes.append(
            probe.model_copy(
                update={
                    "breakdown": breakdown.model_copy(update={"collective_copies_bytes": COPIES})
                }
            )
        )
    return profile.model_copy(update={"probes": probes})


def test_free_at_m_star_is_one_figure_on_every_surface(
    http: httpx.Client, database: Database
) -> None:
    profile = with_collective_copies(sample_profile(max_micro_batch_size=8))
    stored = upload(http, profile)
    at_max = profile.probe_at(8)
    assert at_max is not None
    assert at_max.footprint_bytes is not None
    free = profile.device.capacity_bytes - at_max.footprint_bytes

    with database.session() as session:
        listed = queries.list_profiles(session, queries.ListQuery(), project_id=1)
        detail = queries.profile_detail(session, stored["id"], project_id=1)
    [row] = listed.rows
    assert row.free_bytes == free
    assert detail.at_max is not None
    assert detail.at_max.footprint_bytes == at_max.footprint_bytes

    asked = {"workload": profile.workload_key, "device": profile.device_key}
    answer = http.get("/api/v1/recommendation", params={**asked, "global_batch_size": 16})
    assert answer.status_code == 200, answer.text
    local = answer_from(profile, global_batch_size=16)
    assert answer.json()["expected_headroom_bytes"] == local.expected_headroom_bytes == free


def _selected(html: str, select_id: str) -> str | None:
    menu = re.search(rf'<select id="{select_id}"[^>]*>(.*?)</select>', html, re.S)
    assert menu is not None, f"no menu {select_id}"
    chosen = re.search(r'<option value="([^"]*)" selected>', menu.group(1))
    return chosen.group(1) if chosen else None


def test_a_dashboard_link_by_name_selects_the_rows_it_answers_from(http: httpx.Client) -> None:
    # The model on a small device, then (newest of all) on a larger one.
    small = sample_profile(
        max_micro_batch_size=8,
        device_key="small".ljust(24, "s"),
        device_name="x86_64 (96 MiB limit)",
        capacity_bytes=200 * MiB,
        created_at=at(0),
    )
    large = sample_profile(
        max_micro_batch_size=30,
        device_key="large".ljust(24, "l"),
        device_name="x86_64 (512 MiB limit)",
        capacity_bytes=512 * MiB,
        created_at=at(10),
    )
    upload(http, small)
    upload(http, large)
    by_name = {"workload": "gpt-test", "device": "x86_64 (96 MiB limit)"}
    page = http.get("/", params={**by_name, "global_batch_size": 64, "world_size": 2})
    assert page.status_code == 200, page.text
    assert _selected(page.text, "calc-workload") == small.workload_key
    assert _selected(page.text, "calc-device") == small.device_key
    # The next edit asks with the menus' keys: the same rows, the API's answer by name.
    api = http.get(
        "/api/v1/recommendation", params={**by_name, "global_batch_size": 64, "world_size": 4}
    ).json()
    edited = http.get(
        "/",
        params={
            "workload": small.workload_key,
            "device": small.device_key,
            "global_batch_size": 64,
            "world_size": 4,
        },
    )
    shown = re.search(r"data-answer='([^']*)'", edited.text)
    assert shown is not None
    answer = json.loads(html.unescape(shown.group(1)))
    assert api["device_key"] == answer["device_key"] == small.device_key
    assert (answer["micro_batch_size"], answer["grad_accum"]) == (
        api["micro_batch_size"],
        api["grad_accum"],
    )


def test_an_oom_report_caps_the_profile_its_plan_came_from(http: httpx.Client) -> None:
    measured = sample_profile(max_micro_batch_size=16, created_at=at(0))
    upload(http, measured)
    asked = {"workload": "gpt-test", "device": "cpu-test", "global_batch_size": 64}
    plan = http.get("/api/v1/recommendation", params=asked).json()
    assert plan["micro_batch_size"] == 16
    # Later, another workload of the same name (another variant) becomes what the name
    # means; the run that trained with the plan above then runs out of memory at 16.
    variant = sample_profile(
        max_micro_batch_size=40,
        workload_key="v" * 24,
        capacity_bytes=200 * MiB,
        created_at=at(5),
    )
    upload(http, variant)
    assert http.get("/api/v1/recommendation", params=asked).json()["workload_key"] == "v" * 24
    report = http.post(
        "/api/v1/oom-reports",
        json={
            "workload": "gpt-test",
            "device": "cpu-test",
            "micro_batch_size": 16,
            "settled_micro_batch_size": 12,
            "profile_id": plan["profile_id"],
        },
    )
    assert report.status_code == 201, report.text
    assert report.json()["workload_key"] == measured.workload_key
    capped = http.get(
        "/api/v1/recommendation", params={**asked, "workload": measured.workload_key}
    ).json()
    assert capped["oom_limit"] == 13
    assert capped["micro_batch_size"] <= 12
    page = http.get(f"/profiles/{plan['profile_id']}")
    assert page.status_code == 200
    assert 'id="oom-banner"' in page.text
    assert 'data-oom-limit="13"' in page.text
    # The variant the name now means is not capped by a failure it never ran.
    assert http.get("/api/v1/recommendation", params=asked).json()["oom_limit"] is None


def test_a_report_naming_a_profile_of_another_workload_is_refused(http: httpx.Client) -> None:
    stored = upload(http, sample_profile(max_micro_batch_size=8))
    upload(http, sample_profile(max_micro_batch_size=8, workload_key="o" * 24, workload_name="o"))
    body = {"workload": "o", "device": "cpu-test", "micro_batch_size": 8}
    response = http.post("/api/v1/oom-reports", json={**body, "profile_id": stored["id"]})
    assert response.status_code == 422, response.text
    assert "is of workload 'gpt-test'" in response.json()["error"]["message"]
    asked = {"workload": "o", "device": "cpu-test", "global_batch_size": 8}
    assert (
        http.get("/api/v1/recommendation", params=asked).json()["oom_limit"] is None
    )  # none stored


def test_a_key_a_name_and_a_family_cannot_be_taken_for_one_another(http: httpx.Client) -> None:
    upload(http, sample_profile(max_micro_batch_size=8))  # key "w"*24, name "gpt-test"
    # A workload keyed as another's name: the name would answer from it.
    forged = sample_profile(max_micro_batch_size=1, workload_key="gpt-test", workload_name="x")
    response = http.post("/api/v1/profiles", json=forged.model_dump(mode="json"))
    assert response.status_code == 409, response.text
    assert "is the name of another workload" in response.json()["error"]["message"]
    # A workload named as another's key.
    named = sample_profile(max_micro_batch_size=1, workload_key="k" * 24, workload_name="w" * 24)
    response = http.post("/api/v1/profiles", json=named.model_dump(mode="json"))
    assert response.status_code == 409, response.text
    assert "is the key of another workload" in response.json()["error"]["message"]
    # A workload named as a length family's key, and a family keyed as a workload's name.
    member = sample_profile(max_micro_batch_size=4, workload_key="m" * 24, workload_name="lm")
    info = member.workload.model_copy(update={"seq_len": 64, "length_family": "f" * 24})
    upload(http, member.model_copy(update={"workload": info}))
    as_family = sample_profile(
        max_micro_batch_size=1, workload_key="n" * 24, workload_name="f" * 24
    )
    response = http.post("/api/v1/profiles", json=as_family.model_dump(mode="json"))
    assert response.status_code == 409, response.text
    assert "is a length family's key" in response.json()["error"]["message"]
    family_as_name = member.model_copy(
        update={
            "workload_key": "q" * 24,
            "workload": info.model_copy(update={"length_family": "gpt-test", "seq_len": 128}),
        }
    )
    response = http.post("/api/v1/profiles", json=family_as_name.model_dump(mode="json"))
    assert response.status_code == 409, response.text
    assert "is the key or name of a workload" in response.json()["error"]["message"]
    # Nothing of the refused uploads was stored; the name still answers from its own row.
    asked = {"workload": "gpt-test", "device": "cpu-test", "global_batch_size": 8}
    assert http.get("/api/v1/recommendation", params=asked).json()["workload_key"] == "w" * 24
    assert len(http.get("/api/v1/workloads").json()["data"]) == 2
