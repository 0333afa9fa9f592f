"""The dashboard's HTML: each page and each fragment htmx polls, rendered from the daemon's
own JSON documents (pure functions of them; every value of a user's escaped). Charts and
the live log are empty elements with data- attributes that static/dashboard.js fills.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from html import escape
from typing import Any
from urllib.parse import quote, urlencode

from noduslocal.dashboard.guard import CSRF_HEADER
from noduslocal.domain.states import TERMINAL

HTMX = "/static/vendor/htmx-2.0.10.min.js"
UPLOT = "/static/vendor/uPlot-1.6.32.iife.min.js"
UPLOT_CSS = "/static/vendor/uPlot-1.6.32.min.css"
POLL = "every 2s"  # how often a page's live parts ask again
# htmx without what the CSP forbids anyway: inline indicator styles, eval, inline scripts.
HTMX_CONFIG = json.dumps({"includeIndicatorStyles": False, "allowEval": False,
                          "allowScriptTags": False, "historyCacheSize": 0,
                          "selfRequestsOnly": True})
NAV = (("jobs", "/jobs", "Jobs"), ("sweeps", "/sweeps", "Sweeps"), ("gpus", "/gpus", "GPUs"),
       ("queue", "/queue", "Queue"), ("me", "/me", "Me"))
PHASES = ("Pending", "Starting", "Running", "Suspended", "Succeeded", "Failed", "Cancelled")
SORTS = {"submit": "created_at", "start": "started_at", "wall": "duration_s"}


def e(value: Any) -> str:
    return escape("" if value is None else str(value), quote=True)


def url(base: str, /, **query: Any) -> str:
    given = {k: v for k, v in query.items() if v not in (None, "")}
    return base + ("?" + urlencode(given) if given else "")


def job_url(project: str, name: str, suffix: str = "") -> str:
    return f"/jobs/{quote(project, safe='')}/{quote(name, safe='')}{suffix}"


def sweep_url(project: str, name: str, suffix: str = "") -> str:
    return f"/sweeps/{quote(project, safe='')}/{quote(name, safe='')}{suffix}"


def when(text: str | None) -> str:
    """An API time (ISO, UTC) as this host's local time, to the second."""
    if not text:
        return ""
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone().strftime(
            "%Y-%m-%d %H:%M:%S")
    except ValueError:
        return text


def span(seconds: float | None) -> str:
    if seconds is None:
        return ""
    seconds = float(seconds)
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def size(value: float | None) -> str:
    if value is None:
        return ""
    number = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(number) < 1024 or unit == "TiB":
            return f"{number:.0f} {unit}" if unit == "B" else f"{number:.1f} {unit}"
        number /= 1024
    return str(value)


def money(value: float | None) -> str:
    return "" if value is None else f"${float(value):.4f}"


def phase_badge(phase: str | None) -> str:
    return f'<span class="phase phase-{e((phase or "").lower())}">{e(phase)}</span>'


