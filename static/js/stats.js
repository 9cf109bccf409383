// Statistics page (templates/analysis/stats.html): request time grouped by user, user agent,
// verb, resource, namespace or code, under the filters the page was opened with.
//
// - the table of /api/v1/incidents/{id}/stats/ (timelines.analysis.stats), sortable by any
//   column; each key links to the incident's timeline filtered to it;
// - a bar chart of the total time of the keys with the most;
// - requests in flight over time for the top keys (…/stats/inflight/), one line each.
(function () {
  "use strict";
  const {el, getJSON, valueName: label} = window.Hindsight;
  const card = document.getElementById("stats");
  if (!card) return;
  const form = document.getElementById("stats-form");
  const select = document.getElementById("stats-by");
  const table = document.getElementById("stats-table");
  const summary = document.getElementById("stats-summary");
  const BARS = 25;  // keys in the bar chart
  // by → the events filter of the same field (timelines.reads.filters.EventFilterSet)
  const PARAM = {user: "user", user_agent: "user_agent", verb: "verb", resource: "resource",
                 namespace: "namespace", code: "code"};
  let rows = [];
  let sort = {column: "total_ms", descending: true};

  function number(value) {
    return value === null || value === undefined ? "–" : value.toLocaleString("en-US",
      {maximumFractionDigits: 3});
  }

  // the timeline filtered to one key; "(none)" filters the requests without one
  function drill(by, key) {
    const query = new URLSearchParams(card.dataset.filters);
    query.append(PARAM[by], label(key));
    return card.dataset.incidentUrl + "?" + query.toString() + "#timeline";
  }

  function compare(a, b) {
    const x = a[sort.column], y = b[sort.column];
    if (x === y) return 0;
    if (x === null || x === undefined) return 1;  // nothing known goes last either way
    if (y === null || y === undefined) return -1;
    const order = typeof x === "number" && typeof y === "number" ? x - y
      : String(x).localeCompare(String(y));
    return sort.descending ? -order : order;
  }

  function drawTable(by) {
    const body = table.tBodies[0];
    body.replaceChildren();
    if (!rows.length) {
      body.append(el("tr", {}, el("td", {colspan: 7, class: "empty"},
                                  "No requests match these filters.")));
      return;
    }
    for (const row of rows.slice().sort(compare)) {
      const href = drill(by, row.key);
      body.append(el("tr", {class: row.errors ? "has-errors" : null, dataset: {key: label(row.key)}},
        el("td", {}, href ? el("a", {href, title: "Its requests on the timeline"}, label(row.key))
                          : label(row.key)),
        el("td", {class: "num"}, number(row.requests)),
        el("td", {class: "num"}, number(row.total_ms)),
        el("td", {class: "num"}, number(row.p50_ms)),
        el("td", {class: "num"}, number(row.p95_ms)),
        el("td", {class: "num"}, number(row.max_ms)),
        el("td", {class: "num"}, number(row.errors))));
    }
    for (const th of table.tHead.rows[0].cells) {
      th.setAttribute("aria-sort", th.dataset.sort === sort.column
        ? (sort.descending ? "descending" : "ascending") : "none");
    }
  }

  function plotly() {
    return new Promise((resolve) => {
      if (window.Plotly) return resolve(window.Plotly);
      document.getElementById("plotly-js").addEventListener("load", () => resolve(window.Plotly));
    });
  }

  const CONFIG = {responsive: true, displaylogo: false, showTips: false};

  async function drawBars(by) {
    const Plotly = await plotly();
    const box = document.getElementById("stats-bars");
    const top = rows.slice(0, BARS).reverse();  // the longest on top
    if (!top.length) { Plotly.purge(box); box.replaceChildren(); return; }
    await Plotly.react(box, [{
      type: "bar", orientation: "h", x: top.map((r) => r.total_ms),
      y: top.map((r) => label(r.key)), marker: {color: "#4c78a8"},
      customdata: top.map((r) => [r.requests, r.p95_ms]),
      hovertemplate: "%{y}<br>%{x:,.3f} ms in %{customdata[0]} requests" +
                     "<br>p95 %{customdata[1]} ms<extra></extra>",
    }], {
      height: 60 + 18 * top.length, margin: {l: 260, r: 20, t: 10, b: 40},
      xaxis: {title: {text: "total time (ms)"}}, yaxis: {automargin: true},
    }, CONFIG);
    box.dataset.by = by;
  }

  async function drawInFlight(by) {
    const box = document.getElementById("inflight-chart");
    const query = new URLSearchParams(card.dataset.filters);
    query.set("by", by);
    const answer = await getJSON(card.dataset.inflightUrl + "?" + query.toString());
    const Plotly = await plotly();
    if (!answer.series.length) { Plotly.purge(box); box.replaceChildren(
      el("p", {class: "empty"}, "No requests.")); return; }
    const start = Date.parse(answer.start);
    // each value holds from its bin's start (a step drawn "hv")
    const x = Array.from({length: answer.bins},
                         (_, i) => new Date(start + i * answer.width_ms).toISOString());
    await Plotly.react(box, answer.series.map((s) => ({
      type: "scatter", mode: "lines", name: label(s.key) + " (" + s.requests + ")",
      x, y: s.mean, line: {shape: "hv", width: 1.5},
      hovertemplate: label(s.key) + ": %{y:.2f} in flight<extra></extra>",
    })), {
      height: 340, margin: {l: 50, r: 20, t: 10, b: 40},
      yaxis: {title: {text: "mean in flight"}, rangemode: "tozero"},
      legend: {orientation: "h", y: -0.2}, hovermode: "x unified",
    }, CONFIG);
  }

  async function load() {
    const by = select.value;
    const query = new URLSearchParams(card.dataset.filters);
    query.set("by", by);
    summary.textContent = "Counting…";
    try {
      const answer = await getJSON(card.dataset.statsUrl + "?" + query.toString());
      rows = answer.results;
      summary.textContent = answer.requests.toLocaleString("en-US") + " requests, " +
        answer.keys.toLocaleString("en-US") + " " + select.selectedOptions[0].textContent
          .toLowerCase() + (answer.keys === 1 ? "" : "s") +
        (answer.keys > rows.length ? " (the " + rows.length + " with the most time shown)" : "");
    } catch (err) {
      summary.textContent = "Could not count: " + err.message;
      rows = [];
    }
    table.tHead.rows[0].cells[0].textContent = select.selectedOptions[0].textContent;
    drawTable(by);
    await drawBars(by);
    try { await drawInFlight(by); } catch (err) {
      document.getElementById("inflight-chart").replaceChildren(
        el("p", {class: "empty"}, "Could not count: " + err.message));
    }
  }

  table.tHead.addEventListener("click", (event) => {
    const th = event.target.closest("th[data-sort]");
    if (!th) return;
    const column = th.dataset.sort;
    sort = {column, descending: sort.column === column ? !sort.descending : column !== "key"};
    drawTable(select.value);
  });
  select.addEventListener("change", () => {
    const url = new URL(window.location.href);
    url.searchParams.set("by", select.value);
    window.history.replaceState(null, "", url);
    load();
  });
  form.addEventListener("submit", (event) => { event.preventDefault(); load(); });
  load();
}());
