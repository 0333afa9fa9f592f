-- `sweep retry` runs a failed cell again as a new job; the old one stays, as history, and
-- names the job that took its place.
ALTER TABLE jobs ADD COLUMN superseded_by INTEGER REFERENCES jobs (id);
DROP INDEX jobs_sweep;
CREATE INDEX jobs_sweep ON jobs (sweep_id, cell) WHERE sweep_id IS NOT NULL
    AND superseded_by IS NULL;
