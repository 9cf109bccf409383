// Run-against-run page: two incidents aligned on an anchor (GET .../compare/?against=…&figures=1),
// drawn as two Gantts on one axis of milliseconds from each run's anchor, and their steps: in
// both runs (with the change of offset), only in run a, only in run b.
(function () {
  "use strict";
  const {el, getJSON, shortTime, problem} = window.Hindsight;
  const $ = (id) => document.getElementById(id);
  const section = $("compare");
  if (!section) return;
  const data = section.dataset;
  const query = new URLSearchParams(window.location.search);
  const CHANGED_MS = 1000;  // a change of offset from which a step is highlighted
  const ROWS_SHOWN = 2000;  // per table
  const LABELS_PX = 300;  // room for a lane label (lanes.LABEL_CHARS characters)
  let answer = null;

  function objectOf(step) {
    const thing = [step.resource, step.namespace, step.name].filter(Boolean).join("/");
    return thing + (step.subresource ? " (" + step.subresource + ")" : "");
  }

  const ms = (value) => (value === null || value === undefined ? "" : value.toFixed(3));

  // a link to the incident page with the event selected
  function eventLink(incident, side, text) {
    return el("a", {href: data.incidentsUrl + incident + "/?event=" + side.event,
                    title: "event " + side.event}, text);
  }

  function drawAnchors() {
    const anchor = answer.anchor;
    const rule = {"given": "as given", "first-shared-create":
                    "the first create of an object name both runs share",  // object, else name
                  "first-request": "no object name is created in both runs: each run's first " +
                    "request"}[anchor.rule] || anchor.rule;
    const box = $("anchors");
    box.hidden = false;
    box.replaceChildren("Anchors (" + rule + "): run a ",
      eventLink(data.incidentA, {event: anchor.a}, "event " + anchor.a),
      " at " + shortTime(anchor.a_received) + ", run b ",
      eventLink(query.get("against"), {event: anchor.b}, "event " + anchor.b),
      " at " + shortTime(anchor.b_received) + ".");
  }

  async function drawGantts() {
    if (!window.Plotly) {
      await new Promise((resolve) => $("plotly-js").addEventListener("load", resolve));
    }
    const {figures} = answer;
    $("gantts").hidden = false;
    const boxes = [$("gantt-a"), $("gantt-b")];
    const config = {displaylogo: false, responsive: true};
    for (const [box, figure] of [[boxes[0], figures.a], [boxes[1], figures.b]]) {
      const layout = Object.assign({}, figure.layout);
      layout.xaxis = Object.assign({}, layout.xaxis, {range: figures.range, autorange: false});
      // one left margin for both (not sized to each run's labels): the same offset is then
      // at the same place on the page in both Gantts
      layout.yaxis = Object.assign({}, layout.yaxis, {automargin: false});
      layout.margin = Object.assign({}, layout.margin, {l: LABELS_PX});
      await window.Plotly.newPlot(box, figure.data, layout, config);
      box.dataset.drawn = String(Number(box.dataset.drawn || 0) + 1);
      box.dataset.lanes = String(figure.lanes.length);
    }
    // one axis: zooming one run zooms the other
    let syncing = false;
    boxes.forEach((box, n) => box.on("plotly_relayout", (change) => {
      if (syncing) return;
      const other = boxes[1 - n];
      const update = {};
      if ("xaxis.range[0]" in change) {
        update["xaxis.range"] = [change["xaxis.range[0]"], change["xaxis.range[1]"]];
      } else if (change["xaxis.autorange"]) {
        update["xaxis.range"] = figures.range;
      } else return;
      syncing = true;
      window.Plotly.relayout(other, update).finally(() => { syncing = false; });
    }));
  }

  function drawBoth() {
    const order = $("both-order").value;
    let both = answer.steps.filter((s) => s.a && s.b);
    if (order === "change") {
      both = both.slice().sort((x, y) => Math.abs(y.delta_ms) - Math.abs(x.delta_ms));
    }
    const body = $("steps-both").querySelector("tbody");
    body.replaceChildren(...both.slice(0, ROWS_SHOWN).map((step) => el("tr", {
      class: Math.abs(step.delta_ms) >= CHANGED_MS ? "changed" : null,
      dataset: {a: step.a.event, b: step.b.event}},
    el("td", {}, step.user), el("td", {}, step.verb), el("td", {}, objectOf(step)),
    el("td", {class: "num"}, eventLink(data.incidentA, step.a, ms(step.a.offset_ms))),
    el("td", {class: "num"}, eventLink(query.get("against"), step.b, ms(step.b.offset_ms))),
    el("td", {class: "num delta"}, (step.delta_ms > 0 ? "+" : "") + ms(step.delta_ms)))));
    $("count-both").textContent = "(" + both.length + ")";
  }

  function drawOnly(side, incident) {
    const only = answer.steps.filter((s) => s[side] && !s[side === "a" ? "b" : "a"]);
    const body = $("steps-only-" + side).querySelector("tbody");
    body.replaceChildren(...only.slice(0, ROWS_SHOWN).map((step) => el("tr", {
      dataset: {[side]: step[side].event}},
    el("td", {}, step.user), el("td", {}, step.verb), el("td", {}, objectOf(step)),
    el("td", {class: "num"}, eventLink(incident, step[side], ms(step[side].offset_ms))),
    el("td", {}, step[side].code === null ? "" : String(step[side].code)))));
    if (!only.length) {
      body.append(el("tr", {}, el("td", {colspan: 5, class: "empty"}, "None.")));
    }
    $("count-only-" + side).textContent = "(" + only.length + ")";
  }

  async function run() {
    if (!query.get("against")) return;
    const select = $("against");
    $("run-b-title").textContent = select.selectedOptions.length && select.value
      ? select.selectedOptions[0].textContent : "incident " + query.get("against");
    const params = new URLSearchParams(query);
    for (const [name, value] of Array.from(params.entries())) {
      if (!value) params.delete(name);  // the form's empty inputs
    }
    params.set("figures", "1");
    try {
      answer = await getJSON(data.compareUrl + "?" + params.toString());
    } catch (err) {
      $("compare-status").textContent = "Could not compare: " +
        (err.body ? problem(err.body) : err.message);
      return;
    }
    const {summary, truncated} = answer;
    $("compare-status").textContent = summary.both + " steps in both runs, " + summary.only_a +
      " only in run a, " + summary.only_b + " only in run b" +
      (truncated.a || truncated.b ? " · only the first " + answer.max_steps + " requests of " +
        (truncated.a && truncated.b ? "each run" : truncated.a ? "run a" : "run b") +
        " are compared: narrow them with the filters" : "") + ".";
    drawAnchors();
    $("steps").hidden = false;
    drawBoth();
    drawOnly("a", data.incidentA);
    drawOnly("b", query.get("against"));
    $("both-order").addEventListener("change", drawBoth);
    await drawGantts();
  }

  run();
})();
