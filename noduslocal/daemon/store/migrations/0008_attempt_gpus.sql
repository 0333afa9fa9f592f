-- The GPUs (UUIDs, JSON) an attempt was given, so a restarted daemon gives a running
-- attempt the same GPUs back before it places anything else.
ALTER TABLE attempts ADD COLUMN gpus TEXT;
