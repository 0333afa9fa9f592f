-- An indexed job keeps one row per output and index (each index's output is collected as
-- it ends); -1 is an ordinary job's. SQLite cannot change a primary key in place.
CREATE TABLE outputs_by_index (
    job_id       INTEGER NOT NULL REFERENCES jobs (id),
    name         TEXT    NOT NULL,
    idx          INTEGER NOT NULL DEFAULT -1,
    attempt      INTEGER NOT NULL,
    path         TEXT    NOT NULL,
    kind         TEXT    NOT NULL,
    size         INTEGER NOT NULL,
    sha256       TEXT    NOT NULL,
    collected_at REAL    NOT NULL,
    skipped      TEXT,
    PRIMARY KEY (job_id, name, idx)
) WITHOUT ROWID;
INSERT INTO outputs_by_index (job_id, name, idx, attempt, path, kind, size, sha256,
                              collected_at, skipped)
    SELECT job_id, name, -1, attempt, path, kind, size, sha256, collected_at, skipped
    FROM outputs;
DROP TABLE outputs;
ALTER TABLE outputs_by_index RENAME TO outputs;