def table(headers: Sequence[str], rows: Iterable[Sequence[str]], *, sortable: bool = False,
          empty: str = "none", cls: str = "") -> str:
    """A table of ready HTML cells (the caller escaped them)."""
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>"
                   for row in rows)
    if not body:
        body = f'<tr><td colspan="{len(headers)}" class="empty">{e(empty)}</td></tr>'
    head = "".join(f"<th>{e(h)}</th>" for h in headers)
    attrs = (' data-sortable="1"' if sortable else "") + (f' class="{e(cls)}"' if cls else "")
    return f"<table{attrs}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def layout(title: str, active: str, body: str, csrf: str, who: Mapping[str, Any]) -> str:
    nav = "".join(f'<a href="{href}"{" class=active" if key == active else ""}>{label}</a>'
                  for key, href, label in NAV)
    user = f'{e(who.get("name"))}{" (admin)" if who.get("admin") else ""}'
    headers = e(json.dumps({CSRF_HEADER: csrf}))
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="htmx-config" content="{e(HTMX_CONFIG)}">
<meta name="csrf-token" content="{e(csrf)}">
<title>{e(title)} · noduslocal</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="{UPLOT_CSS}"><link rel="stylesheet" href="/static/dashboard.css">
<script src="{HTMX}"></script><script src="{UPLOT}"></script>
<script src="/static/dashboard.js" defer></script>
</head><body hx-headers="{headers}">
<header><span class="brand">noduslocal</span><nav>{nav}</nav>
<span class="who">signed in as {user}</span></header>
<main>{body}</main></body></html>"""


def error_box(message: str) -> str:
    return f'<p class="error" role="alert">{e(message)}</p>'


def poll(fragment: str, inner: str, element_id: str, every: str = POLL) -> str:
    """A part of the page that asks FRAGMENT again every so often and swaps itself."""
    return (f'<div id="{e(element_id)}" hx-get="{e(fragment)}" hx-trigger="{every}" '
            f'hx-swap="innerHTML">{inner}</div>')


# --- jobs -------------------------------------------------------------------------------


def requested(spec: Mapping[str, Any]) -> str:
    parts = [f"{spec.get('cpu') or 0:g} CPU"]
    if spec.get("memory"):
        parts.append(size(spec["memory"]))
    gpu = spec.get("gpu")
    if gpu:
        parts.append(f"{gpu.get('count', 1)}x{gpu.get('model') or 'GPU'}")
    dist = spec.get("distributed")
    if dist:
        parts.append(f"{dist.get('nodes')} ranks")
    if spec.get("completions"):
        parts.append(f"{spec['completions']} indexes")
    return e(", ".join(parts))


def jobs_filters(filters: Mapping[str, str]) -> str:
    phase = filters.get("phase", "")
    options = "".join(f'<option value="{p}"{" selected" if p == phase else ""}>{p}</option>'
                      for p in ("", *PHASES))
    sort = filters.get("sort", "submit")
    sorts = "".join(f'<option value="{k}"{" selected" if k == sort else ""}>{k}</option>'
                    for k in SORTS)

    def field(name: str, label: str) -> str:
        return (f'<label>{label} <input name="{name}" value="{e(filters.get(name, ""))}" '
                f'size="12"></label>')

    return (f'<form class="filters" method="get" action="/jobs">'
            f'<label>phase <select name="phase">{options}</select></label>'
            f'{field("user", "user")}{field("project", "project")}'
            f'{field("label", "label K=V")}'
            f'<label>sort <select name="sort">{sorts}</select></label>'
            f'<button type="submit">Show</button></form>')


def jobs_table(jobs: list[dict[str, Any]], waits: Mapping[tuple[str, str], dict[str, Any]],
               sort: str, more: str | None, filters: Mapping[str, str]) -> str:
    key = SORTS.get(sort, "created_at")
    jobs = sorted(jobs, key=lambda j: (j.get(key) is None, j.get(key) or 0), reverse=True)
    rows = []
    for job in jobs:
        wait = waits.get((job["project"], job["name"]))
        why = job.get("hold") or (wait or {}).get("hold") or ""
        eta = when((wait or {}).get("eta"))
        pending = job["phase"] == "Pending"
        rows.append([
            f'<a href="{job_url(job["project"], job["name"])}">{e(job["name"])}</a>',
            e(job["project"]), e(job["owner"]), phase_badge(job["phase"]),
            requested(job.get("spec") or {}),
            when(job.get("created_at")), when(job.get("started_at")),
            span(job.get("duration_s")),
            e(why) + (f'<br><span class="eta">ETA {e(eta)}</span>' if pending and eta else ""),
            e(", ".join(f"{k}={v}" for k, v in (job.get("labels") or {}).items())),
        ])
    older = ""
    if more:
        older = f'<p><a href="{url("/jobs", **{**filters, "before": more})}">older →</a></p>'
    return (table(["job", "project", "user", "phase", "requested", "submitted", "started",
                   "wall", "waiting for", "labels"], rows, empty="no jobs", cls="jobs")
            + f'<p class="count">{len(rows)} jobs</p>' + older)


def jobs_page(filters: Mapping[str, str], inner: str) -> str:
    fragment = url("/fragments/jobs", **filters)
    note = ("Everyone's running and pending jobs, and your own that ended; a phase shows "
            "that phase's.")
    return (f"<h1>Jobs</h1><p class=note>{note}</p>{jobs_filters(filters)}"
            + poll(fragment, inner, "jobs"))


# --- one job ------------------------------------------------------------------------------


def job_summary(job: dict[str, Any], estimate: dict[str, Any] | None) -> str:
    spec = job.get("spec") or {}
    facts = [
        ("phase", phase_badge(job["phase"]) + (f" — {e(job.get('reason'))}"
                                               if job.get("reason") else "")),
        ("message", e(job.get("message"))), ("waiting for", e(job.get("hold"))),
        ("owner", e(job["owner"])), ("command", "<code>" + e(" ".join(
            map(str, [*(spec.get("command") or []), *(spec.get("args") or [])]))) + "</code>"),
        ("requested", requested(spec)), ("region", e(spec.get("region") or "local")),
        ("exit code", e(job.get("exit_code"))), ("signal", e(job.get("signal"))),
        ("submitted", when(job.get("created_at"))), ("started", when(job.get("started_at"))),
        ("ended", when(job.get("ended_at"))), ("wall", span(job.get("duration_s"))),
        ("attempts", e(f"{job.get('attempts')} (retries used {job.get('retries_used')} of "
                       f"{job.get('retries')})")),
        ("cost", money(job.get("cost"))),
    ]
    if estimate:
        facts.append(("estimate", e(", ".join(
            f"{k.replace('_', ' ')}: {when(v) if k.endswith('_at') else v}"
            for k, v in estimate.items() if k != "kind" and v not in (None, "", [], {})))))
    metrics = job.get("metrics") or {}
    if metrics:
        facts.append(("metrics", e(", ".join(f"{k}={v}" for k, v in metrics.items()))))
    rows = "".join(f"<tr><th>{label}</th><td>{value}</td></tr>" for label, value in facts
                   if value not in ("", "<code></code>"))
    return f'<table class="facts">{rows}</table>'


def attempts_table(attempts: list[dict[str, Any]]) -> str:
    rows = [[e(a.get("number")), e(a.get("phase")), when(a.get("started_at")),
             when(a.get("ended_at")), e(a.get("exit_code")), e(a.get("signal")),
             e(a.get("reason")), e(a.get("message")),
             e(", ".join(g if isinstance(g, str) else str(g) for g in a.get("gpus") or []))]
            for a in attempts]
    return table(["#", "phase", "started", "ended", "exit", "signal", "reason", "message",
                  "GPUs"], rows, empty="not started yet")


def timeline(events: list[dict[str, Any]]) -> str:
    rows = [[when(ev.get("at")), phase_badge(ev.get("phase")),
             e(ev.get("reason")), e(ev.get("message"))] for ev in events]
    return table(["when", "phase", "reason", "message"], rows, empty="no events yet",
                 cls="timeline")


def job_page(job: dict[str, Any], summary: str, attempts: str, events: str, since: int,
             can_control: bool) -> str:
    project, name = job["project"], job["name"]
    spec = job.get("spec") or {}
    ranks: list[tuple[str, str]] = []
    if spec.get("distributed"):
        ranks = [("all", "all ranks")] + [(str(r), f"rank {r}")
                                          for r in range(int(spec["distributed"]["nodes"]))]
    elif spec.get("completions"):
        ranks = [(str(i), f"index {i}") for i in range(int(spec["completions"]))]
    which = ""
    if ranks:
        choices = "".join(f'<option value="{k}">{e(v)}</option>' for k, v in ranks)
        which = f'<label>log of <select id="log-rank">{choices}</select></label>'
    cancel = ""
    if can_control and job["phase"] not in TERMINAL:
        cancel = (f'<button class="danger" hx-post="{job_url(project, name, "/cancel")}" '
                  f'hx-target="#action" hx-confirm="Cancel job {e(name)}?">Cancel</button>')
    return f"""<h1>Job {e(name)} <small>{e(project)}</small></h1>
