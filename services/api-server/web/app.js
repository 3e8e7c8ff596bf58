// The Primus dashboard: Jobs, Datasets and Metrics of one API server, live through its
// Watch (server-sent events on /api/v1/watch). The bearer token stays in this tab's
// sessionStorage; every call carries it.
"use strict";

const TOKEN_KEY = "primus-token";
const MAIN = document.getElementById("main");
/// Charts drawn first on a Job's page; other series follow by name.
const FIRST_SERIES = ["auc", "logloss", "calibration", "samples_per_second"];
/// Points kept per series in the browser, as the master keeps them.
const MAX_POINTS = 720;

let token = sessionStorage.getItem(TOKEN_KEY);
/// Aborts the current page's watches and timers when the page changes.
let page = new AbortController();

class Refused extends Error {}

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else node.setAttribute(key, value);
  }
  for (const child of children) {
    if (child !== null && child !== undefined) node.append(child);
  }
  return node;
}

function age(unixMs) {
  const s = Math.max(0, Math.round((Date.now() - unixMs) / 1000));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m${s % 60 ? (s % 60) + "s" : ""}`;
  if (s < 86400) return `${Math.floor(s / 3600)}h${Math.floor((s % 3600) / 60)}m`;
  return `${Math.floor(s / 86400)}d${Math.floor((s % 86400) / 3600)}h`;
}

function number(value, digits = 0) {
  return value === null || value === undefined ? "" : Number(value).toLocaleString("en-US", {
    minimumFractionDigits: digits, maximumFractionDigits: digits,
  });
}

function banner(message) {
  const node = document.getElementById("banner");
  node.textContent = message || "";
  node.hidden = !message;
}

async function api(path) {
  const response = await fetch(path, { headers: { Authorization: `Bearer ${token}` } });
  if (response.status === 401) throw new Refused("the API server refused the token");
  const body = await response.json();
  if (!response.ok) {
    const error = new Error(body.error || response.statusText);
    error.code = body.code;
    throw error;
  }
  return body;
}

/// Follows changes from `since` until the page changes: onChange(type, resource) per
/// change; onRelist() when the server no longer holds `since` (list again, watch anew).
async function watch(params, since, onChange, onRelist) {
  const signal = page.signal;
  while (!signal.aborted) {
    const query = new URLSearchParams({ ...params, since: String(since) });
    try {
      const response = await fetch(`/api/v1/watch?${query}`, {
        headers: { Authorization: `Bearer ${token}` }, signal,
      });
      if (response.status === 401) throw new Refused("the API server refused the token");
      if (!response.ok) {
        const body = await response.json();
        if (body.code === "OutOfRange") return onRelist();
        throw new Error(body.error);
      }
      const reader = response.body.getReader();
      const decoder = new TextDecoder();
      let buffered = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffered += decoder.decode(value, { stream: true });
        let end;
        while ((end = buffered.indexOf("\n\n")) >= 0) {
          const message = parseEvent(buffered.slice(0, end));
          buffered = buffered.slice(end + 2);
          if (!message) continue;
          if (message.type === "error") {
            const error = JSON.parse(message.data);
            if (error.code === "OutOfRange") return onRelist();
            throw new Error(error.error);
          }
          since = Number(message.id);
          onChange(message.type, JSON.parse(message.data));
        }
      }
    } catch (error) {
      if (signal.aborted) return;
      if (error instanceof Refused) return signOut(error.message);
      banner(`watch: ${error.message}; reconnecting`);
    }
    await new Promise((resolve) => setTimeout(resolve, 1000));
  }
}

function parseEvent(text) {
  const message = { type: "message", data: "", id: null };
  for (const line of text.split("\n")) {
    if (line.startsWith(":")) continue;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
    if (field === "event") message.type = value;
    else if (field === "data") message.data += (message.data ? "\n" : "") + value;
    else if (field === "id") message.id = value;
  }
  return message.id === null && message.type !== "error" ? null : message;
}

function every(ms, tick) {
  const timer = setInterval(tick, ms);
  page.signal.addEventListener("abort", () => clearInterval(timer));
}

// ---- Jobs ----

/// `12 / 28 tasks (3 running, 13 pending)`, or "-" for a Job without batch tasks.
function taskText(status) {
  const t = status?.progress?.tasks;
  if (!t) return "-";
  const parts = [`${t.running} running`, `${t.pending} pending`];
  if (t.failed) parts.push(`${t.failed} failed`);
  return `${number(t.succeeded)} / ${number(t.total)} tasks (${parts.join(", ")})`;
}

function progressCell(status) {
  const fraction = status?.progress?.fraction;
  if (fraction === null || fraction === undefined) return el("td", { class: "muted", text: "-" });
  const percent = Math.round(fraction * 1000) / 10;
  const bar = el("span", { class: "bar" }, el("span", { style: `width:${percent}%` }));
  return el("td", {}, bar, `${percent}%`);
}

function jobRow(job) {
  const status = job.status || {};
  const progress = status.progress || {};
  const labels = Object.entries(job.metadata.labels || {}).map(([k, v]) => `${k}=${v}`).join(", ");
  return el("tr", { "data-job": job.metadata.name },
    el("td", {}, el("a", { href: `#/jobs/${encodeURIComponent(job.metadata.name)}`, text: job.metadata.name })),
    el("td", {}, el("span", { class: `phase ${status.phase || ""}`, text: status.phase || "" })),
    progressCell(status),
    el("td", { class: "num", text: number(progress.samples_per_second) }),
    el("td", { class: "num", text: progress.auc === undefined || progress.auc === null ? "" : number(progress.auc, 4) }),
    el("td", { class: "num", "data-created": String(job.metadata.created_unix_ms), text: age(job.metadata.created_unix_ms) }),
    el("td", { class: "muted", text: labels }),
  );
}

