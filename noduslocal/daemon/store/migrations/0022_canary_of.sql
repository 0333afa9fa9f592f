-- A sweep's smoke canary belongs to its sweep by id, as its cells do (jobs.sweep_id): what
-- `sweep gc` frees and what a retry counts is found by identity, never by the `sweep` label
-- or a name pattern, which any user can put on a job of their own.
ALTER TABLE jobs ADD COLUMN canary_of INTEGER REFERENCES sweeps (id);
CREATE INDEX jobs_canary ON jobs (canary_of) WHERE canary_of IS NOT NULL;
-- The current smoke canary of each sweep is named in its spec.
UPDATE jobs SET canary_of = (SELECT s.id FROM sweeps s
    WHERE json_extract(s.spec, '$.smoke_job') = jobs.id)
WHERE id IN (SELECT json_extract(spec, '$.smoke_job') FROM sweeps
             WHERE json_extract(spec, '$.smoke_job') IS NOT NULL);
-- Earlier tries of a canary the sweep's retries replaced: only the sweep owner's own jobs
-- of the canary's names (sweep names hold no GLOB characters: [a-z0-9-]).
UPDATE jobs SET canary_of = (SELECT s.id FROM sweeps s
    WHERE s.project = jobs.project AND s.owner_uid = jobs.owner_uid
      AND json_extract(s.spec, '$.smoke_job') IS NOT NULL
      AND json_extract(jobs.labels, '$.sweep') = s.name
      AND (jobs.name = s.name || '-canary' OR jobs.name GLOB s.name || '-canary-r[0-9]*'))
WHERE canary_of IS NULL AND sweep_id IS NULL AND json_extract(labels, '$.sweep') IS NOT NULL;
