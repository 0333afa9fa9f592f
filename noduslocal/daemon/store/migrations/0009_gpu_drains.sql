-- GPUs an admin drained: running work finishes there, nothing new lands, across restarts.
CREATE TABLE gpu_drains (
    uuid TEXT PRIMARY KEY,
    by_user TEXT NOT NULL,
    at REAL NOT NULL
);
