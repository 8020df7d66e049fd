"""The calculator's pages stay small whatever the batch asked: the answer's split is shown
and carried as runs, never as every micro batch. Real service.

At M* = 1 and a global batch of 2**20, a page that listed the split was 6.3 MB of HTML.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from api.db import Database
from tests.api.builders import upload
from tests.api.conftest import make_token
from tests.api.documents import sample_profile
from tests.services import ServerThread
from tuner.core.wire.recommendation import MAX_GLOBAL_BATCH_SIZE

# A page with its calculator answered is about 8 KiB at any batch.
PAGE_BOUND = 32 * 1024


@pytest.fixture
def one_sample_fits(
    service: ServerThread, database: Database
) -> Iterator[tuple[httpx.Client, int]]:
    """A client of the service, which holds one profile whose M* is 1, and its id."""
    admin = make_token(database, "admin", name="admin")
    with httpx.Client(
        base_url=service.url, headers={"Authorization": f"Bearer {admin}"}, timeout=60
    ) as client:
        stored = upload(client, sample_profile(max_micro_batch_size=1))
        yield client, int(stored["id"])


def _split_shown(page: str) -> Any:
    found = re.search(r'id="calc-split" class="mono" data-split="([^"]*)"', page)
    assert found is not None, "the page shows no answer"
    return json.loads(found.group(1).replace("&#34;", '"'))


@pytest.mark.parametrize("path", ["/", "/profiles/{id}"])
def test_the_calculator_page_at_m_star_1_and_the_largest_batch_is_small(
    one_sample_fits: tuple[httpx.Client, int], path: str
) -> None:
    client, profile_id = one_sample_fits
    url = path.format(id=profile_id)
    small = client.get(url, params={"global_batch_size": 256})
    large = client.get(url, params={"global_batch_size": MAX_GLOBAL_BATCH_SIZE})
    assert (small.status_code, large.status_code) == (200, 200), large.text[:500]
    assert len(large.content) < PAGE_BOUND, f"{len(large.content)} bytes"
    # The batch shows as a few more digits, nothing that grows with it.
    assert len(large.content) - len(small.content) < 200
    assert _split_shown(small.text) == [[1, 256]]
    assert _split_shown(large.text) == [[1, MAX_GLOBAL_BATCH_SIZE]]
    assert f"{MAX_GLOBAL_BATCH_SIZE}×1 = 1,048,576 samples a step" in large.text
