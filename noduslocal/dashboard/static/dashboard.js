// noduslocal dashboard: what the server-rendered pages leave to the browser. The live log
// (server-sent events, search, follow), a job's timeline as its events come, sortable
// tables that stay sorted across htmx's swaps, and uPlot charts (GPUs over the last hour,
// a sweep's metric against each parameter, a job's reported metrics).
"use strict";

(function () {
  const sorted = {}; // table class -> [column, descending]

  // --- tables ------------------------------------------------------------------------
  function cellValue(row, column) {
    const text = (row.children[column] || {}).textContent || "";
    const number = parseFloat(text.replace(/[$%s]/g, ""));
    return Number.isNaN(number) || !/^[\s$]*-?[0-9.]/.test(text) ? text.toLowerCase() : number;
  }

  function sortTable(table, column, descending) {
    const body = table.tBodies[0];
    const rows = Array.from(body.rows).filter((r) => !r.querySelector(".empty"));
    rows.sort((a, b) => {
      const x = cellValue(a, column), y = cellValue(b, column);
      const order = typeof x === typeof y ? (x < y ? -1 : x > y ? 1 : 0)
        : (typeof x === "number" ? -1 : 1);
      return descending ? -order : order;
    });
    rows.forEach((r) => body.appendChild(r));
    table.querySelectorAll("th").forEach((th, i) => {
      th.dataset.sorted = i === column ? (descending ? "desc" : "asc") : "";
    });
  }

  function setUpTables(root) {
    root.querySelectorAll("table[data-sortable]").forEach((table) => {
      const key = table.className || "table";
      table.querySelectorAll("th").forEach((th, i) => {
        th.addEventListener("click", () => {
          const [column, descending] = sorted[key] || [-1, false];
          sorted[key] = [i, column === i ? !descending : false];
          sortTable(table, ...sorted[key]);
        });
      });
      if (sorted[key]) sortTable(table, ...sorted[key]);
    });
  }

  // --- the live log ------------------------------------------------------------------
  const MAX_LINES = 20000;

  function setUpLog() {
    const log = document.getElementById("log");
    if (!log) return;
    const search = document.getElementById("log-search");
    const hits = document.getElementById("log-hits");
    const follow = document.getElementById("log-follow");
    const rank = document.getElementById("log-rank");
    const download = document.getElementById("log-download");
    let source = null;

    function matches(line) {
      const needle = search.value;
      return needle !== "" && line.textContent.toLowerCase().includes(needle.toLowerCase());
    }

    function mark() {
      let count = 0, first = null;
      for (const line of log.children) {
        const hit = matches(line);
        line.classList.toggle("hit", hit);
        if (hit) { count += 1; first = first || line; }
      }
      hits.textContent = search.value ? `${count} found` : "";
      log.dataset.hits = String(count);
      if (first && !follow.checked) first.scrollIntoView({ block: "center" });
    }

    function which() {
      if (!rank) return "";
      const value = rank.value;
      const spec = rank.querySelector("option").textContent.startsWith("index")
        ? "index" : "rank";
      return `${spec}=${encodeURIComponent(value)}`;
    }

    function connect() {
      if (source) source.close();
      log.textContent = "";
      log.dataset.lines = "0";
      log.dataset.ended = "";
      const query = which();
      download.href = `${log.dataset.src}?download=1${query ? "&" + query : ""}`;
      source = new EventSource(`${log.dataset.src}${query ? "?" + query : ""}`);
      source.onmessage = (event) => {
        const line = document.createElement("span");
        line.className = "line";
        line.textContent = event.data + "\n";
        if (matches(line)) line.classList.add("hit");
        log.appendChild(line);
        while (log.childElementCount > MAX_LINES) log.removeChild(log.firstChild);
        log.dataset.lines = String(log.childElementCount);
        if (search.value) mark();
        if (follow.checked) log.scrollTop = log.scrollHeight;
      };
      source.addEventListener("end", () => {
        source.close();
        log.dataset.ended = "1";
      });
      source.onerror = () => {
        // The server closed it (the job ended) or refused it: no retry loop either way.
        if (source.readyState === EventSource.CLOSED || log.dataset.ended) source.close();
      };
    }

    search.addEventListener("input", mark);
    if (rank) rank.addEventListener("change", connect);
    connect();
  }

  // --- a job's timeline as its events come ------------------------------------------------
  function stamp(iso) {  // as the server writes times: local, YYYY-MM-DD HH:MM:SS
    const at = iso ? new Date(iso) : null;
    if (!at || Number.isNaN(at.getTime())) return "";
    const two = (n) => String(n).padStart(2, "0");
    return `${at.getFullYear()}-${two(at.getMonth() + 1)}-${two(at.getDate())} ` +
      `${two(at.getHours())}:${two(at.getMinutes())}:${two(at.getSeconds())}`;
  }

  function setUpTimeline() {
    const box = document.getElementById("timeline");
    if (!box) return;
    const since = box.dataset.since || "0";
    const source = new EventSource(`${box.dataset.events}?since=${encodeURIComponent(since)}`);
    source.addEventListener("job", (message) => {
      let event;
      try { event = JSON.parse(message.data); } catch (_) { return; }
      const body = box.querySelector("tbody");
      const empty = body.querySelector(".empty");
      if (empty) empty.parentElement.remove();
      const row = document.createElement("tr");
      for (const text of [stamp(event.at), event.phase, event.reason, event.message]) {
        const cell = document.createElement("td");
        cell.textContent = text == null ? "" : String(text);
        row.appendChild(cell);
      }
      const badge = document.createElement("span");
      badge.className = `phase phase-${String(event.phase || "").toLowerCase()}`;
      badge.textContent = event.phase || "";
      row.children[1].replaceChildren(badge);
      body.appendChild(row);
    });
  }

  // --- charts -----------------------------------------------------------------------------
  const COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2"];

  function chart(box, title, xs, series, options) {
    const width = Math.max(300, Math.min(box.clientWidth || 600, 900));
    const opts = {
      title,
      width,
      height: 220,
      scales: Object.assign({ x: { time: options.time !== false } }, options.scales || {}),
      // Only what is set: a key given as undefined would override uPlot's default (the
      // series' scale would be none, and auto-ranged apart from its axis).
      series: [{ label: options.xLabel || "time" }].concat(series.map((s, i) => {
        const one = { label: s.label, stroke: COLORS[i % COLORS.length] };
        if (options.points) {
          one.paths = () => null;
          one.points = { show: true, size: 8, fill: COLORS[i % COLORS.length] };
        } else {
          one.points = { show: false };
        }
        return one;
      })),
    };
    if (options.axes) opts.axes = options.axes;
    return new uPlot(opts, [xs].concat(series.map((s) => s.values)), box);
  }

  async function fetchJson(src) {
    const response = await fetch(src, { credentials: "same-origin" });
    if (!response.ok) throw new Error(`${src}: HTTP ${response.status}`);
    return response.json();
  }

  function say(box, text) {
    box.textContent = "";
    const p = document.createElement("p");
    p.className = "note";
    p.textContent = text;
    box.appendChild(p);
  }

  // The last hour of each GPU: the whole history once, then only what is newer (`since`),
  // appended, and what fell out of the hour dropped.
  const gpuState = { since: null, gpus: new Map(), plots: new Map(), doc: null };
  const GPU_COLUMNS = ["t", "utilization", "memory_used", "power", "allocated"];

  function gpuSeries(gpu) {
    const total = gpu.memory_total || 0;
    return [
      gpu.t,
      gpu.utilization,
      gpu.memory_used.map((v) => (v == null || !total ? null : Math.round(1000 * v / total) / 10)),
      gpu.allocated.map((v) => (v == null ? null : (v ? 100 : 0))),
    ];
  }

  async function drawGpus(box) {
    const since = gpuState.since;
    const doc = await fetchJson(box.dataset.src + (since != null ? `?since=${since}` : ""));
    const window = doc.window || 3600;
    for (const fresh of doc.gpus || []) {
      const known = gpuState.gpus.get(fresh.uuid);
      if (!known || since == null) {
        gpuState.gpus.set(fresh.uuid, fresh);
      } else {
        for (const column of GPU_COLUMNS) known[column] = known[column].concat(fresh[column] || []);
        known.memory_total = fresh.memory_total;
      }
      const gpu = gpuState.gpus.get(fresh.uuid);
      const newest = gpu.t.length ? gpu.t[gpu.t.length - 1] : null;
      if (newest != null) {
        gpuState.since = Math.max(gpuState.since || 0, newest);
        const keep = gpu.t.findIndex((t) => t > newest - window);
        if (keep > 0) for (const column of GPU_COLUMNS) gpu[column] = gpu[column].slice(keep);
      }
    }
    let points = 0;
    const gpus = Array.from(gpuState.gpus.values()).sort((a, b) => a.index - b.index);
    if (!gpus.length || gpus.every((g) => !g.t.length)) {
      if (!box.querySelector("p.note")) {
        say(box, doc.note || (doc.source === "simulated"
          ? "simulated GPUs report no readings" : "no GPU readings yet"));
      }
    }
    for (const gpu of gpus) {
      if (!gpu.t.length) continue;
      box.querySelectorAll("p.note").forEach((n) => n.remove());
      let plot = gpuState.plots.get(gpu.uuid);
      if (!plot) {
        const one = document.createElement("div");
        one.className = "chart";
        one.dataset.gpu = String(gpu.index);
        box.appendChild(one);
        plot = chart(one, `GPU ${gpu.index} ${gpu.name || ""}`, gpu.t, [
          { label: "utilization %", values: gpu.utilization },
          { label: "memory %", values: [] },
          { label: "held by a job", values: [] },
        ], { scales: { y: { range: [0, 100] } } });
        gpuState.plots.set(gpu.uuid, plot);
      }
      plot.setData(gpuSeries(gpu));
      plot.root.parentElement.dataset.points = String(gpu.t.length);
      points += gpu.t.length;
    }
    box.dataset.points = String(points);
  }

  function numeric(values) {
    return values.every((v) => v !== "" && v != null && !Number.isNaN(Number(v)));
  }

  function metricOf(cell, metric) {
    if (metric === "wall_s" || metric === "cost") return cell[metric];
    return (cell.metrics || {})[metric];
  }

  async function drawSweep(box) {
    const doc = await fetchJson(box.dataset.src);
    const cells = doc.cells || [];
    const select = document.getElementById("sweep-metric");
    const metrics = Array.from(new Set(cells.flatMap((c) => Object.keys(c.metrics || {}))))
      .sort().concat(["wall_s", "cost"]);
    const best = doc.best && doc.best.metric;
    if (!select.options.length || select.options.length !== metrics.length) {
      const chosen = select.value || (best && metrics.includes(best) ? best : metrics[0]);
      select.textContent = "";
      for (const m of metrics) {
        const option = document.createElement("option");
        option.value = m;
        option.textContent = m;
        select.appendChild(option);
      }
      select.value = chosen;
    }
    const metric = select.value;
    const done = cells.filter((c) => ["Succeeded", "Failed", "Cancelled"].includes(c.phase)
      && metricOf(c, metric) != null);
    const params = Array.from(new Set(cells.flatMap((c) => Object.keys(c.params || {})))).sort();
    box.textContent = "";
    box.dataset.points = String(done.length);
    box.dataset.metric = metric;
    if (!params.length) say(box, "the cells have no parameters to compare");
    for (const param of params) {
      const one = document.createElement("div");
      one.className = "chart";
      one.dataset.param = param;
      box.appendChild(one);
      const raw = done.map((c) => (c.params || {})[param]);
      const isNumber = numeric(raw);
      const categories = isNumber ? [] : Array.from(new Set(raw.map(String))).sort();
      const pairs = done.map((c, i) => [isNumber ? Number(raw[i])
        : categories.indexOf(String(raw[i])), Number(metricOf(c, metric))])
        .sort((a, b) => a[0] - b[0]);
      const axes = isNumber ? undefined : [
        { values: (_, ticks) => ticks.map((t) => (Number.isInteger(t) ? categories[t] || "" : "")) },
        {},
      ];
      chart(one, `${metric} against ${param}`, pairs.map((p) => p[0]),
        [{ label: metric, values: pairs.map((p) => p[1]) }],
        { time: false, points: true, xLabel: param, axes,
          scales: isNumber ? {} : { x: { time: false, range: [-0.5, Math.max(categories.length - 0.5, 0.5)] } } });
      one.dataset.points = String(pairs.length);
    }
  }

  async function drawMetrics(box) {
    const doc = await fetchJson(box.dataset.src);
    const names = Object.keys(doc.series || {});
    box.textContent = "";
    box.dataset.points = String((doc.x || []).length);
    if (!names.length) {
      say(box, "no metrics reported (a job appends JSON lines to $NODUS_METRICS_FILE)");
      return;
    }
    chart(box, "reported metrics", doc.x, names.map((n) => ({ label: n, values: doc.series[n] })),
      { time: false, xLabel: "step" });
  }

  const DRAW = { gpus: drawGpus, sweep: drawSweep, metrics: drawMetrics };
  const EVERY = { gpus: 5000, sweep: 3000, metrics: 5000 };

  function setUpCharts() {
    document.querySelectorAll("[data-kind]").forEach((box) => {
      const draw = DRAW[box.dataset.kind];
      if (!draw) return;
      const again = () => draw(box).catch((error) => say(box, String(error.message || error)));
      again();
      setInterval(() => { if (!document.hidden) again(); }, EVERY[box.dataset.kind]);
      if (box.dataset.kind === "sweep") {
        document.getElementById("sweep-metric").addEventListener("change", again);
      }
    });
  }

  document.addEventListener("DOMContentLoaded", () => {
    setUpTables(document);
    setUpLog();
    setUpTimeline();
    setUpCharts();
  });
  document.addEventListener("htmx:afterSettle", (event) => setUpTables(event.target));
  // A tab nobody looks at asks nothing: its polls resume when it is shown again.
  document.addEventListener("htmx:beforeRequest", (event) => {
    if (document.hidden && event.detail.requestConfig.verb === "get") event.preventDefault();
  });
})();