async function jobsPage(params) {
  const labels = params.get("labels") || "";
  const filter = el("input", { value: labels, placeholder: "labels: team=ads,env=prod", id: "label-filter" });
  filter.addEventListener("change", () => {
    location.hash = filter.value ? `#/jobs?labels=${encodeURIComponent(filter.value)}` : "#/jobs";
  });
  const body = el("tbody");
  const table = el("table", { id: "jobs" },
    el("thead", {}, el("tr", {}, ...["Job", "Phase", "Progress", "Samples/s", "AUC", "Age", "Labels"].map((h) => el("th", { text: h })))),
    body);
  MAIN.replaceChildren(el("h1", { text: "Jobs" }), el("div", { class: "filter" }, filter), table);
  const wanted = parseLabels(labels);
  const listed = await api(`/api/v1/Job?labels=${encodeURIComponent(labels)}`);
  const rows = new Map();
  const show = (job) => {
    const row = jobRow(job);
    const old = rows.get(job.metadata.name);
    if (old) old.replaceWith(row);
    else body.append(row);
    rows.set(job.metadata.name, row);
  };
  listed.items.forEach(show);
  every(1000, () => body.querySelectorAll("[data-created]").forEach((cell) => {
    cell.textContent = age(Number(cell.dataset.created));
  }));
  watch({ kind: "Job" }, listed.resource_version, (type, job) => {
    const matches = Object.entries(wanted).every(([k, v]) => (job.metadata.labels || {})[k] === v);
    if (type === "deleted" || !matches) {
      rows.get(job.metadata.name)?.remove();
      rows.delete(job.metadata.name);
    } else {
      show(job);
    }
  }, () => route());
}

function parseLabels(text) {
  const labels = {};
  for (const pair of text.split(",")) {
    const [key, ...value] = pair.split("=");
    if (key.trim()) labels[key.trim()] = value.join("=").trim();
  }
  return labels;
}

// ---- One Job ----

