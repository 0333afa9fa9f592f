"""Job directories the database does not know, as after a damaged or cut WAL that lost its
newest commits: whatever still runs in them is killed (nobody could see, cancel or adopt
it), late shims are told to stand down, and what each directory proves (the job's record,
its attempts' exit records) is read so the job can be put back; one that proves too
little is kept aside for an admin, with the steps to restore it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from noduslocal.daemon.files.layout import AHEAD, OTHER, JobLayout
from noduslocal.daemon.jobs.indexed_run import JOURNAL
from noduslocal.daemon.runtime import shim
from noduslocal.daemon.runtime.attempt_dir import (
    disarm,
    inspect_settled,
    kill_leftovers,
    kill_lock_holders,
    locked,
    read_exit,
    read_pid,
)
from noduslocal.daemon.runtime.base import Exited, NeverStarted
from noduslocal.daemon.store.restore import LostAttempt, LostJob
from noduslocal.domain.jobs import JobRecord, JobSpec
from noduslocal.domain.states import AttemptPhase, Phase, Reason

log = logging.getLogger(__name__)
RECOVERED = "recovered from its directory after the database lost its records"
BOOT_RECORD = "boot_id"  # in the data directory: the boot the last daemon started in


def swap_boot_record(path: Path) -> str | None:
    """The boot id the previous daemon recorded at its start (None: none did), and this
    boot's in its place, on the disk before any job starts. A start lost with a power
    loss is no damage: an attempt's start, Running and end on this box commit without an
    fsync, and are synced within a second (store/writer.py)."""
    try:
        previous = path.read_text().strip() or None
    except FileNotFoundError:
        previous = None
    now = shim.boot_id()
    if previous == now:
        return previous
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, f"{now}\n".encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, path)
        shim.fsync_dir(str(path.parent))
    except OSError as exc:  # a full disk: the daemon starts all the same
        log.warning("recording this boot in %s failed: %s", path, exc)
        with contextlib.suppress(OSError):
            tmp.unlink()
    return previous


def power_loss_note(caught_up: list[tuple[int, str]]) -> str:
    return (f"the machine stopped while the daemon ran (a power loss or a crash): the "
            f"starts of {jobs(len(caught_up))} from its last second, which the database "
            "had not synced yet, were put back from their directories")


@dataclass
class Orphan:
    job_id: int
    path: str
    killed: int  # shims that were still running, and were killed with their jobs
    exits: list[str]  # its attempts' (and ranks') directories holding an exit record
    owner_uid: int | None  # from its record, or its workspace's owner; None: unknown
    job: LostJob | None  # what the directory proves; None: kept aside, `note` says why
    note: str  # what was found in it, in words
    recovered: str | None = None  # PROJECT/NAME once the database has it again

    def to_wire(self) -> dict[str, object]:
        return {"job_id": self.job_id, "path": self.path, "killed": self.killed,
                "exits": self.exits, "recovered": self.recovered, "note": self.note}

    @property
    def kept_aside(self) -> bool:
        """Still on disk and unknown to the database (an admin may have removed it)."""
        return self.recovered is None and os.path.isdir(self.path)


def _stop_attempt(directory: Path) -> bool:
    """Kill a live shim of the attempt and what it runs; True when one was alive."""
    with contextlib.ExitStack() as stack:
        try:  # only the locks' own failures mean "none alive here" (no such directory)
            free = stack.enter_context(locked(directory))
        except OSError:
            return False
        if free:
            if not (directory / shim.PID).exists():
                (directory / shim.ABANDONED).touch()  # a shim not started yet never runs
            return False
        pid = read_pid(directory)
        if pid is None or pid.get("boot_id") != shim.boot_id():
            return False
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid["shim_pid"], signal.SIGKILL)
        kill_leftovers(directory, pid["shim_pid"], pid.get("boot_id"))
        return True


def _started(directory: Path) -> bool:
    """Something ran there: a shim named its pids, or a container or shim wrote a log."""
    return any((directory / name).exists()
               for name in (shim.PID, shim.EXIT, shim.OUTPUT_LOG, shim.STDERR_LOG))


def find_orphans(layout: JobLayout, known: int) -> list[Orphan]:
    """Job directories above `known`, the highest job id in the database: each stopped,
    described, and judged from what it holds."""
    found = []
    for job_id in layout.job_ids_on_disk():
        if job_id <= known:
            continue
        directory = layout.job_dir(job_id)
        attempts = sorted((p for p in directory.glob("attempt-*") if p.is_dir()),
                          key=_number)
        ranks = [p for a in attempts for p in (a, *a.glob("rank-*"), *a.glob("index-*"))
                 if p.is_dir()]
        killed = sum(_stop_attempt(p) for p in ranks)
        exits = [str(p.relative_to(directory)) for p in ranks
                 if read_exit(p) is not None]
        what = []
        if killed:
            what.append(f"{killed} running attempt{'' if killed == 1 else 's'} killed")
        if exits:
            more = f" and {len(exits) - 5} more" if len(exits) > 5 else ""
            what.append(f"exit records in {', '.join(exits[:5])}{more}")
        if not killed and not exits:
            what.append("its attempts started but left no exit record"
                        if any(_started(p) for p in ranks) else "no attempt of it started")
        record = layout.read_record(job_id)
        job, why = _prove(layout, job_id, record, attempts)
        note = "; ".join(what)
        log.warning("job directory %s is not in the database (a lost write?); %s; %s",
                    directory, note, "it is put back from its record" if job else why)
        found.append(Orphan(job_id, str(directory), killed, exits,
                            _owner(record, layout, job_id), job,
                            note if job else f"{note}; {why}"))
    return found


def _number(path: Path) -> int:
    tail = path.name.partition("-")[2]
    return int(tail) if tail.isdigit() else 0


def _owner(record: dict[str, Any] | None, layout: JobLayout, job_id: int) -> int | None:
    if record is not None and isinstance(record.get("owner_uid"), int):
        return int(record["owner_uid"])
    try:  # made with its owner's uid (layout.prepare)
        return os.stat(layout.workspace(job_id)).st_uid
    except OSError:
        return None


def _prove(layout: JobLayout, job_id: int, record: dict[str, Any] | None,
           attempts: list[Path]) -> tuple[LostJob | None, str]:
    """The job its record and exit records prove, or None and why it is kept aside."""
    if record is None:
        return None, (f"it has no readable record of its job ({layout.job_dir(job_id)}: "
                      "the directory's user.noduslocal.job attribute, or job.json where "
                      "the file system has no such attributes; made before this version "
                      "wrote one, or torn), so it is kept aside for an admin")
    try:
        spec = JobSpec.from_stored(record["spec"])
        project, name = str(record["project"]), str(record["name"])
        owner = (int(record["owner_uid"]), int(record["owner_gid"]), str(record["owner"]))
        created_at = float(record["created_at"])
        labels = {str(k): str(v) for k, v in dict(record.get("labels") or {}).items()}
    except (KeyError, TypeError, ValueError) as exc:
        return None, f"its record of the job could not be read ({exc!r}), so it is kept aside"
    lost = [_attempt(directory, _number(directory), spec, created_at)
            for directory in attempts]
    phase, reason, outcome = _verdict(lost, spec, attempts)
    note = f"{RECOVERED}: {outcome}"
    if record.get("sweep_id") is not None:
        note += (f" (it was cell {record.get('cell')} of sweep {record['sweep_id']}; it "
                 "comes back as a job of its own)")
    return LostJob(job_id, project, name, *owner, spec, labels, created_at, tuple(lost),
                   phase, reason, note), ""


def _rank_dirs(directory: Path, spec: JobSpec) -> list[Path]:
    if spec.indexed is not None:
        return sorted(p for p in directory.glob("index-*") if p.is_dir())
    if spec.gang is not None:
        return [directory, *(directory / f"rank-{r}" for r in range(1, spec.gang.nodes))]
    return [directory]


def _attempt(directory: Path, number: int, spec: JobSpec, created_at: float) -> LostAttempt:
    """One attempt as its directory proves it: Exited with its exit records (a gang's first
    failing rank decides, as it ends the gang), Lost when it started but left none, else
    NotStarted."""
    ranks = _rank_dirs(directory, spec)
    exits = [read_exit(p) for p in ranks]
    pids = [read_pid(p) for p in ranks]
    armed = bool(pids) and all(p is not None and p.get("armed") is True for p in pids)
    starts = [e.started_at for e in exits if e] + [
        float(p["started_at"]) for p in pids if p and "started_at" in p]
    started_at = min(starts) if starts else None
    ended = [e for e in exits if e is not None]
    decided = _decides(ended, exits, spec)
    if decided is not None:
        return LostAttempt(number, AttemptPhase.EXITED, started_at or created_at, started_at,
                           max(e.ended_at for e in ended), decided.exit_code,
                           decided.signal, *_exit_reason(decided), armed=armed)
    if any(_started(p) for p in ranks):
        return LostAttempt(number, AttemptPhase.LOST, started_at or created_at, started_at,
                           None, None, None, Reason.LOST,
                           "no exit record: it was running when the daemon stopped, and "
                           "was stopped when it started again", armed=armed)
    return LostAttempt(number, AttemptPhase.NOT_STARTED, started_at or created_at, None,
                       None, None, None, Reason.LOST, "it never started")


def _decides(ended: list[Exited], exits: list[Exited | None],
             spec: JobSpec) -> Exited | None:
    """The exit that says how the attempt ended, or None when none does yet."""
    failed = [e for e in ended if e.exit_code != 0]
    if failed:
        return min(failed, key=lambda e: e.ended_at)
    if spec.gang is not None and spec.gang.ranks_wait_for_head:
        return exits[0]
    if ended and len(ended) == len(exits):
        return ended[0]
    return None


def _exit_reason(state: Exited) -> tuple[str, str | None]:
    if state.exit_code == 0:
        return Reason.COMPLETED, None
    if state.signal is not None:
        return Reason.SIGNALED, f"killed by signal {state.signal}"
    return Reason.ERROR, f"exited with code {state.exit_code}"


def _indexes_done(attempts: list[Path]) -> set[int]:
    done: set[int] = set()
    for directory in attempts:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            ends = json.loads((directory / JOURNAL).read_text()).get("ends", {})
            done |= {int(index) for index, code in ends.items() if code == 0}
    return done


def _verdict(lost: list[LostAttempt], spec: JobSpec,
             attempts: list[Path]) -> tuple[Phase, str, str]:
    """The job's phase, reason and outcome in words, from its last attempt: an exit record
    says Succeeded or Failed by its code; no exit record is Failed (Lost), never queued
    again (docs/decisions.md)."""
    if not lost:
        return Phase.FAILED, Reason.LOST, "it never started; create it again"
    last = lost[-1]
    if last.phase == AttemptPhase.EXITED and last.exit_code == 0:
        if spec.indexed is not None and len(
                _indexes_done(attempts) & set(range(spec.indexed.completions))) \
                < spec.indexed.completions:
            return (Phase.FAILED, Reason.LOST, f"attempt {last.number} ended before all "
                    f"{spec.indexed.completions} indexes succeeded; run it again")
        return Phase.SUCCEEDED, Reason.COMPLETED, f"attempt {last.number} exited 0"
    if last.phase == AttemptPhase.EXITED:
        return Phase.FAILED, last.reason, f"attempt {last.number} {last.message}"
    if last.phase == AttemptPhase.LOST:
        return (Phase.FAILED, Reason.LOST, f"attempt {last.number} left no exit record (it "
                "ran unobserved and was stopped when the daemon started again); run it "
                "again if it should finish")
    return Phase.FAILED, Reason.LOST, f"attempt {last.number} never started; create it again"


def jobs(count: int) -> str:
    return f"{count} job" if count == 1 else f"{count} jobs"


def lost_summary(orphans: list[Orphan], caught_up: list[tuple[int, str]],
                 jobs_dir: Path) -> str:
    """The start's one ERROR line about them."""
    recovered = sum(1 for o in orphans if o.recovered)
    kept = len(orphans) - recovered
    text = (f"the database had lost the records of {jobs(len(orphans))} whose directories "
            f"remain (a damaged or cut WAL: commits it had acknowledged are gone): "
            f"{recovered} recovered from their directories")
    if kept:
        text += (f", {kept} kept aside in {jobs_dir} for an admin (`noduslocal doctor` "
                 "lists them; docs/admin.md, 'Lost jobs', says how to restore them)")
    if caught_up:
        text += (f"; and the starts of {jobs(len(caught_up))} it knows, put back from their "
                 "directories")
    return text + "; look at the disk (dmesg) and take a fresh `noduslocal admin backup`"


