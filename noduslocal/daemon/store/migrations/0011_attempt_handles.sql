-- One runtime-neutral handle per rank of an attempt (a JSON list of {runtime, ref, rank,
-- boot}) in place of a column per runtime: the shim's pid and boot, the container id.
ALTER TABLE attempts ADD COLUMN handles TEXT;
UPDATE attempts SET handles = json_array(json_object(
    'runtime', 'docker', 'ref', container_id, 'rank', 0, 'boot', NULL))
WHERE container_id IS NOT NULL;
UPDATE attempts SET handles = json_array(json_object(
    'runtime', 'process', 'ref', CAST(shim_pid AS TEXT), 'rank', 0, 'boot', boot_id))
WHERE container_id IS NULL AND shim_pid IS NOT NULL;
ALTER TABLE attempts DROP COLUMN container_id;
ALTER TABLE attempts DROP COLUMN shim_pid;
ALTER TABLE attempts DROP COLUMN boot_id;
