"""The shared index's SQL, all of it: the schema (its tables, the migrations that build them,
the version), and the text of every statement the agent and its readers run on the file.

Nothing else in the agent writes SQL: ``index_file`` opens and migrates the file with these
scripts, ``index`` and ``reaping`` run the rules' transactions with these statements,
``state_db`` its reads and write-behind, ``agent.ops.root_view`` and the chaos runner their
read-only looks. A change of a table is a new schema version here: a new script in
``MIGRATIONS`` that takes the previous version's file to it (a new file climbs the same steps),
and ``SCHEMA_VERSION`` raised.

The tables (version 3): ``uris``, a package per row (its key, folder, size, last use; ready, or
being installed by the holder whose claim it is); ``holders``, an agent serving the root per
row (its pid, start, live envs); ``refs``, a holder's reference to a package; ``changes``, the
log of ready packages that appeared or went (triggers write it), which the agents' views follow.
A connection's private ``temp.released`` lists the references whose drop its holder deferred.
"""

from __future__ import annotations

SCHEMA_VERSION = 3

# -- the schema ---------------------------------------------------------------------------
# Version 1, as the first agents wrote it. A new file climbs the same steps as an old one.
_SCHEMA_V1 = """
CREATE TABLE uris (
    kind TEXT NOT NULL,
    uri TEXT NOT NULL,
    dir TEXT NOT NULL,            -- the directory's name under uris/
    size INTEGER NOT NULL,        -- bytes unpacked
    digest TEXT,                  -- sha256 of the archive, when the URI named one
    last_used_ms INTEGER NOT NULL,
    refcount INTEGER NOT NULL DEFAULT 0,   -- written behind, zeroed on recovery
    installed_ms INTEGER NOT NULL,
    PRIMARY KEY (kind, uri)
);
CREATE TABLE envs (
    env_id TEXT PRIMARY KEY,
    canonical TEXT NOT NULL,
    keys TEXT NOT NULL,           -- JSON [[kind, uri], ...]
    refcount INTEGER NOT NULL DEFAULT 0,   -- written behind
    created_ms INTEGER NOT NULL
);
"""

# Version 2 keeps what recovery reads. Dropped: uris.digest (the URI itself carries it, and it
# is the archive's, so it cannot vouch for an unpacked tree), uris.refcount and the envs' rows
# (recovery zeroed and forgot them: their clients died with the agent), uris.installed_ms (never
# read). The envs' rows become one number, for recovery's summary.
_SCHEMA_V2 = """
ALTER TABLE uris RENAME TO uris_v1;
CREATE TABLE uris (
    kind TEXT NOT NULL,
    uri TEXT NOT NULL,
    dir TEXT NOT NULL,            -- the directory's name under uris/
    size INTEGER NOT NULL,        -- bytes unpacked, for the budget without a walk of the tree
    last_used_ms INTEGER NOT NULL,   -- written behind, the eviction order after a restart
    PRIMARY KEY (kind, uri)
);
INSERT INTO uris (kind, uri, dir, size, last_used_ms)
    SELECT kind, uri, dir, size, last_used_ms FROM uris_v1;
DROP TABLE uris_v1;
CREATE TABLE live (
    id INTEGER PRIMARY KEY CHECK (id = 0),   -- one row
    envs INTEGER NOT NULL         -- envs live at the last write (written behind)
);
INSERT INTO live (id, envs) SELECT 0, count(*) FROM envs;
DROP TABLE envs;
"""

# Version 3: several agents share the root. A package's row says whether it is ready or being
# installed, and by whom (a claim); each agent is a holder (its live envs move here from
# ``live``); a holder's references are rows of ``refs``. The agent that wrote version 2 is gone:
# it becomes a dead holder, reaped (and its envs counted as forgotten) by the first pass.
_SCHEMA_V3 = """
ALTER TABLE uris ADD COLUMN state TEXT NOT NULL DEFAULT 'ready';
ALTER TABLE uris ADD COLUMN holder TEXT;
CREATE TABLE holders (
    id TEXT PRIMARY KEY,
    pid INTEGER NOT NULL,
    started_ms INTEGER NOT NULL,
    live_envs INTEGER NOT NULL DEFAULT 0   -- envs it holds (written behind)
);
CREATE TABLE refs (
    holder TEXT NOT NULL,
    kind TEXT NOT NULL,
    uri TEXT NOT NULL,
    PRIMARY KEY (holder, kind, uri)
);
CREATE INDEX refs_by_uri ON refs (kind, uri);
CREATE INDEX uris_by_use ON uris (state, last_used_ms);
CREATE TABLE changes (         -- ready packages that appeared (1) or went (0), in order: how an
    gen INTEGER PRIMARY KEY AUTOINCREMENT,   -- agent's view follows the index (sweeping.sweep)
    kind TEXT NOT NULL,
    uri TEXT NOT NULL,
    ready INTEGER NOT NULL
);
CREATE TRIGGER ready_inserted AFTER INSERT ON uris WHEN new.state = 'ready'
    BEGIN INSERT INTO changes (kind, uri, ready) VALUES (new.kind, new.uri, 1); END;
CREATE TRIGGER ready_updated AFTER UPDATE OF state ON uris
    WHEN new.state = 'ready' AND old.state != 'ready'
    BEGIN INSERT INTO changes (kind, uri, ready) VALUES (new.kind, new.uri, 1); END;
CREATE TRIGGER ready_deleted AFTER DELETE ON uris WHEN old.state = 'ready'
    BEGIN INSERT INTO changes (kind, uri, ready) VALUES (old.kind, old.uri, 0); END;
INSERT INTO holders (id, pid, started_ms, live_envs)
    SELECT 'schema-v2', 0, 0, envs FROM live WHERE envs > 0;
DROP TABLE live;
"""