function summary(job) {
  const status = job.status || {};
  const progress = status.progress || {};
  const replicas = status.replicas || {};
  const item = (value, label, id) => el("div", id ? { id } : {}, el("b", { text: value }), el("span", { text: label }));
  const fraction = progress.fraction === null || progress.fraction === undefined ? "-" : `${number(progress.fraction * 100, 1)}%`;
  return el("div", { class: "summary" },
    item(status.phase || "", "phase", "phase"),
    item(fraction, "progress"),
    item(number(progress.samples), "samples trained", "samples"),
    item(progress.tasks ? `${number(progress.tasks.succeeded)} / ${number(progress.tasks.total)}` : "-", "data tasks done"),
    item(number(progress.samples_per_second), "samples/s"),
    item(progress.auc === null || progress.auc === undefined ? "-" : number(progress.auc, 4), "AUC"),
    item(`${replicas.trainers ?? "-"} / ${replicas.ps ?? "-"} / ${replicas.data_executors ?? "-"} / ${replicas.serving ?? 0}`, "trainers / PS / data executors / serving"),
    item(age(job.metadata.created_unix_ms), "age"),
  );
}

function sourcesTable(job) {
  const sources = job.status?.progress?.sources || [];
  if (!sources.length) return el("p", { class: "muted", text: "No rows read yet." });
  return el("table", {},
    el("thead", {}, el("tr", {}, ...["Source", "Rows read", "Samples trained", "Re-trained after a rollback"].map((h) => el("th", { text: h })))),
    el("tbody", {}, ...sources.map((s) => el("tr", {},
      el("td", { text: s.source }), el("td", { class: "num", text: number(s.rows_read) }),
      el("td", { class: "num", text: number(s.samples) }), el("td", { class: "num", text: number(s.retrained_samples) })))));
}

function executorsTable(job) {
  const executors = job.status?.executors || [];
  if (!executors.length) return el("p", { class: "muted", text: "No executors running." });
  return el("table", { id: "executors" },
    el("thead", {}, el("tr", {}, ...["Executor", "Role", "Address", "State", "Since", "Restarts", "Last exit"].map((h) => el("th", { text: h })))),
    el("tbody", {}, ...executors.map((e) => el("tr", { "data-executor": e.id },
      el("td", { text: e.id }), el("td", { text: e.role }), el("td", { text: e.address }),
      el("td", {}, el("span", { class: `phase ${{ Failed: "Failed", Completed: "Succeeded", Running: "Running" }[e.state] ?? ""}`, text: e.state })),
      el("td", { class: "num", text: age(e.since_unix_ms) }),
      el("td", { class: "num", text: String(e.restarts ?? 0) }),
      el("td", { class: "muted", text: e.last_exit ?? "" })))));
}

function conditionsTable(job) {
  const conditions = job.status?.conditions || [];
  return el("table", { id: "conditions" },
    el("thead", {}, el("tr", {}, ...["Condition", "Status", "Reason", "Since", "Message"].map((h) => el("th", { text: h })))),
    el("tbody", {}, ...conditions.map((c) => el("tr", {},
      el("td", { text: c.type ?? c.kind }), el("td", { text: String(c.status) }), el("td", { text: c.reason }),
      el("td", { class: "num", text: age(c.last_transition_unix_ms) }), el("td", { text: c.message })))));
}

