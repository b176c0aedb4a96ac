"""The pass over the shared index (R2, R4 of ``index``): the dead holders reaped, unused
packages evicted under the root's budget and the kinds' budgets, least recently used first, and
the changes of the ready packages a holder's view follows (the change log).

Each function runs inside one transaction its caller opened, on the index's thread, as
``index``'s do; an eviction's rename into the trash is made inside it (R2).
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from agent.core.errors import echo_label
from agent.state import schema
from agent.state.index import KindBudget, Row, RowKey
from agent.state.reaping import Reaped, into_trash, plain_name, reap_dead

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Evicted:
    row: Row
    trashed: Path | None  # None: its directory was gone already


@dataclass
class Swept:
    evicted: list[Evicted]
    ready_bytes: int  # of the root's ready packages, after the pass
    unused_bytes: int  # of those no live holder references, after the pass
    gen: int  # the last change of the ready packages the caller now knows of
    full: bool  # ``changes`` lists every ready package (the caller's view was too old)
    changes: list[tuple[RowKey, Row | None]]  # since ``since``: ready now (its row) or gone
    reaped: Reaped


KEEP_CHANGES = 10_000  # of the change log; an agent further behind reads every ready row


# -- the pass ------------------------------------------------------------------------------
_PAGE = 64  # unused rows read per query of an eviction


def sweep(
    conn: sqlite3.Connection,
    root: Path,
    me: str,
    trash: Path,
    *,
    budget_bytes: int,
    needed_bytes: int = 0,
    since: int = -1,
    reaped: Reaped | None = None,
    may_evict: Callable[[RowKey], bool] | None = None,
    kind_budgets: Sequence[KindBudget] = (),
) -> Swept:
    """R2, R4: reap the dead, then evict unused packages, least recently used first, until the
    root's unused bytes fit ``budget_bytes`` and, if ``needed_bytes``, until that much is freed
    (or, if evicting every unused package would not free it, only what the budget asks). Then
    the changes of the ready packages after ``since`` (every ready package when ``since`` is
    -1, nothing seen yet, or when the log no longer reaches back that far). Costs: one
    aggregate scan in SQLite, the unused rows read in LRU order only as far as evictions go,
    the log read from ``since``. ``may_evict``: asked before each eviction; a package it
    refuses (its holder took it again meanwhile) is kept, and counted used. ``kind_budgets``:
    then, for each, the unused packages of its kinds evicted, least recently used first, until
    its kinds' ready bytes, used or not, fit it too (or none of them is unused)."""
    reaped = reap_dead(conn, root, me, trash, reaped if reaped is not None else Reaped())
    ready_bytes, unused = conn.execute(schema.READY_AND_UNUSED_BYTES, (me,)).fetchone()
    evicted: list[Evicted] = []
    evicting = _Evicting(conn, root, me, trash, may_evict, evicted)
    freed, kept_bytes = evicting.lru(
        schema.UNUSED_PAGE,
        (me,),
        lambda left, done: done < plan_target(left, budget_bytes, needed_bytes),
        unused,
    )
    ready_bytes, unused = ready_bytes - freed, unused - kept_bytes - freed
    for group in kind_budgets:
        kinds = sorted(group.kinds)
        (of_group,) = conn.execute(schema.ready_bytes_of(len(kinds)), kinds).fetchone()
        freed, kept_bytes = evicting.lru(
            schema.unused_page_of(len(kinds)), (me, *kinds), _over(group.budget_bytes, of_group), 0
        )
        ready_bytes, unused = ready_bytes - freed, unused - kept_bytes - freed
    full, changes, gen = _changes_since(conn, since)
    return Swept(evicted, ready_bytes, unused, gen, full, changes, reaped)


