"""A list as a file (:func:`api.dashboard.downloads.download`): CSV with one header row
that parses back to the records, text a spreadsheet would run as a formula kept as text,
and JSON in the API's page shape."""

from __future__ import annotations

import csv
import io
import json

from api.dashboard.downloads import download

RECORDS = [
    {"id": 1, "detail": '=HYPERLINK("http://x")', "variant": {"b": 2}, "gap": None},
    {"id": 2, "detail": "-1 GiB short", "variant": {}, "gap": -3},
    {"id": 3, "detail": "plain, with a comma\nand a line", "variant": {"a": 1}, "gap": 0},
]
FIELDS = ("id", "detail", "variant", "gap")


def test_csv_parses_back_with_formulas_kept_as_text() -> None:
    response = download(RECORDS, fields=FIELDS, count=3, name="things", form="csv")
    assert response.media_type == "text/csv; charset=utf-8"
    assert response.headers["content-disposition"] == 'attachment; filename="things.csv"'
    rows = list(csv.DictReader(io.StringIO(bytes(response.body).decode())))
    assert rows == [
        {"id": "1", "detail": '\'=HYPERLINK("http://x")', "variant": '{"b": 2}', "gap": ""},
        {"id": "2", "detail": "'-1 GiB short", "variant": "{}", "gap": "-3"},
        {"id": "3", "detail": "plain, with a comma\nand a line", "variant": '{"a": 1}', "gap": "0"},
    ]


def test_json_is_the_records_and_how_many_match() -> None:
    response = download(RECORDS[:2], fields=FIELDS, count=3, name="things", form="json")
    assert response.media_type == "application/json"
    assert response.headers["content-disposition"] == 'attachment; filename="things.json"'
    assert response.headers["cache-control"] == "no-store"
    assert json.loads(bytes(response.body)) == {"data": RECORDS[:2], "count": 3}
