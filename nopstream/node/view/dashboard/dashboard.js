// The job's dashboard: reads GET /api/v1/job (docs/dashboard.md) every second with the
// job's secret, taken from the address's fragment (#token=...; fragments never reach a
// server) and kept for the tab's session. The graph is laid out by dagre through
// cytoscape, the charts are uPlot's: no geometry of our own.
"use strict";

const LEVEL_COLOURS = { ok: "#2e7d32", low: "#ef8f00", high: "#c62828" };
const SERIES_COLOURS = ["#1565c0", "#6a1b9a", "#00838f", "#ad1457", "#558b2f", "#4e342e", "#283593"];
const REFRESH_MS = 1000;

const state = { token: tokenFromAddress(), cy: null, charts: {}, last: null, graphKey: "" };
window.nopstream = state; // for the browser test and for a curious user's console

function tokenFromAddress() {
  const match = /(?:^#|&)token=([^&]+)/.exec(window.location.hash);
  if (match) {
    sessionStorage.setItem("nopstream-token", decodeURIComponent(match[1]));
  }
  return sessionStorage.getItem("nopstream-token") || "";
}

function text(value) {
  return value === null || value === undefined ? "–" : String(value);
}

function percent(share) {
  return `${Math.round(share * 100)} %`;
}

function rate(value) {
  return value.toLocaleString("en", { maximumFractionDigits: 0 });
}

function lookups(figures) {
  // a task with lookups: cache hits and calls made, calls in flight, the calls' mean duration
  if (!figures || figures.misses === undefined) return "";
  const ms = figures.latency_ms.toLocaleString("en", { maximumFractionDigits: 1 });
  return `${rate(figures.hits)} hits, ${rate(figures.misses)} calls, ${figures.in_flight} in flight, ${ms} ms`;
}

function time(ms) {
  return ms ? new Date(ms).toLocaleTimeString("en-GB") : "–";
}

function duration(ms) {
  if (ms === null || ms === undefined) return "–";
  return ms < 1000 ? `${Math.round(ms)} ms` : `${(ms / 1000).toFixed(1)} s`;
}

function bytes(n) {
  if (!n) return "0 B";
  const units = ["B", "KiB", "MiB", "GiB"];
  const i = Math.min(units.length - 1, Math.floor(Math.log(n) / Math.log(1024)));
  return `${(n / 1024 ** i).toFixed(i ? 1 : 0)} ${units[i]}`;
}

function setText(id, value) {
  document.getElementById(id).textContent = text(value);
}

// Rows of a table body from rows of cells; each row's attributes (data-*, class) given beside it.
function fillTable(id, rows) {
  const body = document.querySelector(`#${id} tbody`);
  body.replaceChildren(
    ...rows.map(({ cells, attributes }) => {
      const tr = document.createElement("tr");
      for (const [name, value] of Object.entries(attributes || {})) tr.setAttribute(name, value);
      for (const cell of cells) {
        const td = document.createElement("td");
        if (cell instanceof Node) td.append(cell);
        else td.textContent = text(cell);
        tr.append(td);
      }
      return tr;
    }),
  );
}

function levelBadge(level, share) {
  const span = document.createElement("span");
  span.className = `level ${level}`;
  span.textContent = percent(share);
  return span;
}

function vertexLabel(v) {
  return `${v.id} ×${v.parallelism}\nbusy ${percent(v.busy)} · backpressured ${percent(v.backpressured)}`;
}

function drawGraph(view) {
  const { vertices, edges } = view.graph;
  const key = JSON.stringify([vertices.map((v) => [v.id, v.parallelism]), edges.map((e) => e.id)]);
  if (state.cy === null || key !== state.graphKey) {
    state.graphKey = key;
    if (state.cy !== null) state.cy.destroy();
    state.cy = cytoscape({
      container: document.getElementById("graph"),
      elements: [
        ...vertices.map((v) => ({ data: { id: v.id, label: vertexLabel(v), level: v.level } })),
        ...edges.map((e) => ({ data: { id: e.id, source: e.source, target: e.target, label: e.policy } })),
      ],
      layout: { name: "dagre", rankDir: "LR", nodeSep: 30, rankSep: 90, padding: 20 },
      maxZoom: 1,
      userZoomingEnabled: false,
      style: [
        {
          selector: "node",
          style: {
            shape: "round-rectangle",
            width: 230,
            height: 48,
            label: "data(label)",
            "text-wrap": "wrap",
            "text-valign": "center",
            color: "#fff",
            "font-size": 12,
            "background-color": (node) => LEVEL_COLOURS[node.data("level")],
          },
        },
        {
          selector: "edge",
          style: {
            width: 2,
            "curve-style": "bezier",
            "target-arrow-shape": "triangle",
            label: "data(label)",
            "font-size": 11,
            "text-background-color": "#fff",
            "text-background-opacity": 1,
          },
        },
      ],
    });
  }
  for (const v of vertices) {
    state.cy.getElementById(v.id).data({ label: vertexLabel(v), level: v.level });
  }
  state.cy.style().update();
}

function drawChart(id, title, view, pick, format, range) {
  const ids = view.graph.vertices.map((v) => v.id);
  const samples = view.series[ids[0]] || [];
  const data = [samples.map((s) => s.at / 1000), ...ids.map((v) => (view.series[v] || []).map(pick))];
  if (!state.charts[id]) {
    state.charts[id] = new uPlot(
      {
        title,
        width: 420,
        height: 200,
        series: [
          {},
          ...ids.map((v, i) => ({
            label: v,
            stroke: SERIES_COLOURS[i % SERIES_COLOURS.length],
            value: (u, y) => (y === null ? "–" : format(y)),
          })),
        ],
        scales: range ? { y: { range } } : {},
        axes: [{}, { size: 70, values: (u, ticks) => ticks.map(format) }],
      },
      data,
      document.getElementById(id),
    );
  } else {
    state.charts[id].setData(data);
  }
}

function show(view) {
  state.last = view;
  const job = view.job;
  setText("job-id", job.jobId);
  setText("job-state", job.state);
  setText("semantic-mode", job.semanticMode);
  setText("leader", view.leader ? `run ${view.leader.run}, token ${view.leader.token}` : null);
  setText("latest-durable", view.checkpoints.latestDurable);
  setText("latest-committed", view.checkpoints.latestCommitted);
  setText("updated", time(view.now));
  drawGraph(view);
  fillTable(
    "vertices",
    view.graph.vertices.map((v) => ({
      attributes: { "data-vertex": v.id, "data-level": v.level },
      cells: [
        v.id,
        v.parallelism,
        v.operators.map((o) => o.id).join(" → "),
        rate(v.recordsInPerSecond),
        rate(v.recordsOutPerSecond),
        percent(v.busy),
        levelBadge(v.level, v.backpressured),
        v.watermark,
        duration(v.watermarkLagMs),
      ],
    })),
  );
  drawChart("chart-in", "records in / s", view, (s) => s.recordsInPerSecond, rate);
  drawChart("chart-out", "records out / s", view, (s) => s.recordsOutPerSecond, rate);
  drawChart("chart-backpressure", "backpressured", view, (s) => s.backpressured, percent, [0, 1]);
  fillTable(
    "checkpoints",
    view.checkpoints.history.map((e) => ({
      attributes: { "data-epoch": e.epoch, class: `state-${e.state}` },
      cells: [
        e.epoch,
        e.kind,
        e.run,
        e.reason ? `${e.state} (${e.reason})` : e.state,
        time(e.triggeredAt),
        duration(e.durationMs),
        duration(e.alignmentMs),
        bytes(e.bytes),
        e.slowestTask,
      ],
    })),
  );
  fillTable(
    "runs",
    view.runs.map((r) => ({
      attributes: { "data-run": r.run },
      cells: [r.run, time(r.startedAt), r.restoredEpoch, r.cause],
    })),
  );
  const failures = view.failures.map((f) => {
    const div = document.createElement("div");
    div.className = "failure";
    const head = document.createElement("p");
    head.textContent = `${time(f.at)} · run ${f.run} · ${f.taskId}`;
    const pre = document.createElement("pre");
    pre.textContent = f.error;
    div.append(head, pre);
    return div;
  });
  const none = document.createElement("p");
  none.className = "none";
  none.textContent = "none";
  document.getElementById("failures").replaceChildren(...(failures.length ? failures : [none]));
  fillTable(
    "tasks",
    view.tasks.map((t) => ({
      attributes: { "data-task": t.id },
      cells: t.reported
        ? [t.id, t.run, t.recordsIn, t.recordsOut, t.deadLetters, lookups(t.lookups), percent(t.busy), percent(t.backpressured), percent(t.idle), t.watermark]
        : [t.id, "not reported yet"],
    })),
  );
}

function problem(message) {
  const p = document.getElementById("problem");
  p.hidden = message === null;
  p.textContent = message || "";
}

async function refresh() {
  try {
    const response = await fetch("../api/v1/job", { headers: { Authorization: `Bearer ${state.token}` } });
    if (response.status === 401) {
      problem("This dashboard needs the job's secret: open the address `nopstream run` printed (…#token=…).");
    } else if (!response.ok) {
      problem(`The job answered ${response.status}: ${await response.text()}`);
    } else {
      show(await response.json());
      problem(null);
    }
  } catch (err) {
    problem(`The job does not answer (${err.message}); retrying.`);
  }
  setTimeout(refresh, REFRESH_MS);
}

cytoscape.use(cytoscapeDagre);
refresh();
