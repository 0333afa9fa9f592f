-- Jobs, their attempts, and the append-only log of every transition.
CREATE TABLE jobs (
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
    idempotency_key TEXT,
    request_hash    TEXT,
    created_at      REAL    NOT NULL,
    started_at      REAL,
    ended_at        REAL,
    exit_code       INTEGER,
    signal          INTEGER,
    attempts        INTEGER NOT NULL DEFAULT 0,
    retries_used    INTEGER NOT NULL DEFAULT 0,
    UNIQUE (project, name)
);
CREATE UNIQUE INDEX jobs_idempotency ON jobs (owner_uid, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX jobs_active ON jobs (phase) WHERE phase NOT IN ('Succeeded', 'Failed', 'Cancelled');
CREATE INDEX jobs_owner ON jobs (owner_uid);

CREATE TABLE attempts (
    job_id      INTEGER NOT NULL REFERENCES jobs (id),
    number      INTEGER NOT NULL,
    phase       TEXT    NOT NULL,
    created_at  REAL    NOT NULL,
    started_at  REAL,
    ended_at    REAL,
    exit_code   INTEGER,
    signal      INTEGER,
    reason      TEXT,
    message     TEXT,
    stop_reason TEXT,
    PRIMARY KEY (job_id, number)
) WITHOUT ROWID;

CREATE TABLE events (
    seq     INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id  INTEGER NOT NULL REFERENCES jobs (id),
    at      REAL    NOT NULL,
    phase   TEXT    NOT NULL,
    reason  TEXT,
    message TEXT,
    attempt INTEGER
);
CREATE INDEX events_job ON events (job_id, seq);