/// The Job's events (scaling decisions, checkpoints, restores, ...) and its conditions'
/// transitions on one time line: a strip from the Job's creation to now, newest listed first.
function timeline(job) {
  const events = (job.status?.events || []).map((e) => ({ at: e.unix_ms, what: e.reason, message: e.message, kind: "event" }));
  const changes = (job.status?.conditions || []).map((c) => ({
    at: c.last_transition_unix_ms, what: `${c.type ?? c.kind} ${c.status ? "" : "(false) "}${c.reason}`, message: c.message, kind: "condition",
  }));
  const items = [...events, ...changes].filter((i) => i.at > 0).sort((a, b) => b.at - a.at);
  if (!items.length) return el("p", { class: "muted", text: "No events yet." });
  const start = Math.min(job.metadata.created_unix_ms, ...items.map((i) => i.at));
  const span = Math.max(1, Date.now() - start);
  const strip = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  strip.setAttribute("class", "strip");
  strip.setAttribute("viewBox", "0 0 1000 24");
  strip.setAttribute("preserveAspectRatio", "none");
  for (const item of items) {
    const mark = document.createElementNS("http://www.w3.org/2000/svg", "rect");
    const x = ((item.at - start) / span) * 996;
    for (const [k, v] of Object.entries({ x: String(x), y: item.kind === "event" ? "2" : "13", width: "4", height: "9", class: item.kind })) {
      mark.setAttribute(k, v);
    }
    const title = document.createElementNS("http://www.w3.org/2000/svg", "title");
    title.textContent = `${new Date(item.at).toLocaleTimeString()} ${item.what}: ${item.message}`;
    mark.append(title);
    strip.append(mark);
  }
  return el("div", { id: "events" }, strip,
    el("p", { class: "muted", text: "Events above, condition changes below; hover for details." }),
    el("ul", { class: "timeline" }, ...items.map((i) => el("li", { class: i.kind },
      el("time", { text: new Date(i.at).toLocaleTimeString() }),
      el("span", { class: "reason", text: i.what }), i.message))));
}

/// The Job's curves: one chart per series of its Metric resource, kept live.
class Curves {
  constructor(container) {
    this.container = container;
    this.charts = new Map();
    this.metric = null;
  }

  replace(metric) {
    this.metric = metric;
    this.draw();
  }

  append(appended) {
    if (!this.metric) return;
    for (const fresh of appended.spec.series || []) {
      const series = this.metric.spec.series.find((s) => seriesKey(s) === seriesKey(fresh));
      if (series) {
        series.points.push(...fresh.points);
        series.points.splice(0, Math.max(0, series.points.length - MAX_POINTS));
      } else {
        this.metric.spec.series.push(fresh);
      }
    }
    this.draw();
  }

  /// The newest value of gauge `name` of `role` (the role's series), or undefined.
  latest(name, role) {
    const series = this.metric?.spec?.series?.find((s) => s.name === name && s.role === role && !s.executor);
    return series?.points?.[series.points.length - 1]?.value;
  }

  draw() {
    this.onDraw?.();
    const series = [...(this.metric?.spec?.series || [])].sort((a, b) => rank(a.name) - rank(b.name)
      || Number(Boolean(a.executor)) - Number(Boolean(b.executor)) || seriesKey(a).localeCompare(seriesKey(b)));
    if (!series.length) {
      this.container.replaceChildren(el("p", { class: "muted", text: "No metrics reported yet." }));
      return;
    }
    this.container.querySelector("p")?.remove();
    for (const s of series) {
      const key = seriesKey(s);
      const data = [s.points.map((p) => p.unix_ms / 1000), s.points.map((p) => p.value)];
      let chart = this.charts.get(key);
      if (!chart) {
        const from = s.executor || s.role;
        const box = el("div", { class: "chart", "data-series": key }, el("h3", { text: from ? `${s.name} (${from})` : s.name }));
        this.container.append(box);
        const plot = new uPlot({
          width: 380, height: 160, legend: { show: false },
          series: [{}, { label: s.name, stroke: "#2f6fde", width: 1.5 }],
          axes: [{}, { size: 60, values: (u, splits) => splits.map(compact) }],
        }, data, box);
        chart = { box, plot };
        this.charts.set(key, chart);
      } else {
        chart.plot.setData(data);
      }
      chart.box.dataset.points = String(s.points.length);
      chart.box.dataset.last = s.points.length ? String(s.points[s.points.length - 1].value) : "";
    }
  }
}

/// `name/role`, or `name/role/executor` for a series of one executor.
function seriesKey(series) {
  const key = `${series.name}/${series.role || ""}`;
  return series.executor ? `${key}/${series.executor}` : key;
}

/// `1.5G`, `300M`, `12k`, `0.25`: axis labels that fit.
function compact(value) {
  const size = Math.abs(value);
  for (const [unit, scale] of [["G", 1e9], ["M", 1e6], ["k", 1e3]]) {
    if (size >= scale) return `${Number((value / scale).toPrecision(3))}${unit}`;
  }
  return String(Number(value.toPrecision(3)));
}

