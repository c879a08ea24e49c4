"""A parsed ``query.csv`` as plain JSON: what the ledger keeps beside the text.

Reading 1,000 hosts' ``--query-gpu`` texts costs a reader about half a millisecond of CPU per
host (a CSV split, a unit check and a conversion per cell); a task planning on a large fleet
would pay it for every host in every fresh process. The collector parses each text once when
it stores it and keeps the result (:func:`query_facts`) in the same ledger row; readers rebuild
the parsed form from it (:func:`query_from_facts`), several times faster than parsing.

The facts are a cache of the text, never a second source of truth: they are written from the
text in the same statement that writes it, carry the layout of :class:`QueryRow` they were made
with, and a reader that finds no facts, or facts of another layout (a ledger written by another
version of this package), parses the text instead.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from airflow_hetero_gpu.capture.query import LostDevice, QueryResult, QueryRow

#: The format of the facts; a change of meaning (not of fields) bumps it.
VERSION = 1
#: QueryRow's fields in order: the layout the rows are written in.
LAYOUT = [f.name for f in dataclasses.fields(QueryRow)]
_PROBLEMS = LAYOUT.index("problems")
_new = object.__new__
# filling a row's __dict__ directly (query_from_facts) skips nothing QueryRow's __init__ does
assert not hasattr(QueryRow, "__slots__") and not hasattr(QueryRow, "__post_init__")


def query_facts(result: QueryResult) -> dict[str, Any]:
    """``result`` as JSON-able data (lists, strings, numbers, None)."""
    rows = []
    for row in result.rows:
        values = [getattr(row, name) for name in LAYOUT]
        values[_PROBLEMS] = sorted(row.problems)
        rows.append(values)
    return {"v": VERSION, "fields": LAYOUT, "rows": rows,
            "lost": [[d.pci_bus_id, d.message, d.line] for d in result.lost], "host_error": result.host_error}


def query_from_facts(facts: Mapping[str, Any] | None) -> QueryResult | None:
    """The parsed ``query.csv`` the facts were made from; None when they are missing or of
    another version or layout (the reader then parses the text)."""
    if not facts or facts.get("v") != VERSION or facts.get("fields") != LAYOUT:
        return None
    rows = []
    for values in facts["rows"]:
        # the frozen dataclass's __init__ sets its 26 fields one object.__setattr__ at a time
        # (a fifth of a 1,000-host read); the row's attributes are its __dict__, so fill that
        row = _new(QueryRow)
        attrs = row.__dict__
        attrs.update(zip(LAYOUT, values))
        attrs["problems"] = frozenset(attrs["problems"])
        rows.append(row)
    lost = [LostDevice(bus, message, line) for bus, message, line in facts["lost"]]
    return QueryResult(rows, lost, facts.get("host_error"))


__all__ = ["LAYOUT", "VERSION", "query_facts", "query_from_facts"]
