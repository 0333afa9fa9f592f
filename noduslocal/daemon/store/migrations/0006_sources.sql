-- Uploaded sources, stored once by sha256 in the blob store; who uploaded which, so a job
-- can only unpack a source its owner sent.
CREATE TABLE sources (
    sha256     TEXT    NOT NULL,
    owner_uid  INTEGER NOT NULL,
    size       INTEGER NOT NULL,
    created_at REAL    NOT NULL,
    PRIMARY KEY (sha256, owner_uid)
) WITHOUT ROWID;
