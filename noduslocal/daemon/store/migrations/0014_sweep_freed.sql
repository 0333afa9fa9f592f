-- When `sweep gc` freed the workspaces of a finished sweep's cells (their history, logs
-- and cost stay).
ALTER TABLE sweeps ADD COLUMN freed_at REAL;