<div class="actions">{cancel}<span id="action"></span></div>
{poll(job_url(project, name, "/fragments/summary"), summary, "summary")}
<h2>Timeline</h2><div id="timeline" data-events="{job_url(project, name, '/events')}"
 data-since="{since}">
{events}</div>
<h2>Attempts</h2>{poll(job_url(project, name, "/fragments/attempts"), attempts, "attempts")}
<h2>Log</h2>
<div class="logbar">{which}<label>search <input id="log-search" type="search"
 placeholder="find in the log"></label><span id="log-hits"></span>
<label><input id="log-follow" type="checkbox" checked> follow</label>
<a id="log-download" href="{job_url(project, name, '/log?download=1')}">download</a></div>
<pre id="log" data-src="{job_url(project, name, '/log')}"></pre>
<h2>Metrics</h2><div class="chart" id="metrics-chart" data-kind="metrics"
 data-src="{job_url(project, name, '/metrics')}"></div>
<h2>Outputs</h2><div id="outputs" hx-get="{job_url(project, name, '/fragments/outputs')}"
 hx-trigger="load, every 10s">…</div>
<h2>Workspace</h2><div id="workspace" hx-get="{job_url(project, name, '/fragments/files')}"
 hx-trigger="load">…</div>"""


def outputs_list(job: dict[str, Any], outputs: list[dict[str, Any]]) -> str:
    project, name = job["project"], job["name"]
    rows = []
    for out in outputs:
        link = url(job_url(project, name, "/output"), output=out.get("name"),
                   index=out.get("index"))
        got = (f'<a href="{e(link)}">download</a>' if out.get("collected")
               else e(out.get("skipped") or "not collected yet"))
        rows.append([e(out.get("name")), e(out.get("path")), e(out.get("index")),
                     size(out.get("size")), e((out.get("sha256") or "")[:12]), got])
    return table(["name", "path", "index", "size", "sha256", ""], rows,
                 empty="no outputs declared")


def files_list(job: dict[str, Any], where: str, entries: list[dict[str, Any]]) -> str:
    project, name = job["project"], job["name"]
    listing = job_url(project, name, "/fragments/files")

    def into(path: str, label: str) -> str:  # a directory, listed in place
        return (f'<a hx-get="{e(url(listing, path=path))}" hx-target="#workspace" '
                f'href="#">{e(label)}</a>')

    crumbs = [into("", "workspace")]
    so_far = ""
    for part in [p for p in where.split("/") if p]:
        so_far = f"{so_far}/{part}" if so_far else part
        crumbs.append(into(so_far, part))
    rows = []
    for entry in entries:
        path = entry.get("path") or (f"{where}/{entry['name']}" if where else entry["name"])
        if entry.get("type") == "dir":
            rows.append([into(path, entry["name"] + "/"), "", when(entry.get("mtime")), ""])
        else:
            view = url(job_url(project, name, "/file"), path=path)
            down = url(job_url(project, name, "/file"), path=path, download=1)
            rows.append([e(entry["name"]), size(entry.get("size")), when(entry.get("mtime")),
                         f'<a href="{e(view)}">view</a> <a href="{e(down)}">download</a>'])
    return ('<p class="crumbs">' + " / ".join(crumbs) + "</p>"
            + table(["name", "size", "modified", ""], rows, empty="empty"))


# --- sweeps -------------------------------------------------------------------------------


def progress(done: int, total: int) -> str:
    pct = 0 if not total else int(100 * done / total)
    return f'<progress max="{total}" value="{done}"></progress> {done}/{total} ({pct}%)'


def sweeps_table(sweeps: list[dict[str, Any]]) -> str:
    rows = [[f'<a href="{sweep_url(s["project"], s["name"])}">{e(s["name"])}</a>',
             e(s["project"]), e(s["owner"]), phase_badge(s.get("phase")),
             progress(int(s.get("done") or 0), int(s.get("cells") or 0)),
             e(", ".join(f"{k} {v}" for k, v in (s.get("counts") or {}).items())),
             money(s.get("cost")), when(s.get("created_at"))] for s in sweeps]
    return table(["sweep", "project", "user", "phase", "progress", "cells", "cost",
                  "created"], rows, empty="no sweeps")


def sweep_summary(sweep: dict[str, Any], logs: Mapping[str, str] | None = None) -> str:
    """LOGS: the last lines of each failure cluster's exemplar cell, by its job's name."""
    est = sweep.get("estimate") or {}
    best = sweep.get("best")
    facts = [
        ("phase", phase_badge(sweep.get("phase")) + (f" — {e(sweep.get('message'))}"
                                                     if sweep.get("message") else "")),
        ("progress", progress(int(sweep.get("done") or 0), int(sweep.get("cells") or 0))),
        ("cells", e(", ".join(f"{k} {v}" for k, v in (sweep.get("counts") or {}).items()))),
        ("max parallel", e(sweep.get("max_parallel"))),
        ("best", e(json.dumps(best)) if best else ""),
        ("cost so far", money(sweep.get("cost"))),
        ("estimate", e(", ".join(f"{k}: {v}" for k, v in est.items()
                                 if v not in (None, "", [], {})))),
    ]
    rows = "".join(f"<tr><th>{label}</th><td>{value}</td></tr>" for label, value in facts
                   if value)
    failures = sweep.get("failures") or []
    clusters = ""
    if failures:
        items = []
        for f in failures:
            job = f.get("exemplar_job") or ""
            link = (f' — e.g. <a href="{job_url(sweep["project"], job)}">{e(job)}</a>'
                    if job else "")
            tail = logs.get(job) if logs else None
            items.append(f"<li><b>{e(f.get('count'))}x</b> exit {e(f.get('exit_code'))}: "
                         f"{e(f.get('error'))}{link}"
                         + (f"<pre>{e(tail)}</pre>" if tail else "") + "</li>")
        clusters = "<h3>Failures</h3><ul class=failures>" + "".join(items) + "</ul>"
    return f'<table class="facts">{rows}</table>{clusters}'


def cells_table(sweep: dict[str, Any], cells: list[dict[str, Any]]) -> str:
    params = sorted({k for c in cells for k in (c.get("params") or {})})
    metrics = sorted({k for c in cells for k in (c.get("metrics") or {})})
    rows = []
    for cell in cells:
        rows.append([e(cell.get("index")),
                     f'<a href="{job_url(sweep["project"], cell["name"])}">{e(cell["name"])}</a>',
                     phase_badge(cell.get("phase")),
                     *[e((cell.get("params") or {}).get(p)) for p in params],
                     *[e((cell.get("metrics") or {}).get(m)) for m in metrics],
                     e(cell.get("exit_code")), span(cell.get("wall_s")),
                     money(cell.get("cost")), e(cell.get("region"))])
    return table(["#", "cell", "phase", *params, *metrics, "exit", "wall", "cost", "region"],
                 rows, sortable=True, empty="no cells", cls="cells")


def sweep_page(sweep: dict[str, Any], summary: str, cells: str, can_control: bool) -> str:
    project, name = sweep["project"], sweep["name"]
    cancel = ""
    if can_control and sweep.get("phase") not in TERMINAL:
        cancel = (f'<button class="danger" hx-post="{sweep_url(project, name, "/cancel")}" '
                  f'hx-target="#action" hx-confirm="Cancel sweep {e(name)}?">Cancel</button>')
    return f"""<h1>Sweep {e(name)} <small>{e(project)}</small></h1>
