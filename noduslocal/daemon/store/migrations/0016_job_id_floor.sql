-- Job ids are never given twice. After a torn write (a WAL truncated by a crash) the
-- database can forget its newest jobs while their directories remain; the daemon sets this
-- floor at each start from the highest job directory on disk, and new ids start above it.
CREATE TABLE job_id_floor (floor INTEGER NOT NULL);
INSERT INTO job_id_floor (floor) VALUES (0);