def lost_problems(orphans: list[Orphan], caught_up: list[tuple[int, str]]) -> list[str]:
    """What /v1/health says while they matter: the daemon runs on a database that lost
    acknowledged commits (until it restarts), or keeps directories it could not put
    back (until an admin removes them). Words for everyone: no paths."""
    recovered = sum(1 for o in orphans if o.recovered)
    kept = sum(1 for o in orphans if o.kept_aside)
    if not recovered and not kept and not caught_up:
        return []
    starts = (f", and the starts of {jobs(len(caught_up))} it knows were put back"
              if caught_up else "")
    return [f"the database had lost the records of {jobs(len(orphans))} when the daemon "
            f"started (a damaged or cut WAL): {recovered} were recovered from their "
            f"directories, {kept} are kept aside for an admin{starts}; `noduslocal doctor` "
            "says what to do"]


def lost_view(orphans: list[Orphan], caught_up: list[tuple[int, str]], uid: int,
              admin: bool) -> dict[str, Any]:
    """For `noduslocal doctor`, to anyone: how many, which of the caller's came back, how
    many are kept aside (an admin sees each directory in /v1/info's `orphans`)."""
    kept = [o for o in orphans if o.kept_aside]
    back = [(o.owner_uid, o.recovered) for o in orphans if o.recovered] + list(caught_up)
    return {"found": len(orphans),
            "recovered": sum(1 for o in orphans if o.recovered),
            "starts": len(caught_up),
            "kept_aside": len(kept),
            "yours": [name for owner, name in back if admin or owner == uid][:20],
            "yours_kept_aside": sum(1 for o in kept if o.owner_uid == uid),
            "kept_aside_paths": [f"{o.path} ({o.note})" for o in kept][:20] if admin else []}