@dataclass
class _Evicting:
    """One pass's evictions: rows moved to the trash, least recently used first, one page at a
    time (the deletes change the table)."""

    conn: sqlite3.Connection
    root: Path
    me: str
    trash: Path
    may_evict: Callable[[RowKey], bool] | None
    evicted: list[Evicted]

    def lru(
        self, page_sql: str, params: tuple[str, ...], more: Callable[[int, int], bool], unused: int
    ) -> tuple[int, int]:
        """Evict the rows ``page_sql`` pages (``params``, then LIMIT and OFFSET) while
        ``more(unused, freed)``; return the bytes freed and the bytes of the rows
        ``may_evict`` kept (in use after all: no longer unused)."""
        freed, kept, kept_bytes = 0, 0, 0  # kept: rows not moved, skipped by the next page
        while more(unused - kept_bytes, freed):
            rows = self.conn.execute(page_sql, (*params, _PAGE, kept)).fetchall()
            if not rows:
                break
            for kind, uri, directory, size, used in rows:
                if not more(unused - kept_bytes, freed):
                    break
                if self.may_evict is not None and not self.may_evict((kind, uri)):
                    kept += 1
                    kept_bytes += size
                    continue
                row = Row(kind, uri, directory, size, used)
                trashed = _evict(self.conn, self.root, self.me, self.trash, row)
                if trashed is False:
                    kept += 1
                    continue
                self.evicted.append(Evicted(row, trashed))  # type: ignore[arg-type]
                freed += size
        return freed, kept_bytes


def _over(budget: int, ready: int) -> Callable[[int, int], bool]:
    """A kind budget's test: its kinds' ``ready`` bytes, less those freed, still over it."""
    return lambda _unused, freed: ready - freed > budget


def plan_target(unused: int, budget: int, needed: int) -> int:
    """Bytes of unused packages to evict: what is over the budget, or ``needed`` if more and if
    all the unused bytes would free it (the over-budget evictions count toward it). Pure."""
    over = max(unused - budget, 0)
    if needed > over and unused >= needed:
        return needed
    return over


def _evict(
    conn: sqlite3.Connection, root: Path, me: str, trash: Path, row: Row
) -> Path | bool | None:
    """Move the package into the trash and delete its row (and ``me``'s deferred reference to
    it, if it was one), in this transaction. The trashed
    path; None if its folder was gone already (the row goes all the same), or if the row names
    no folder of uris/ (a hostile or corrupt ``dir``: the row goes, the disk is not touched);
    False if it could not be moved (kept, row and folder: the next pass tries again)."""
    if not plain_name(row.dir):  # an absolute path, "", "..": never a folder of this root's
        log.warning(
            "evicting %s: the index names %s as its folder, which is no folder of uris/; its "
            "row is dropped and nothing on disk is touched",
            echo_label(f"{row.kind}:{row.uri}"),
            echo_label(repr(row.dir)),
            extra={"uri": f"{row.kind}:{row.uri}", "dir": str(row.dir)},
        )
        _drop_row(conn, me, row)
        return None
    try:
        trashed = into_trash(root / "uris" / row.dir, trash)
    except OSError as exc:
        log.warning(
            "evicting %s: cannot move %s: %s",
            echo_label(f"{row.kind}:{row.uri}"),
            echo_label(row.dir),
            exc.strerror or exc,
            extra={
                "uri": f"{row.kind}:{row.uri}",
                "dir": row.dir,
                "error": str(exc.strerror or exc),
            },
        )
        return False
    _drop_row(conn, me, row)
    return trashed


def _drop_row(conn: sqlite3.Connection, me: str, row: Row) -> None:
    """An evicted package's row, and ``me``'s deferred reference to it (the only kind of
    reference an evicted package may have: ``schema.UNUSED_PAGE``)."""
    key = (row.kind, row.uri)
    conn.execute(schema.DELETE_URI, key)
    conn.execute(schema.DROP_REF, (me, *key))
    conn.execute(schema.UNDEFER, key)


def _changes_since(
    conn: sqlite3.Connection, since: int
) -> tuple[bool, list[tuple[RowKey, Row | None]], int]:
    """(full, changes, gen): the ready packages that appeared or went after ``since``, the
    latest state of each, in order; or, if the log was trimmed past ``since`` (or ``since`` is
    -1), every ready package (``full``). The log is trimmed to ``KEEP_CHANGES`` here."""
    (gen,) = conn.execute(schema.LAST_GEN).fetchone()
    conn.execute(schema.TRIM_CHANGES, (gen - KEEP_CHANGES,))
    (oldest,) = conn.execute(schema.OLDEST_GEN).fetchone()
    if since < 0 or since < oldest - 1:
        rows = conn.execute(schema.READY_ROWS).fetchall()
        return True, [((r[0], r[1]), Row(*r)) for r in rows], gen
    latest: dict[RowKey, Row | None] = {}
    for kind, uri, directory, size, used in conn.execute(schema.CHANGES_SINCE, (since,)):
        latest[(kind, uri)] = None if directory is None else Row(kind, uri, directory, size, used)
    return False, list(latest.items()), gen
