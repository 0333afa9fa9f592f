-- `noduslocal admin hold USER`: that user's pending jobs start no more until an admin
-- releases them (what runs goes on). Kept here so a hold outlives a restart.
CREATE TABLE user_holds (
    uid     INTEGER PRIMARY KEY,
    by_user TEXT NOT NULL,
    at      REAL NOT NULL,
    reason  TEXT
);