def _shows_start(directory: Path) -> bool:
    """An attempt directory something was started in (prepare_ahead() makes an empty one
    for a job about to start: that one shows nothing)."""
    # A shim past its lock reserved its records (the Python shim's pid record, the
    # compiled one's single file for both), or said it had no room for them (the compiled
    # one leaves no LOCK).
    return ((directory / shim.LOCK).exists() or (directory / f".{shim.PID}.tmp").exists()
            or (directory / f".{shim.EXIT}.tmp").exists()
            or (directory / shim.NO_ROOM).exists() or (directory / JOURNAL).exists()
            or _started(directory) or any(directory.glob("rank-*"))
            or any(directory.glob("index-*")))


def lost_starts(layout: JobLayout, job: JobRecord) -> tuple[LostAttempt | None,
                                                            list[LostAttempt]]:
    """Attempts of a job the database knows that started after its last commit about the
    job (an attempt's start is committed before its directory is made, so a directory
    beyond the database's count proves a lost commit): the end of the attempt the
    database thinks current, when a later one ran, and each later one as it proves.
    A pending job's next attempt that an armed start prepared but never ran comes back
    as one that did not start (unstarted_next())."""
    directory = layout.job_dir(job.id)
    numbers = sorted(n for p in directory.glob("attempt-*")
                     if (n := _number(p)) > job.attempts and _shows_start(p))
    if not numbers and job.phase == Phase.PENDING:
        unstarted = unstarted_next(layout, job)
        if unstarted is not None:
            return None, [unstarted]
        # A shim that had taken its directory's lock has written its records meanwhile.
        if _shows_start(layout.attempt_dir(job.id, job.attempts + 1)):
            numbers = [job.attempts + 1]
    if not numbers:
        return None, []
    if numbers != list(range(job.attempts + 1, job.attempts + 1 + len(numbers))):
        log.warning("job %s: attempts %s on disk are not the ones after its %d recorded; "
                    "left as the database has it", job.name, numbers, job.attempts)
        return None, []
    current = None
    if job.attempts and job.phase != Phase.PENDING:
        current = _attempt(layout.attempt_dir(job.id, job.attempts), job.attempts,
                           job.spec, job.created_at)
    return current, [_later(layout.attempt_dir(job.id, n), n, job) for n in numbers]


