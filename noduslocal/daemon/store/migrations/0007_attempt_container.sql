-- The docker container of a container job's attempt, so a restarted daemon can tell an
-- attempt whose container vanished (lost) from one whose container was never created.
ALTER TABLE attempts ADD COLUMN container_id TEXT;
