"""Read-only tallies for operations: what /metrics counts, the users an admin sees, the
holds in force, and the newest recorded time for doctor's clock check. One statement each
on the store's reader connection."""

from __future__ import annotations

from noduslocal.daemon.store import Store


async def tallies(store: Store) -> tuple[dict[tuple[str, str], int],
                                         dict[tuple[str, str], int]]:
    """Jobs by (phase, owner), removed ones left out; ended attempts by (phase, reason)."""
    jobs = await store.fetchall("SELECT phase, owner, count(*) FROM jobs "
                                "WHERE removed_at IS NULL GROUP BY phase, owner")
    attempts = await store.fetchall(
        "SELECT phase, COALESCE(reason, ''), count(*) FROM attempts "
        "WHERE ended_at IS NOT NULL GROUP BY phase, reason")
    return ({(p, o): n for p, o, n in jobs}, {(p, r): n for p, r, n in attempts})


async def user_holds(store: Store) -> dict[int, tuple[str, float, str | None]]:
    """uid -> (the admin who held the queue, when, why)."""
    rows = await store.fetchall("SELECT uid, by_user, at, reason FROM user_holds")
    return {uid: (by, at, reason) for uid, by, at, reason in rows}


async def owner_names(store: Store) -> dict[int, str]:
    """Every uid that owns a job here, with the name it had."""
    rows = await store.fetchall("SELECT owner_uid, owner FROM jobs GROUP BY owner_uid")
    return {uid: name for uid, name in rows}


async def newest_event_time(store: Store) -> float | None:
    """The latest time among the last events recorded: bounded, as the table is not
    indexed by time (after a clock jump back, the newest rows are not the latest)."""
    rows = await store.fetchall("SELECT max(at) FROM (SELECT at FROM events "
                                "ORDER BY seq DESC LIMIT 10000)")
    return rows[0][0]