def _later(directory: Path, number: int, job: JobRecord) -> LostAttempt:
    """An attempt beyond the database's count, as its directory proves it."""
    lost = _attempt(directory, number, job.spec, job.created_at)
    if lost.phase == AttemptPhase.NOT_STARTED and (directory / shim.ABANDONED).exists():
        # Marked by a recovery killed before its commit (unstarted_next()), whose lock
        # file shows a start: nothing ran, and no commit of the database's was lost.
        return _abandoned(number)
    return lost


UNSTARTED = ("the daemon stopped before this attempt's start was committed, and it never "
             "ran; queued again")


def unstarted_next(layout: JobLayout, job: JobRecord) -> LostAttempt | None:
    """The next attempt of a pending job when its directory exists and nothing started in
    it: an armed start makes it before its commit (runner.py's _launch_armed), and a kill
    -9 in between leaves it. Its prepare() would refuse it (File exists, which failed the
    job), and the shim let go may yet open it: so its locks are taken and it is marked
    abandoned (a shim that comes later exits without running anything) and its number is
    spent as an attempt that did not start; the next one gets a directory of its own.
    None when there is no such directory, a shim started in it meanwhile, it belongs to
    another database's job, or it is the empty first attempt prepare_ahead() makes, which
    its prepare() takes as it is."""
    number = job.attempts + 1
    directory = layout.attempt_dir(job.id, number)
    if not directory.is_dir():
        return None
    if number == 1 and (look := layout.first_look(job)) != OTHER:
        if look == AHEAD:
            _fence_ahead(directory, job)  # taken as it is, once no late shim can run there
        return None  # or not this job's
    state = inspect_settled(directory)  # under its locks: free, it is marked abandoned
    if not isinstance(state, NeverStarted) or state.certain:
        return None  # started (or said it had no room): lost_starts() reads its records
    return _abandoned(number)


