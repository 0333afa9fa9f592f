-- An output left out of the blob store (over a size cap, or into the disk's reserve), with
-- why: listed, and refused on download with that reason, instead of silently missing.
ALTER TABLE outputs ADD COLUMN skipped TEXT;
