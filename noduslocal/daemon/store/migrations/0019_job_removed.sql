-- `job rm`: an ended job leaves listings and frees its name (renamed to a tombstone no
-- user name can take), while its attempts stay for fair share and its cost history.
ALTER TABLE jobs ADD COLUMN removed_at REAL;
