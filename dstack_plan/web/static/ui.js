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

// Axis labels are text in the page, not drawn on uPlot's canvas: placed by us, each is
// measured, and one that would overlap the last kept (or stick out of the chart) is left
// out, so none ever overlaps whatever the width, font or time span. uPlot still chooses the
// ticks (spaced for the widest label) and draws the grid and tick marks.
const TICK = 10 + 3; // uPlot's tick mark length, then a gap: where a label starts
const LABEL_GAP = 8; // the least room between two labels on an axis, in CSS px

function pad2(n) { return String(n).padStart(2, "0"); }

function clockLabel(seconds, step) {
  const d = new Date(seconds * 1000);
  if (step >= 86400) return d.getFullYear() + "-" + pad2(d.getMonth() + 1) + "-" + pad2(d.getDate());
  const hm = pad2(d.getHours()) + ":" + pad2(d.getMinutes());
  return step < 60 ? hm + ":" + pad2(d.getSeconds()) : hm;
}

function tickElement(text) {
  const span = document.createElement("span");
  span.className = "tick";
  span.textContent = text;
  return span;
}

function textWidth(el, text) {
  const probe = el.appendChild(document.createElement("div"));
  probe.className = "ticks";
  probe.style.visibility = "hidden";
  const width = probe.appendChild(tickElement(text)).offsetWidth;
  probe.remove();
  return width;
}

// The labels of one axis: [position along the axis in CSS px, text], those of the lowest
// values first. Kept in turn when they fit in the chart clear of the last kept.
function placeAxis(u, layer, axis, ticks) {
  const wrap = layer.parentNode;
  const left = u.over.offsetLeft, top = u.over.offsetTop;
  const spans = ticks.map(([, text]) => layer.appendChild(tickElement(text)));
  const sizes = spans.map((s) => [s.offsetWidth, s.offsetHeight]); // one layout for all
  let edge = axis === "x" ? -Infinity : Infinity; // the far side of the last label kept
  ticks.forEach(([pos], i) => {
    const [w, h] = sizes[i];
    let fits;
    if (axis === "x") {
      const start = left + pos - w / 2;
      fits = start >= 0 && start + w <= wrap.clientWidth && start >= edge + LABEL_GAP;
      if (fits) {
        spans[i].style.left = start + "px";
        spans[i].style.top = top + u.over.offsetHeight + TICK + "px";
        edge = start + w;
      }
    } else {
      const start = top + pos - h / 2;
      fits = start >= 0 && start + h <= wrap.clientHeight && start + h + LABEL_GAP / 2 <= edge &&
        w <= left - TICK;
      if (fits) {
        spans[i].style.top = start + "px";
        spans[i].style.right = wrap.clientWidth - left + TICK + "px";
        edge = start;
      }
    }
    if (!fits) spans[i].remove();
  });
}

function placeLabels(u, drawn) {
  const wrap = u.over.parentNode;
  const length = { x: u.over.offsetWidth, y: u.over.offsetHeight };
  for (const axis of ["x", "y"]) {
    let layer = wrap.querySelector(":scope > .ticks-" + axis);
    if (!layer) {
      layer = wrap.appendChild(document.createElement("div"));
      layer.className = "ticks ticks-" + axis;
    }
    layer.replaceChildren();
    const ticks = (drawn[axis] || [])
      .filter(([, text]) => text !== null && text !== "")
      .map(([value, text]) => [u.valToPos(value, axis), text])
      .filter(([pos]) => pos > -0.5 && pos < length[axis] + 0.5)
      .sort((a, b) => (axis === "x" ? a[0] - b[0] : b[0] - a[0]));
    placeAxis(u, layer, axis, ticks);
  }
}

// yAxis: uPlot's options for the y axis, and `format` (a value's label); yScale: its scale's.
function chartOptions(el, width, series, yAxis, yScale) {
  const { format, ...yOptions } = yAxis;
  const drawn = {};
  const record = (axis, label) => (u, splits, axisIdx, space, step) => {
    const labels = splits.map((v) => (v === null || v === undefined ? null : label(v, step)));
    drawn[axis] = splits.map((v, i) => [v, labels[i]]);
    return labels;
  };
  const hidden = "transparent"; // uPlot's canvas labels: ours are in the page
  const xSpace = textWidth(el, "00:00:00") + 2 * LABEL_GAP;
  return {
    width: width, height: 220, series: series,
    scales: { y: yScale },
    axes: [
      { stroke: hidden, size: 34, space: xSpace, values: record("x", clockLabel) },
      { stroke: hidden, size: 56, space: 24, ...yOptions, values: record("y", format) },
    ],
    hooks: { draw: [(u) => placeLabels(u, drawn)] },
  };
}

// A percentage axis is 0 to 100 whatever the values: uPlot's automatic range pads the
// data's, so a flat 100 (every GPU busy) made an axis to 200.
const PERCENT_AXIS = [{ format: (v) => v + "%", incrs: [10, 20, 25, 50, 100] }, { range: [0, 100] }];
// Counts are whole numbers from 0 (no "1.5 runs"), with room above the highest.
const COUNT_AXIS = [
  { format: (v) => String(v), incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000] },
  { range: (u, min, max) => [0, Math.ceil(max || 0) + 1] },
];

function drawCharts(box) {
  if (!window.uPlot) return;
  const plots = {};
  const width = () => Math.max(280, box.clientWidth - 8);
  function make(id, series, axis, data) {
    const el = document.getElementById(id);
    if (plots[id]) { plots[id].setData(data); return; }
    plots[id] = new uPlot(chartOptions(el, width(), series, axis[0], axis[1]), data, el);
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
      make("chart-gpu", [{}, { label: "GPU %", stroke: "#cf222e", width: 2 }], PERCENT_AXIS,
        [times, util]);
      make("chart-queue", [{}, { label: "queue", stroke: "#0969da", width: 2 },
        { label: "running", stroke: "#1a7f37", width: 2 }], COUNT_AXIS,
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
