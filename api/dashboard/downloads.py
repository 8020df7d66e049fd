"""A list of the dashboard as a file: CSV (one header row, then one row per item) or JSON
(``{"data": [...], "count": N}``, the JSON API's page shape: ``count`` is how many match
the filters, more than ``data`` holds when the download's bound cut it)."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from fastapi.responses import Response

Format = Literal["csv", "json"]
FORMATS: tuple[Format, ...] = ("csv", "json")


def download(
    records: Sequence[Mapping[str, Any]],
    *,
    fields: Sequence[str],
    count: int,
    name: str,
    form: Format,
) -> Response:
    """``records`` as ``name.csv`` or ``name.json``, saved rather than shown."""
    if form == "csv":
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=list(fields), lineterminator="\r\n")
        writer.writeheader()
        for record in records:
            writer.writerow({field: _cell(record.get(field)) for field in fields})
        body, media_type = buffer.getvalue(), "text/csv; charset=utf-8"
    else:
        body = json.dumps({"data": list(records), "count": count}, indent=1) + "\n"
        media_type = "application/json"
    headers = {
        "Content-Disposition": f'attachment; filename="{name}.{form}"',
        # What a page may read is no cache's to keep.
        "Cache-Control": "no-store",
    }
    return Response(body, media_type=media_type, headers=headers)


# A spreadsheet runs a cell that starts with one of these as a formula: text from the store
# (a job's error, a report's message) must stay text.
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def _cell(value: Any) -> Any:
    """A CSV cell: nested values as JSON, nothing as an empty cell, text that a spreadsheet
    would run as a formula quoted with a leading apostrophe."""
    if value is None:
        return ""
    if isinstance(value, dict | list):
        value = json.dumps(value, sort_keys=True)
    if isinstance(value, str) and value.startswith(_FORMULA_STARTS):
        return "'" + value
    return value
