-- Outputs a job declared, as collected after its latest attempt: the content lives in the
-- blob store under its sha256; a download is checked against the hash recorded here.
CREATE TABLE outputs (
    job_id       INTEGER NOT NULL REFERENCES jobs (id),
    name         TEXT    NOT NULL,
    attempt      INTEGER NOT NULL,
    path         TEXT    NOT NULL,
    kind         TEXT    NOT NULL,
    size         INTEGER NOT NULL,
    sha256       TEXT    NOT NULL,
    collected_at REAL    NOT NULL,
    PRIMARY KEY (job_id, name)
) WITHOUT ROWID;
