-- An output file's permission bits as it was collected (a tar of a directory keeps its
-- own): a download gives the file its mode back, as a workspace download does. NULL for
-- outputs collected before.
ALTER TABLE outputs ADD COLUMN mode INTEGER;
