-- Named volumes, each owned by its creator, and which jobs use them (where).
CREATE TABLE volumes (
    name       TEXT    PRIMARY KEY,
    owner_uid  INTEGER NOT NULL,
    owner      TEXT    NOT NULL,
    created_at REAL    NOT NULL
) WITHOUT ROWID;

CREATE TABLE job_volumes (
    job_id INTEGER NOT NULL REFERENCES jobs (id),
    path   TEXT    NOT NULL,
    volume TEXT    NOT NULL REFERENCES volumes (name),
    PRIMARY KEY (job_id, path)
) WITHOUT ROWID;
CREATE INDEX job_volumes_volume ON job_volumes (volume);