# version -> the script that takes a database from version-1 to version; each statement of a
# script ends a line with ";" (a trigger's body is on one line: ``statements`` splits there)
MIGRATIONS: dict[int, str] = {1: _SCHEMA_V1, 2: _SCHEMA_V2, 3: _SCHEMA_V3}


def statements(script: str) -> list[str]:
    """A migration script's statements, in order."""
    return [statement for statement in script.split(";\n") if statement.strip()]


def set_version(version: int) -> str:
    """The statement that stamps the file with ``version`` (a PRAGMA takes no parameter)."""
    return f"PRAGMA user_version={int(version)}"


# This connection's private table of the references whose drop it deferred (``index``).
CREATE_RELEASED = (
    "CREATE TEMP TABLE IF NOT EXISTS released (kind TEXT NOT NULL, uri TEXT NOT NULL,"
    " PRIMARY KEY (kind, uri)) WITHOUT ROWID"
)

# -- the file and the connection -----------------------------------------------------------
VERSION = "PRAGMA user_version"
QUICK_CHECK = "PRAGMA quick_check"
OBJECTS = "SELECT count(*) FROM sqlite_master"
JOURNAL_MODE = "PRAGMA journal_mode"
WAL = "PRAGMA journal_mode=WAL"
SYNCHRONOUS_NORMAL = "PRAGMA synchronous=NORMAL"
# a REPLACE that removes a ready row logs it gone (``changes``), as a DELETE does
RECURSIVE_TRIGGERS = "PRAGMA recursive_triggers=ON"
TEMP_IN_MEMORY = "PRAGMA temp_store=MEMORY"
BEGIN = "BEGIN"  # a read: one snapshot
BEGIN_IMMEDIATE = "BEGIN IMMEDIATE"  # a write: one writer at a time across the root's agents
COMMIT = "COMMIT"
ROLLBACK = "ROLLBACK"

# -- holders -------------------------------------------------------------------------------
REGISTER = "INSERT OR REPLACE INTO holders (id, pid, started_ms, live_envs) VALUES (?, ?, ?, 0)"
SET_LIVE_ENVS = "UPDATE holders SET live_envs = ? WHERE id = ?"
LIVE_ENVS_OF = "SELECT live_envs FROM holders WHERE id = ?"
DELETE_HOLDER = "DELETE FROM holders WHERE id = ?"
DELETE_REFS_OF = "DELETE FROM refs WHERE holder = ?"
DELETE_CLAIMS_OF = "DELETE FROM uris WHERE state = 'installing' AND holder = ?"
CLAIMED_DIRS_OF = "SELECT dir FROM uris WHERE state = 'installing' AND holder = ?"
# every holder the index names: with a row, with references, or with a claim
NAMED_HOLDERS = (
    "SELECT id FROM holders UNION SELECT holder FROM refs"
    " UNION SELECT holder FROM uris WHERE state = 'installing'"
)
OTHER_HOLDER = "SELECT 1 FROM holders WHERE id != ? LIMIT 1"