<div class="actions">{cancel}<span id="action"></span></div>
{poll(sweep_url(project, name, "/fragments/summary"), summary, "summary")}
<h2>Metric against each parameter</h2>
<div class="chartbar"><label>metric <select id="sweep-metric"></select></label></div>
<div id="sweep-charts" class="charts" data-kind="sweep"
 data-src="{sweep_url(project, name, '/cells.json')}"></div>
<h2>Cells</h2>{poll(sweep_url(project, name, "/fragments/cells"), cells, "cells", "every 3s")}"""


# --- GPUs, queue, me ------------------------------------------------------------------------


def gpus_table(doc: dict[str, Any]) -> str:
    rows = []
    for gpu in doc.get("gpus") or []:
        job = gpu.get("job")
        holder = ""
        if job:
            rank = f", rank {e(job['rank'])}" if job.get("rank") is not None else ""
            holder = (f'<a href="{job_url(job["project"], job["name"])}">{e(job["name"])}</a> '
                      f'({e(job["owner"])}{rank})')
        foreign = ", ".join(f"pid {p.get('pid')} {p.get('name') or ''} "
                            f"{size(p.get('used_memory') or p.get('memory'))}"
                            for p in gpu.get("processes") or [])
        health = "ok" if gpu.get("healthy") else f"unhealthy: {gpu.get('problem')}"
        rows.append([e(gpu.get("index")), e(gpu.get("name")),
                     e(f"{gpu.get('utilization') or 0}%"),
                     e(f"{size(gpu.get('memory_used'))} / {size(gpu.get('memory_total'))}"),
                     e(f"{gpu.get('power_w') or 0:.0f} W"), holder, e(foreign), e(health)
                     + (" (drained)" if gpu.get("drained") else "")])
    note = f'<p class="note">{e(doc.get("note"))}</p>' if doc.get("note") else ""
    return note + table(["#", "GPU", "util", "memory", "power", "held by",
                         "other processes", "health"], rows, empty="no GPUs on this box")


def gpus_page(inner: str) -> str:
    return ("<h1>GPUs</h1>" + poll("/fragments/gpus", inner, "gpus")
            + '<h2>The last hour</h2><div id="gpu-charts" class="charts" data-kind="gpus" '
              'data-src="/gpus/history.json"></div>')


def queue_table(doc: dict[str, Any]) -> str:
    rows = [[e(p.get("place")),
             f'<a href="{job_url(p["project"], p["name"])}">{e(p["name"])}</a>',
             e(p.get("project")), e(p.get("owner")), e(p.get("region") or "local"),
             e(f"{p.get('cpu')} CPU")
             + (e(f", {p['gpu'].get('count')} GPU") if p.get("gpu") else ""),
             e(p.get("priority")), e(p.get("hold")), when(p.get("eta")),
             when(p.get("created_at"))] for p in doc.get("pending") or []]
    shown = len(doc.get("pending") or [])
    total = doc.get("total") or 0
    more = f", the first {shown} shown" if shown < total else ""
    return (f'<p class="count">{e(total)} waiting{more}</p>'
            + table(["place", "job", "project", "user", "region", "asks", "priority",
                     "waiting for", "expected start", "submitted"], rows,
                    empty="nothing waits"))


def me_page(info: dict[str, Any], du: dict[str, Any] | None, mine: dict[str, Any] | None
            ) -> str:
    caller = info.get("caller") or {}
    cap = info.get("capacity") or {}
    facts = [("user", e(f"{caller.get('name')} (uid {caller.get('uid')})")),
             ("admin", "yes" if caller.get("admin") else "no"),
             ("box", e(f"{cap.get('cpus_used')}/{cap.get('cpus')} CPUs, "
                       f"{size(cap.get('memory_used'))}/{size(cap.get('memory'))} in use"))]
    if mine:
        for key, value in mine.items():
            if key in ("user", "uid"):
                continue
            facts.append((key.replace("_", " "), e(json.dumps(value) if isinstance(
                value, (dict, list)) else value)))
    rows = "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in facts)
    disk = ""
    if du:
        lines = []
        for user in du.get("users") or [du]:
            if isinstance(user, dict):
                lines.append(e(", ".join(f"{k}: {size(v) if isinstance(v, int) else v}"
                                         for k, v in user.items())))
        disk = "<h2>Disk</h2><p>" + "<br>".join(lines) + "</p>"
    return f'<h1>Me</h1><table class="facts">{rows}</table>{disk}'


def status_page(status: int, message: str) -> str:
    return (f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{status}</title>"
            f'<link rel="stylesheet" href="/static/dashboard.css"></head><body><main>'
            f"<h1>{status}</h1>{error_box(message)}<p><a href=/jobs>jobs</a></p></main>"
            f"</body></html>")
