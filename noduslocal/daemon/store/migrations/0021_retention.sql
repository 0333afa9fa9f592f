-- Retention: when an ended job's directory (workspace, logs) and outputs were removed by
-- the retention pass (`noduslocal gc`); its row, events and attempts stay as history.
ALTER TABLE jobs ADD COLUMN collected_at REAL;
-- The pass's two questions, answered from indexes while it holds the writer: which ended
-- jobs are past the shortest keep, and whether an unfinished job names an old upload.
CREATE INDEX jobs_uncollected ON jobs (ended_at)
    WHERE collected_at IS NULL AND removed_at IS NULL AND ended_at IS NOT NULL;
CREATE INDEX jobs_source ON jobs (json_extract(spec, '$.source'), owner_uid)
    WHERE collected_at IS NULL AND removed_at IS NULL;
CREATE INDEX sources_created ON sources (created_at);
-- A source's created_at is when it was last uploaded or looked up, so a client that found
-- it uploaded has keep_ended to name it in a job.
