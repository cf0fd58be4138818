// dstack-plan web UI: the little the pages need beyond htmx (no build step).
// Every page reads without it; this follows a run's log and draws the charts.
"use strict";

function followLog(pre) {
  // The page already shows the lines written so far (data-lines of them); the stream sends
  // every line from the start, so the first that many are skipped.
  let skip = Number(pre.dataset.lines || 0);
  const state = document.getElementById("log-state");
  const source = new EventSource(pre.dataset.follow);
  source.addEventListener("line", (event) => {
    if (skip > 0) { skip -= 1; return; }
    const line = JSON.parse(event.data);
    const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
    pre.append(document.createTextNode(line.text + "\n"));
    if (atBottom) pre.scrollTop = pre.scrollHeight;
  });
  source.addEventListener("end", (event) => {
    source.close();
    const end = JSON.parse(event.data);
    if (state) state.textContent = "job " + end.status +
      (end.exit_code === null || end.exit_code === undefined ? "" : " (exit " + end.exit_code + ")");
  });
  source.addEventListener("error", (event) => {
    if (event.data) { source.close(); if (state) state.textContent = JSON.parse(event.data).error; }
  });
}

function drawCharts(box) {
  if (!window.uPlot) return;
  const plots = {};
  const width = () => Math.max(280, box.clientWidth - 8);
  function make(id, series, data) {
    const el = document.getElementById(id);
    if (plots[id]) { plots[id].setData(data); return; }
    plots[id] = new uPlot({ width: width(), height: 220, series: series }, data, el);
  }
  async function refresh() {
    try {
      const response = await fetch(box.dataset.src, { credentials: "same-origin" });
      if (!response.ok) return;
      const history = await response.json();
      const samples = history.samples;
      const times = samples.map((s) => s.time);
      const util = samples.map((s) => {
        const values = Object.values(s.gpu_utilization);
        return values.length ? values.reduce((a, b) => a + b, 0) / values.length : null;
      });
      make("chart-gpu", [{}, { label: "GPU %", stroke: "#cf222e", width: 2 }], [times, util]);
      make("chart-queue", [{}, { label: "queue", stroke: "#0969da", width: 2 },
        { label: "running", stroke: "#1a7f37", width: 2 }],
        [times, samples.map((s) => s.queue_depth), samples.map((s) => s.runs.running || 0)]);
    } catch (e) { /* the next refresh tries again */ }
  }
  refresh();
  setInterval(refresh, 5000);
  window.addEventListener("resize", () => {
    for (const plot of Object.values(plots)) plot.setSize({ width: width(), height: 220 });
  });
}

document.addEventListener("DOMContentLoaded", () => {
  const log = document.querySelector("pre[data-follow]");
  if (log) followLog(log);
  const charts = document.getElementById("charts");
  if (charts) drawCharts(charts);
});
