"""SELECTs built with SQLAlchemy, compiled once per dialect, run on the driver's cursor.

Executing even a cached statement through SQLAlchemy costs 25-40 µs (a Session's ORM
query 75 µs and more), while SQLite answers the recommendation's indexed reads in 3-11 µs.
The store's hottest path therefore keeps SQLAlchemy for what it is best at, writing the
same statement for SQLite and PostgreSQL, and skips it at run time: the statement is
compiled once, its parameters are put in the driver's order, and each column's own result
processor turns the driver's values into what the ORM would return (SQLite's datetime
text into an aware ``datetime``, its 0/1 into ``bool``).

Measured (``bench/fast_paths.py``, the whole app in process, 100,000 profiles): a question
never asked before takes 182 µs with these reads and 304 µs with SQLAlchemy Core executing
the same statements; ``tests/api/test_fast_paths.py`` holds both to the same answers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import Dialect, Select

Row = tuple[Any, ...]


class PreparedSelect:
    """One SELECT for one dialect; ``rows(connection, **parameters)`` runs it."""

    def __init__(self, statement: Select[Any], dialect: Dialect) -> None:
        compiled = statement.compile(dialect=dialect)
        if "POSTCOMPILE" in compiled.string:
            # Expanding IN lists and literal-rendered limits need SQLAlchemy at run time.
            raise ValueError(f"cannot prepare with post-compile parameters: {statement}")
        self.sql = compiled.string
        self._order: Sequence[str] | None = compiled.positiontup if compiled.positional else None
        binds = compiled.binds
        self._fixed = {name: bind.value for name, bind in binds.items() if not bind.required}
        self._required = frozenset(name for name, bind in binds.items() if bind.required)
        self._bind_processors: dict[str, Callable[[Any], Any]] = {}
        for name, bind in binds.items():
            processor = bind.type.dialect_impl(dialect).bind_processor(dialect)
            if processor is not None:
                self._bind_processors[name] = processor
        self._dialect = dialect
        self._types = [column.type.dialect_impl(dialect) for column in statement.selected_columns]
        # Some processors depend on the driver's type codes (PostgreSQL's numerics), so
        # they are chosen at the first run, from the cursor's description.
        self._processors: list[tuple[int, Callable[[Any], Any]]] | None = None

    def rows(self, connection: Any, **parameters: Any) -> list[Row]:
        """Every row, its values as the ORM would give them. ``connection`` is a DBAPI
        connection (``sqlite3.Connection``, ``psycopg.Connection``)."""
        missing = self._required - parameters.keys()
        if missing:
            raise TypeError(f"missing parameters: {', '.join(sorted(missing))}")
        values = {**self._fixed, **parameters}
        for name, processor in self._bind_processors.items():
            values[name] = processor(values[name])
        arguments: Any = values if self._order is None else [values[n] for n in self._order]
        cursor = connection.cursor()
        try:
            cursor.execute(self.sql, arguments)
            fetched: list[Row] = cursor.fetchall()
            processors = self._processors
            if processors is None:
                processors = self._processors = self._choose_processors(cursor.description)
        finally:
            cursor.close()
        if not processors:
            return fetched
        converted = []
        for row in fetched:
            columns = list(row)
            for index, processor in processors:
                columns[index] = processor(columns[index])
            converted.append(tuple(columns))
        return converted

    def _choose_processors(self, description: Any) -> list[tuple[int, Callable[[Any], Any]]]:
        """(column index, processor) for each column whose value needs converting."""
        chosen: list[tuple[int, Callable[[Any], Any]]] = []
        for index, (type_, column) in enumerate(zip(self._types, description, strict=True)):
            processor = type_.result_processor(self._dialect, column[1])
            if processor is not None:
                chosen.append((index, processor))
        return chosen