function rank(name) {
  const at = FIRST_SERIES.indexOf(name);
  return at < 0 ? FIRST_SERIES.length : at;
}

async function jobPage(name) {
  const job = await api(`/api/v1/Job/${encodeURIComponent(name)}`);
  const head = el("div");
  const charts = el("div", { class: "charts", id: "charts" });
  const details = el("div");
  MAIN.replaceChildren(el("h1", { text: `Job ${name}` }), head, el("h2", { text: "Curves" }), charts, details);
  const showJob = (job) => {
    const dataset = job.spec?.dataset;
    head.replaceChildren(summary(job));
    details.replaceChildren(
      el("h2", { text: "Executors" }), executorsTable(job),
      el("h2", { text: "Sources" }), sourcesTable(job),
      el("p", {}, "Dataset ", dataset ? el("a", { href: `#/datasets/${encodeURIComponent(dataset)}`, text: dataset }) : "-",
        `, mode ${job.spec?.mode ?? "-"}, spec generation ${job.metadata.generation}`),
      el("h2", { text: "Conditions" }), conditionsTable(job),
      el("h2", { text: "Time line" }),
      el("p", {}, el("a", { id: "traces-link", href: `#/jobs/${encodeURIComponent(name)}/traces`,
        text: "Traces: a training step, the serving-sync cycle that moved its push, the Predicts that used it" })),
      timeline(job));
  };
  showJob(job);
  const curves = new Curves(charts);
  const freshness = el("p", { id: "freshness", class: "muted" });
  head.after(freshness);
  curves.onDraw = () => {
    const p50 = curves.latest("freshness_p50_ms", "serving_sync");
    const p99 = curves.latest("freshness_p99_ms", "serving_sync");
    const denseAge = curves.latest("dense_age_ms", "serving_sync");
    const dense = denseAge === undefined ? "no dense model served yet" : `dense model exported ${number(denseAge / 1000, 1)} s before now`;
    freshness.textContent = p50 === undefined
      ? `Serving: no sparse freshness reported yet (serving-sync reports it once replicas hold synced rows); ${dense}.`
      : `Serving freshness: sparse p50 ${number(p50)} ms, p99 ${number(p99)} ms (a PS push until every replica holds it); ${dense} (the stalest replica's).`;
  };
  let metricVersion = 0;
  try {
    const metric = await api(`/api/v1/Metric/${encodeURIComponent(name)}`);
    curves.replace(metric);
    metricVersion = metric.metadata.resource_version;
  } catch (error) {
    if (error.code !== "NotFound") throw error;
    curves.replace(null);
  }
  watch({ kind: "Job", name }, job.metadata.resource_version, (type, job) => {
    if (type === "deleted") {
      MAIN.replaceChildren(el("h1", { text: `Job ${name}` }), el("p", { text: "This Job was deleted." }));
      page.abort();
    } else {
      showJob(job);
    }
  }, () => route());
  watch({ kind: "Metric", name }, metricVersion || job.metadata.resource_version, (type, metric) => {
    if (type === "appended") curves.append(metric);
    else if (type !== "deleted") curves.replace(metric);
  }, () => route());
}

// ---- A Job's traces ----