# -- one package -----------------------------------------------------------------------------
URI_ROW = "SELECT dir, size, last_used_ms, state, holder FROM uris WHERE kind = ? AND uri = ?"
READY_ROWS = "SELECT kind, uri, dir, size, last_used_ms FROM uris WHERE state = 'ready'"
CLAIM = (
    "INSERT OR REPLACE INTO uris (kind, uri, dir, size, last_used_ms, state, holder)"
    " VALUES (?, ?, ?, 0, ?, 'installing', ?)"
)
COMMIT_INSTALL = (
    "UPDATE uris SET dir = ?, size = ?, last_used_ms = ?, state = 'ready', holder = NULL"
    " WHERE kind = ? AND uri = ? AND state = 'installing' AND holder = ?"
)
DROP_CLAIM = "DELETE FROM uris WHERE kind = ? AND uri = ? AND state = 'installing' AND holder = ?"
DELETE_URI = "DELETE FROM uris WHERE kind = ? AND uri = ?"
NOTE_USED = "UPDATE uris SET last_used_ms = max(last_used_ms, ?) WHERE kind = ? AND uri = ?"
# a ready package re-measured (``index.resize``): its row only, never one made again meanwhile
RESIZE = (
    "UPDATE uris SET size = ? WHERE kind = ? AND uri = ? AND dir = ? AND state = 'ready'"
    " AND size != ?"
)

# -- references ------------------------------------------------------------------------------
TAKE_REF = "INSERT OR IGNORE INTO refs (holder, kind, uri) VALUES (?, ?, ?)"
HAS_REF = "SELECT 1 FROM refs WHERE holder = ? AND kind = ? AND uri = ?"
DROP_REF = "DELETE FROM refs WHERE holder = ? AND kind = ? AND uri = ?"
DEFER_DROP = "INSERT OR IGNORE INTO temp.released VALUES (?, ?)"
UNDEFER = "DELETE FROM temp.released WHERE kind = ? AND uri = ?"
REFERENCED_KEYS = "SELECT kind, uri FROM refs"

# -- the pass --------------------------------------------------------------------------------
# no reference but the caller's own deferred ones (one "?": the caller's holder id)
_UNREFERENCED = (
    "NOT EXISTS (SELECT 1 FROM refs r WHERE r.kind = u.kind AND r.uri = u.uri AND NOT ("
    "r.holder = ? AND EXISTS (SELECT 1 FROM temp.released x WHERE x.kind = r.kind"
    " AND x.uri = r.uri)))"
)
# (ready bytes, unused bytes); one "?": the caller's holder id
READY_AND_UNUSED_BYTES = (
    f"SELECT coalesce(sum(size), 0), coalesce(sum(CASE WHEN {_UNREFERENCED} THEN size END), 0)"
    " FROM uris u WHERE u.state = 'ready'"
)
# a page of the unused packages, least recently used first; "?": holder id, LIMIT, OFFSET
UNUSED_PAGE = (
    f"SELECT kind, uri, dir, size, last_used_ms FROM uris u WHERE u.state = 'ready'"
    f" AND {_UNREFERENCED} ORDER BY u.last_used_ms, u.kind, u.uri LIMIT ? OFFSET ?"
)


def ready_bytes_of(kinds: int) -> str:
    """The bytes of the ready packages of ``kinds`` kinds, used or not (a kind budget's
    group, as Ray's URI cache counts its size); "?": each kind."""
    marks = ", ".join("?" * kinds)
    return (
        f"SELECT coalesce(sum(size), 0) FROM uris u WHERE u.state = 'ready' AND u.kind IN ({marks})"
    )


def unused_page_of(kinds: int) -> str:
    """``UNUSED_PAGE`` of the packages of ``kinds`` kinds; "?": holder id, each kind, LIMIT,
    OFFSET."""
    marks = ", ".join("?" * kinds)
    return (
        f"SELECT kind, uri, dir, size, last_used_ms FROM uris u WHERE u.state = 'ready'"
        f" AND {_UNREFERENCED} AND u.kind IN ({marks})"
        " ORDER BY u.last_used_ms, u.kind, u.uri LIMIT ? OFFSET ?"
    )


LAST_GEN = "SELECT coalesce(max(gen), 0) FROM changes"
OLDEST_GEN = "SELECT coalesce(min(gen), 0) FROM changes"
TRIM_CHANGES = "DELETE FROM changes WHERE gen <= ?"
# each change after a gen, with the package's ready row if it is ready now
CHANGES_SINCE = (
    "SELECT c.kind, c.uri, u.dir, u.size, u.last_used_ms FROM changes c LEFT JOIN uris u"
    " ON u.kind = c.kind AND u.uri = c.uri AND u.state = 'ready'"
    " WHERE c.gen > ? ORDER BY c.gen"
)

# -- whole tables (recovery, and the readers outside the agent) ------------------------------
ALL_URIS = "SELECT kind, uri, dir, size, last_used_ms, state, holder FROM uris"
ALL_REFS = "SELECT holder, kind, uri FROM refs"
ALL_HOLDERS = "SELECT id, pid, started_ms, live_envs FROM holders"
CHANGES_BY_READY = "SELECT ready, COUNT(*) FROM changes GROUP BY ready"  # 1: ready, 0: gone
