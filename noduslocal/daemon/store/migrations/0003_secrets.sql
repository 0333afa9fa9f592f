-- Secrets: per user, by name; a job keeps a snapshot of the values it was created with, so
-- its retries see the same values even if the secret is changed or removed meanwhile.
CREATE TABLE secrets (
    owner_uid  INTEGER NOT NULL,
    name       TEXT    NOT NULL,
    value      TEXT    NOT NULL,
    created_at REAL    NOT NULL,
    updated_at REAL    NOT NULL,
    PRIMARY KEY (owner_uid, name)
) WITHOUT ROWID;

CREATE TABLE job_secrets (
    job_id INTEGER NOT NULL REFERENCES jobs (id),
    env    TEXT    NOT NULL,
    value  TEXT    NOT NULL,
    PRIMARY KEY (job_id, env)
) WITHOUT ROWID;
