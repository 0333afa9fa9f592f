-- Sweeps: one job template run over many cells, each cell a job of its own
-- (jobs.sweep_id, jobs.cell), and the log of the sweep's own transitions.
CREATE TABLE sweeps (
    id              INTEGER PRIMARY KEY,
    project         TEXT    NOT NULL,
    name            TEXT    NOT NULL,
    owner_uid       INTEGER NOT NULL,
    owner_gid       INTEGER NOT NULL,
    owner           TEXT    NOT NULL,
    phase           TEXT    NOT NULL,
    reason          TEXT,
    message         TEXT,
    spec            TEXT    NOT NULL,
    labels          TEXT    NOT NULL DEFAULT '{}',
    cells           INTEGER NOT NULL,
    max_parallel    INTEGER NOT NULL,
    idempotency_key TEXT,
    request_hash    TEXT,
    created_at      REAL    NOT NULL,
    ended_at        REAL,
    UNIQUE (project, name)
);
CREATE UNIQUE INDEX sweeps_idempotency ON sweeps (owner_uid, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX sweeps_active ON sweeps (phase)
    WHERE phase NOT IN ('Succeeded', 'Failed', 'Cancelled');

CREATE TABLE sweep_events (
    seq      INTEGER PRIMARY KEY AUTOINCREMENT,
    sweep_id INTEGER NOT NULL REFERENCES sweeps (id),
    at       REAL    NOT NULL,
    phase    TEXT    NOT NULL,
    reason   TEXT,
    message  TEXT
);
CREATE INDEX sweep_events_sweep ON sweep_events (sweep_id, seq);

ALTER TABLE jobs ADD COLUMN sweep_id INTEGER REFERENCES sweeps (id);
ALTER TABLE jobs ADD COLUMN cell INTEGER;
CREATE INDEX jobs_sweep ON jobs (sweep_id, cell) WHERE sweep_id IS NOT NULL;
