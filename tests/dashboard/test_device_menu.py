"""The calculator's device menu, in Chromium, lists devices by memory, smallest first:
their names sort as text, which put a 128 MiB limit before a 48 MiB one."""

from __future__ import annotations

from api.db import Database
from tests.api.documents import MiB, sample_profile
from tests.dashboard.conftest import Tab, signed_in
from tests.dashboard.data import store


def test_devices_are_offered_by_memory(tab: Tab, database: Database, reader: str) -> None:
    sizes = (128, 48, 512, 96, 64)
    store(
        database,
        [
            sample_profile(
                device_key=f"dev-{size}".ljust(24, "x"),
                device_name=f"x86_64 ({size} MiB limit)",
                capacity_bytes=size * MiB,
                max_micro_batch_size=1,
            )
            for size in sizes
        ],
    )
    page = signed_in(tab, reader).open("/")
    labels = page.locator("#calc-device option").all_inner_texts()
    shown = [int(label.split("(")[1].split(" MiB")[0]) for label in labels if "(" in label]
    assert shown == sorted(sizes)
