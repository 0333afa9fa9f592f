-- The last line of an attempt's stderr (its last 4 KiB), kept with the end of an attempt
-- that did not succeed: a sweep's failures are clustered by it without reading a file per
-- cell. NULL for attempts that ended before this column: their clusters read the file, as
-- they did (a migration here is SQL only, so nothing reads the logs to fill it).
ALTER TABLE attempts ADD COLUMN stderr_line TEXT;