/// One path through the system, read from Jaeger by the API server: a training step of the
/// Job with its PS calls, the serving-sync cycle that moved its push, the Predicts that used it.
async function tracesPage(name) {
  const title = el("h1", {}, el("a", { href: `#/jobs/${encodeURIComponent(name)}`, text: `Job ${name}` }), ": traces");
  MAIN.replaceChildren(title, el("p", { class: "muted", text: "Reading Jaeger..." }));
  const path = await api(`/api/v1/traces/${encodeURIComponent(name)}`);
  const origin = path.step[0]?.start_us ?? 0;
  const sections = [title, el("h2", { text: "A training step" }), waterfall("step", path.step, origin)];
  if (path.push) {
    sections.push(
      el("p", { class: "muted", text: `Its push left PS shard ${path.push.shard} at version ${path.push.version}.` }),
      el("h2", { text: "The serving-sync cycle that moved it" }), waterfall("sync", path.sync, origin),
      el("h2", { text: "Predicts that used it" }));
    if (!path.predicts.length) sections.push(el("p", { class: "muted", text: "No Predict has used it yet." }));
    for (const predict of path.predicts) {
      const held = predict[0]?.attributes["primus.applied"] ?? "";
      sections.push(el("p", { class: "muted", text: `${predict[0]?.instance || "a replica"} held ${held}` }),
        waterfall("predict", predict, origin));
    }
  } else {
    sections.push(el("p", { class: "muted",
      text: "No serving-sync cycle of this Job moved a push that Jaeger still holds (a Job without serving, or none yet)." }));
  }
  MAIN.replaceChildren(...sections);
}

function duration(us) {
  return us >= 1000 ? `${number(us / 1000, 1)} ms` : `${us} µs`;
}

/// Spans as bars on their group's own time scale, each row indented under its parent;
/// the caption gives the group's start after `origin` (the step's start).
function waterfall(group, spans, origin) {
  if (!spans.length) return el("p", { class: "muted", text: "No spans." });
  const start = spans[0].start_us;
  const end = Math.max(...spans.map((s) => s.start_us + s.duration_us));
  const total = Math.max(1, end - start);
  const offset = start === origin ? "the step" : `${duration(start - origin)} after the step began`;
  const rows = spans.map((s) => {
    const details = [`${s.service}${s.instance ? ` (${s.instance})` : ""}`, ...Object.entries(s.attributes).map(([k, v]) => `${k} = ${v}`)].join("\n");
    const left = ((s.start_us - start) / total) * 100;
    const width = Math.max(0.4, (s.duration_us / total) * 100);
    return el("div", { class: "span-row", "data-operation": s.operation, title: details },
      el("div", { class: "span-label", style: `padding-left: ${s.depth * 14}px` },
        el("span", { class: "span-process", text: s.instance || s.service }), ` ${s.operation}`),
      el("div", { class: "span-lane" }, el("div", { class: `span-bar ${s.service}`, style: `left: ${left}%; width: ${width}%` })),
      el("div", { class: "span-duration", text: duration(s.duration_us) }));
  });
  return el("div", { class: "waterfall", "data-group": group },
    el("div", { class: "muted", text: `${offset}, ${duration(total)} in all` }), ...rows);
}

// ---- Datasets and Metrics ----

async function datasetsPage() {
  const listed = await api("/api/v1/Dataset");
  MAIN.replaceChildren(el("h1", { text: "Datasets" }), el("table", {},
    el("thead", {}, el("tr", {}, ...["Dataset", "Streams", "Sources", "Age"].map((h) => el("th", { text: h })))),
    el("tbody", {}, ...listed.items.map((d) => el("tr", { "data-dataset": d.metadata.name },
      el("td", {}, el("a", { href: `#/datasets/${encodeURIComponent(d.metadata.name)}`, text: d.metadata.name })),
      el("td", { text: (d.spec.streams || []).map((s) => s.name).join(", ") }),
      el("td", { text: (d.spec.streams || []).flatMap((s) => s.sources || []).map((s) => s.name).join(", ") }),
      el("td", { class: "num", text: age(d.metadata.created_unix_ms) }))))));
}

function windowText(window) {
  return `${window.unit} from ${window.start} ${window.end ? `to ${window.end}` : "(open-ended)"}`;
}

function sourceText(source) {
  if (source.parquet) return `Parquet ${source.parquet.uri}`;
  if (source.jetstream) return `JetStream ${source.jetstream.subject ?? source.jetstream.stream ?? ""}`;
  if (source.join) return "joined";
  return "";
}

