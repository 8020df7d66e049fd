"""The calculator's answer line is an equation that holds, and the answer offers its equal
split as a framework's settings (copy as TrainingArguments / Lightning Trainer). The app in
this process (FastAPI's TestClient) over a fresh SQLite file: the HTML as served."""

from __future__ import annotations

import html
import re
from pathlib import Path

from fastapi.testclient import TestClient

from api import migrate
from api.config import ServiceSettings
from api.db import Database
from api.main import create_app
from tests.api.documents import sample_profile
from tests.dashboard.data import store


def _text(fragment: str) -> str:
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", fragment)).split())


def _page(tmp_path: Path, **params: int) -> str:
    url = f"sqlite:///{tmp_path / 'tuner.db'}"
    migrate.upgrade(url)
    database = Database(url)
    try:
        [stored] = store(database, [sample_profile(max_micro_batch_size=15)])
    finally:
        database.dispose()
    app = create_app(ServiceSettings(database_url=url, public_reads=True))
    with TestClient(app) as client:
        page = client.get(f"/profiles/{stored}", params=params)
    assert page.status_code == 200, page.text[:500]
    return page.text


def test_an_uneven_split_reads_as_its_runs_and_a_framework_gets_the_equal_split(
    tmp_path: Path,
) -> None:
    page = _page(tmp_path, global_batch_size=256, world_size=2)
    line = re.search(r'<p class="answer-line" id="calc-headline".*?</p>', page, re.DOTALL)
    assert line is not None
    # Never "15 per micro batch × 9 accumulation steps × 2 ranks = 256" (that is 270).
    assert _text(line.group(0)).startswith("2×15 + 7×14 = 128 per rank × 2 ranks = 256")
    equal = re.search(r'<dd id="calc-equal".*?</dd>', page, re.DOTALL)
    assert equal is not None
    said = _text(equal.group(0))
    assert said.startswith("micro batch 8 × 16 accumulation steps × 2 ranks = global batch 256")
    assert (
        "TrainingArguments(per_device_train_batch_size=8, gradient_accumulation_steps=16)" in said
    )
    assert "Trainer(accumulate_grad_batches=16) # and DataLoader(batch_size=8)" in said


def test_an_equal_split_reads_as_a_frameworks_settings(tmp_path: Path) -> None:
    page = _page(tmp_path, global_batch_size=240, world_size=2)
    line = re.search(r'<p class="answer-line" id="calc-headline".*?</p>', page, re.DOTALL)
    assert line is not None
    assert _text(line.group(0)).startswith(
        "15 per micro batch × 8 accumulation steps × 2 ranks = 240"
    )
