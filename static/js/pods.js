// Pod phases page: the pods of this incident (and of the incidents chosen to compare with) in
// a sortable table, and the distribution of their phase durations as plotly box plots, one
// colour per incident. Data: /api/v1/incidents/{id}/pods/ with the page's filters, per incident.
(function () {
  "use strict";
  const {el, getJSON, shortTime, formatDuration, plotlyText} = window.Hindsight;
  const card = document.getElementById("pods");
  if (!card) return;

  const runs = JSON.parse(document.getElementById("pods-runs").textContent);
  const filters = card.dataset.filters || "";
  const PHASES = [["created_to_scheduled_ms", "created → scheduled"],
                  ["scheduled_to_started_ms", "scheduled → started"],
                  ["started_to_ready_ms", "started → ready"],
                  ["created_to_ready_ms", "created → ready"]];
  const TIMES = ["created", "scheduled", "started", "ready", "finished", "deleted"];
  const COLOURS = ["#2f5bd3", "#d97706", "#059669", "#be185d", "#7c3aed", "#0891b2", "#65a30d",
                   "#dc2626", "#475569"];
  const tbody = document.querySelector("#pods-table tbody");
  const summary = document.getElementById("pods-summary");
  const countNote = document.getElementById("pods-count");
  let rows = [];  // [{run, pod}]
  let sortKey = "created", sortDown = false;

  function plotly() {
    // the bundle is deferred like this script, but may still be compiling
    return new Promise((resolve) => {
      const wait = () => (window.Plotly ? resolve(window.Plotly) : setTimeout(wait, 30));
      wait();
    });
  }

  function timelineUrl(run, pod) {
    const query = new URLSearchParams(filters);
    for (const name of ["resource", "namespace", "name"]) query.delete(name);
    query.append("resource", "pods");
    query.append("namespace", pod.namespace);
    query.append("name", pod.name);
    return run.page + "?" + query.toString() + "#timeline";
  }

  function cell(value, attrs) {
    return el("td", attrs || {}, value === null || value === undefined ? "" : value);
  }

  // "2024-03-01 10:00:00.250": to the millisecond, as the durations
  function time(iso) {
    return shortTime(iso).replace(/(\.\d{3})\d*$/, "$1");
  }

  function duration(ms) {
    return ms === null || ms === undefined ? "" : formatDuration(ms);
  }

  function drawTable() {
    const several = runs.length > 1;
    const key = sortKey;
    const sorted = [...rows].sort((a, b) => {
      const x = a.pod[key], y = b.pod[key];
      if (x === y) return 0;
      if (x === null || x === undefined) return 1;  // unknowns last, whatever the order
      if (y === null || y === undefined) return -1;
      return (x < y ? -1 : 1) * (sortDown ? -1 : 1);
    });
    tbody.replaceChildren(...sorted.map(({run, pod}) => {
      const sources = pod.sources || {};
      return el("tr", {dataset: {pod: pod.namespace + "/" + pod.name}},
        cell(pod.namespace),
        el("td", {}, el("a", {href: timelineUrl(run, pod), title: pod.uid || ""}, pod.name),
           several ? el("span", {class: "hint"}, " #" + run.id) : null),
        cell(pod.node),
        ...PHASES.map(([name]) => cell(duration(pod[name]), {class: "num"})),
        cell(pod.restarts, {class: "num"}),
        cell(pod.warnings || "", {class: "num"}),
        ...TIMES.map((name) => cell(time(pod[name]), {title: sources[name] || ""})));
    }));
    if (!sorted.length) {
      tbody.append(el("tr", {}, el("td", {colspan: 15, class: "empty"},
                                   "No pod in the evidence under these filters.")));
    }
    for (const th of document.querySelectorAll("#pods-table th[data-sort]")) {
      const sorted = th.dataset.sort === sortKey;
      th.setAttribute("aria-sort", sorted ? (sortDown ? "descending" : "ascending") : "none");
      th.dataset.label = th.dataset.label || th.textContent;
      th.textContent = th.dataset.label + (sorted ? (sortDown ? " ▼" : " ▲") : "");
    }
  }

  async function drawPlot(answers) {
    const traces = [];
    answers.forEach(({run, pods}, i) => {
      const x = [], y = [], text = [];
      for (const pod of pods) {
        for (const [name, label] of PHASES) {
          if (pod[name] === null || pod[name] === undefined) continue;
          x.push(label);
          y.push(pod[name] / 1000);
          text.push(plotlyText(pod.namespace + "/" + pod.name));
        }
      }
      const colour = COLOURS[i % COLOURS.length];
      traces.push({type: "box", name: plotlyText("#" + run.id + " " + run.title), x, y, text,
                   boxpoints: "all", jitter: 0.4, pointpos: 0, marker: {size: 5, color: colour},
                   line: {width: 1.5, color: colour},
                   hovertemplate: "%{text}<br>%{y:.3f} s<extra>%{fullData.name}</extra>",
                   offsetgroup: String(i)});
    });
    const Plotly = await plotly();
    await Plotly.react("pods-plot", traces, {
      boxmode: "group", height: 380, margin: {l: 60, r: 20, t: 10, b: 40},
      yaxis: {title: {text: "seconds"}, zeroline: true, rangemode: "tozero"},
      xaxis: {categoryorder: "array", categoryarray: PHASES.map(([, label]) => label)},
      legend: {orientation: "h", y: -0.15}, showlegend: true,
    }, {displaylogo: false, responsive: true});
  }

  async function load() {
    const answers = await Promise.all(runs.map(async (run) => ({
      run, pods: await getJSON(run.url + (filters ? "?" + filters : "")),
    })));
    rows = answers.flatMap(({run, pods}) => pods.map((pod) => ({run, pod})));
    const counts = answers.map(({run, pods}) => {
      const timed = pods.filter((p) => p.created_to_ready_ms !== null).length;
      return `#${run.id}: ${pods.length} pod${pods.length === 1 ? "" : "s"}, ${timed} with created → ready`;
    });
    summary.textContent = counts.join(" · ");
    countNote.textContent = rows.length + " in all";
    drawTable();
    await drawPlot(answers);
    card.dataset.ready = "1";
  }

  for (const th of document.querySelectorAll("#pods-table th[data-sort]")) {
    th.style.cursor = "pointer";
    th.addEventListener("click", () => {
      sortDown = th.dataset.sort === sortKey ? !sortDown : false;
      sortKey = th.dataset.sort;
      drawTable();
    });
  }
  load().catch((error) => {
    summary.textContent = "Could not load the pods: " + error.message;
    card.dataset.ready = "error";
  });
})();
