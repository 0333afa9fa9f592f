-- `sweep rm`: an ended sweep leaves listings and frees its name (renamed to a tombstone no
-- user name can take), as `job rm` does for a job; its cells are removed with it, their
-- attempts and cost kept.
ALTER TABLE sweeps ADD COLUMN removed_at REAL;
