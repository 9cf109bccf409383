// Incident page: the timeline figure. Fetches the figure of the page's filters (the same query
// string as the events table) and draws it with the plotly.js we serve; lanes and colour come
// from the controls and are kept in the URL, so a reload or a shared link shows the same view.
(function () {
  "use strict";
  const box = document.getElementById("gantt");
  const controls = document.getElementById("gantt-controls");
  const status = document.getElementById("gantt-status");
  if (!box || !window.Plotly) return;

  function query() {
    const params = new URLSearchParams(window.location.search);
    params.delete("after");  // the table's page cursor is not a filter
    for (const field of controls.elements) {
      if (field.name) params.set(field.name, field.value);
    }
    return params;
  }

  async function draw() {
    const params = query();
    status.textContent = "drawing…";
    let figure;
    try {
      const answer = await fetch(box.dataset.figureUrl + "?" + params.toString(),
                                 {headers: {Accept: "application/json"}, credentials: "same-origin"});
      if (!answer.ok) throw new Error("HTTP " + answer.status);
      figure = await answer.json();
    } catch (err) {
      status.textContent = "could not draw the timeline (" + err.message + ")";
      return;
    }
    const meta = figure.meta || {};
    status.textContent = meta.mode === "heatmap"
      ? meta.total + " events: counts per lane and time (zoom in or filter to see each one)"
      : meta.spans + " events on " + meta.lanes + " lanes";
    window.Plotly.react(box, figure.data, figure.layout, {responsive: true, displaylogo: false});
    box.removeAllListeners && box.removeAllListeners("plotly_click");
    box.on("plotly_click", function (event) {
      const point = event.points && event.points[0];
      if (point && point.customdata) window.open(box.dataset.eventUrl + point.customdata + "/");
    });
    const url = new URL(window.location.href);
    url.search = params.toString();
    window.history.replaceState(null, "", url);
  }

  controls.addEventListener("change", draw);
  draw();
})();
