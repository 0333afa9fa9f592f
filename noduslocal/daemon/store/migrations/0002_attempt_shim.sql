-- The shim of each attempt, so the processes of an attempt whose shim vanished before it
-- named them can still be found (by session) and killed before a retry.
ALTER TABLE attempts ADD COLUMN shim_pid INTEGER;
ALTER TABLE attempts ADD COLUMN boot_id TEXT;