async function datasetPage(name) {
  const [dataset, jobs] = await Promise.all([api(`/api/v1/Dataset/${encodeURIComponent(name)}`), api("/api/v1/Job")]);
  const readers = jobs.items.filter((j) => j.spec?.dataset === name);
  MAIN.replaceChildren(el("h1", { text: `Dataset ${name}` }),
    el("h2", { text: "Streams and windows" }),
    el("table", {},
      el("thead", {}, el("tr", {}, ...["Stream", "Window", "Source", "Weight", "Reads"].map((h) => el("th", { text: h })))),
      el("tbody", {}, ...(dataset.spec.streams || []).flatMap((stream) => (stream.sources || []).map((source) => el("tr", {},
        el("td", { text: stream.name }), el("td", { text: windowText(stream.window) }), el("td", { text: source.name }),
        el("td", { class: "num", text: number(source.weight, 2) }), el("td", { text: sourceText(source) })))))),
    el("h2", { text: "Jobs reading it" }),
    readers.length ? el("table", {},
      el("thead", {}, el("tr", {}, ...["Job", "Phase", "Progress", "Tasks", "Rows read per source"].map((h) => el("th", { text: h })))),
      el("tbody", {}, ...readers.map((j) => el("tr", {},
        el("td", {}, el("a", { href: `#/jobs/${encodeURIComponent(j.metadata.name)}`, text: j.metadata.name })),
        el("td", { text: j.status?.phase ?? "" }), progressCell(j.status), el("td", { text: taskText(j.status) }),
        el("td", { text: (j.status?.progress?.sources || []).map((s) => `${s.source}: ${number(s.rows_read)}`).join(", ") })))))
      : el("p", { class: "muted", text: "No Job reads it." }));
}

async function metricsPage() {
  const listed = await api("/api/v1/Metric");
  MAIN.replaceChildren(el("h1", { text: "Metrics" }), el("table", {},
    el("thead", {}, el("tr", {}, ...["Metric", "Series", "Points", "Updated"].map((h) => el("th", { text: h })))),
    el("tbody", {}, ...listed.items.map((m) => el("tr", {},
      el("td", {}, el("a", { href: `#/jobs/${encodeURIComponent(m.metadata.name)}`, text: m.metadata.name })),
      el("td", { class: "num", text: number((m.spec.series || []).length) }),
      el("td", { class: "num", text: number((m.spec.series || []).reduce((n, s) => n + s.points.length, 0)) }),
      el("td", { class: "num", text: age(m.metadata.updated_unix_ms) }))))));
}

// ---- Routing and signing in ----

function signOut(message) {
  token = null;
  sessionStorage.removeItem(TOKEN_KEY);
  page.abort();
  MAIN.replaceChildren();
  document.getElementById("sign-out").hidden = true;
  document.getElementById("sign-in").hidden = false;
  document.getElementById("sign-in-error").textContent = message || "";
}

async function route() {
  page.abort();
  page = new AbortController();
  banner("");
  if (!token) return signOut("");
  document.getElementById("sign-in").hidden = true;
  document.getElementById("sign-out").hidden = false;
  const [path, query] = (location.hash.replace(/^#/, "") || "/jobs").split("?");
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  document.querySelectorAll("nav a").forEach((a) => a.classList.toggle("active", a.getAttribute("href") === `#/${parts[0]}`));
  try {
    if (parts[0] === "jobs" && parts[1] && parts[2] === "traces") await tracesPage(parts[1]);
    else if (parts[0] === "jobs" && parts[1]) await jobPage(parts[1]);
    else if (parts[0] === "datasets" && parts[1]) await datasetPage(parts[1]);
    else if (parts[0] === "datasets") await datasetsPage();
    else if (parts[0] === "metrics") await metricsPage();
    else await jobsPage(new URLSearchParams(query || ""));
  } catch (error) {
    if (error instanceof Refused) return signOut(error.message);
    banner(error.message);
  }
}

document.getElementById("sign-in").addEventListener("submit", (event) => {
  event.preventDefault();
  token = document.getElementById("token").value.trim();
  sessionStorage.setItem(TOKEN_KEY, token);
  route();
});
document.getElementById("sign-out").addEventListener("click", () => signOut(""));
window.addEventListener("hashchange", route);
route();
