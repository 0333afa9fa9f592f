-- The last value of each metric a job reported ($NODUS_METRICS_FILE), as of its last
-- attempt's end: a JSON object of name to number.
ALTER TABLE jobs ADD COLUMN metrics TEXT;
