-- What each attempt cost (GPU energy x price per kWh + GPU-hours x rate), and the job's
-- total over its ended attempts.
ALTER TABLE attempts ADD COLUMN cost REAL;
ALTER TABLE jobs ADD COLUMN cost REAL NOT NULL DEFAULT 0;