FENCE_WAIT = 5.0  # seconds a shim may hold a made-ahead attempt's lock without its records


def _fence_ahead(directory: Path, job: JobRecord) -> None:
    """A made-ahead first attempt the next start takes as it is: its go mark removed under
    its locks (attempt_dir.disarm), so that a shim the last daemon let go just before it
    died, still on its way to the lock, runs nothing there; that start is made again, once.
    A shim that holds the lock started: waited for until its records show it, for
    lost_starts() to read them. One that holds it FENCE_WAIT seconds with none has run
    nothing yet, and would run the job beside the next start: it is killed."""
    if _settles(directory):
        return
    killed = kill_lock_holders(directory)
    log.warning("job %s: a shim held its first attempt's directory for %.0f s without "
                "starting it (let go just before the last daemon died); killed %s so that "
                "the attempt runs once", job.name, FENCE_WAIT, killed or "nothing")
    if not _settles(directory):
        raise RuntimeError(f"{directory}: its lock is still held after its holders "
                           f"{killed} were killed")


def _settles(directory: Path) -> bool:
    """The go mark removed, or the start of a shim holding the lock shown, within
    FENCE_WAIT."""
    deadline = time.monotonic() + FENCE_WAIT
    while not (disarm(directory) or _shows_start(directory)):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _abandoned(number: int) -> LostAttempt:
    """An attempt marked abandoned under its locks with nothing started in it: nothing
    can start there any more, and it is no loss of the database's."""
    now = time.time()
    return LostAttempt(number, AttemptPhase.NOT_STARTED, now, None, now, None, None,
                       Reason.REQUEUED, UNSTARTED, armed=True, abandoned=True)
