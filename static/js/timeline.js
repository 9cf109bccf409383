// Incident page: the timeline. The URL is the state: the event filters (the same query string
// as the events table), the time window (since/until), lanes, colour and the selected event
// (event=<id>). Loading a URL restores that view; every change here rewrites the URL.
//
// - draws the figure of the filters and window with the plotly.js we serve;
// - a drag on the plot chooses a time window: the figure is fetched again for it (bars up to
//   20k events, a heatmap beyond) and the server-rendered table is swapped for the window's;
// - a click on a bar, j/k (ArrowDown/ArrowUp) and find-next select an event: a line marks it
//   on the plot and event-detail.js shows it; stepping past the window pans the window.
(function () {
  "use strict";
  const {el, getJSON, shortTime} = window.Hindsight;
  const Detail = window.HindsightDetail;
  // plotly.js loads async: compiling it (the 1.5 MB bundle of scripts/assets.sh) takes a few
  // hundred milliseconds, during which the first figure is already being fetched
  let Plotly = window.Plotly;
  const plotlyTag = document.getElementById("plotly-js");
  const plotlyReady = Plotly ? Promise.resolve() : new Promise((resolve, reject) => {
    plotlyTag.addEventListener("load", () => { Plotly = window.Plotly; resolve(); });
    plotlyTag.addEventListener("error", () => reject(new Error("plotly.js did not load")));
  });
  const $ = (id) => document.getElementById(id);
  const box = $("gantt");
  const form = $("filters");
  const status = $("gantt-status");
  const viewStatus = $("view-status");
  const findInput = $("find");
  if (!box || !form || !(Plotly || plotlyTag)) return;

  const NOT_FILTERS = ["after", "lanes", "colour", "event", "partial", "sequence", "window"];
  const WINDOW = ["since", "until"];
  const HIGHLIGHT = "#e11d48";
  let params = new URLSearchParams(window.location.search);
  let selected = null;       // the selected event, as /api/v1/events/{id}/ answers it
  let figureShapes = [];     // shapes of the figure itself, kept under the highlight
  let figureAnnotations = [];  // and its annotations, kept under the overlays' (hooks below)
  let plotted = false;
  let laneNames = [];        // the figure's lanes, full names (its tick labels may be shortened)
  let lanesPerPage = 0;      // how many lanes the plot shows at once
  let firstLane = 0;         // the first lane shown: the plot pages through many lanes
  let drawing = null;        // AbortController of the figure request in flight
  let tableRequest = null;   // and of the table's
  let selecting = 0;         // the latest selection wins when answers cross
  let suggested = null;      // the first window the overview suggested, while it is the window

  function writeURL() {
    const url = new URL(window.location.href);
    url.search = params.toString();
    window.history.replaceState(null, "", url);
  }

  function say(...parts) {
    viewStatus.replaceChildren(...parts);
  }

  // The event filters of the view; without since/until when withWindow is false.
  function filters(withWindow) {
    const query = new URLSearchParams(params);
    for (const name of NOT_FILTERS) query.delete(name);
    if (!withWindow) for (const name of WINDOW) query.delete(name);
    return query;
  }

  // A link to this page: with `only` the given filters (keeping lanes and colour), else the
  // current view; with `eventId` selected.
  function pageLink(only, eventId) {
    let query = new URLSearchParams(params);
    query.delete("after");
    if (only) {
      query = new URLSearchParams();
      for (const name of ["lanes", "colour"]) if (params.get(name)) query.set(name, params.get(name));
      for (const [name, value] of Object.entries(only)) if (value) query.set(name, value);
    }
    if (eventId) query.set("event", eventId);
    return window.location.pathname + "?" + query.toString();
  }

  // --- time: the URL holds RFC 3339 (UTC); plotly wants "yyyy-mm-dd HH:MM:SS.ffffff" ---------

  function toPlotly(iso) {
    if (/[+-]\d\d:?\d\d$/.test(iso) && !/[+-]00:?00$/.test(iso)) {
      iso = new Date(Date.parse(iso)).toISOString();  // another offset: to UTC (ms precision)
    }
    return shortTime(iso);
  }

  function fromPlotly(value) {
    if (typeof value === "number") return new Date(value).toISOString();
    const m = /^(\d{4}-\d\d-\d\d)(?:[ T](\d\d):(\d\d)(?::(\d\d)(\.\d+)?)?)?/.exec(String(value));
    if (!m) return null;
    return m[1] + "T" + (m[2] || "00") + ":" + (m[3] || "00") + ":" + (m[4] || "00") +
      (m[5] || "") + "Z";
  }

  function inWindow(iso) {
    const t = Date.parse(iso);
    const since = params.get("since");
    const until = params.get("until");
    return !(since && t < Date.parse(since)) && !(until && t > Date.parse(until));
  }

  // --- the figure --------------------------------------------------------------------------

  function laneOf(eventId, data) {
    for (const trace of data || []) {
      if (!trace.customdata || !trace.y) continue;  // lifespans, heatmaps: no event ids
      for (let i = 0; i < trace.customdata.length; i++) {
        const c = trace.customdata[i];
        if ((Array.isArray(c) ? c[0] : c) === eventId) {
          return typeof trace.y[i] === "number" ? trace.y[i] : null;
        }
      }
    }
    return null;
  }

  // Hover texts come as numbers into the figure's table of strings (figure.labels), to keep
  // the answer small; joined here as timelines/figures/build.py hover_texts says (a browser test
  // compares the two). A bar is a segment of three points (start, end, gap): its text goes on
  // both ends (a short bar is two pixels wide, and the pointer is as often nearer its end).
  function clock(ms) {
    const micros = ((Math.round(ms * 1000) % 86400e6) + 86400e6) % 86400e6;
    const pad = (n, width) => String(Math.floor(n)).padStart(width, "0");
    return pad(micros / 3600e6, 2) + ":" + pad(micros / 60e6 % 60, 2) + ":" +
      pad(micros / 1e6 % 60, 2) + "." + pad(micros % 1e6, 6);
  }

  function hoverTexts(figure) {
    const strings = figure.labels || [];
    for (const trace of figure.data || []) {
      const {labels, x, y} = trace;
      delete trace.labels;  // not plotly's
      if (!labels) {  // texts of their own (lifespans): each bar's on its end too
        const text = trace.text;
        if (trace.mode !== "lines" || !Array.isArray(text) || !Array.isArray(y)) continue;
        for (let i = 1; i < text.length; i++) {
          if (text[i] === null && y[i] !== null && y[i - 1] !== null) text[i] = text[i - 1];
        }
        continue;
      }
      const parts = labels.parts;
      const text = new Array(x.length).fill(null);
      if (labels.form === "bar") {
        for (let p = 0, i = 0; p < parts.length; p += 4, i += 3) {
          const took = parts[p + 3] < 0 ? "open" : (parts[p + 3] / 1000).toFixed(3) + " ms";
          text[i] = text[i + 1] = clock(x[i]) + " " + labels.kind + " " + strings[parts[p]] +
            " " + strings[parts[p + 1]] + " " + strings[parts[p + 2]] + " (" + took + ")";
        }
      } else {
        for (let i = 0; i < x.length; i++) {
          text[i] = strings[parts[2 * i]] + " by " + strings[parts[2 * i + 1]] + " at " +
            clock(x[i]);
        }
      }
      trace.text = text;
    }
  }

  function highlightShapes(data) {
    if (!selected) return [];
    const t = toPlotly(selected.received);
    const shapes = [{type: "line", name: "selected", xref: "x", yref: "paper", x0: t, x1: t,
                     y0: 0, y1: 1, line: {color: HIGHLIGHT, width: 2}}];
    const lane = laneOf(selected.id, data);
    if (lane !== null) {
      shapes.push({type: "rect", name: "selected lane", xref: "paper", yref: "y", x0: 0, x1: 1,
                   y0: lane - 0.5, y1: lane + 0.5, layer: "below", line: {width: 0},
                   fillcolor: "rgba(225, 29, 72, 0.10)"});
    }
    return shapes;
  }

  function highlight() {
    box.dataset.selected = selected ? selected.id : "";
    const lane = selected && plotted ? laneOf(selected.id, box.data) : null;
    if (lane !== null && (lane < firstLane || lane >= firstLane + lanesPerPage)) {
      showLanes(lane - 2);  // the selection's lane, with two lanes above it for context
    }
    if (plotted) {
      Plotly.relayout(box, {shapes: figureShapes.concat(overlaid("shapes"),
                                                        highlightShapes(box.data)),
                            annotations: figureAnnotations.concat(overlaid("annotations"))});
    }
  }

  async function draw() {
    if (drawing) drawing.abort();
    const controller = drawing = new AbortController();
    const query = filters(true);
    query.set("lanes", params.get("lanes") || form.elements.lanes.value);
    query.set("colour", params.get("colour") || form.elements.colour.value);
    status.textContent = "drawing…";
    let figure;
    try {
      figure = await getJSON(box.dataset.figureUrl + "?" + query.toString(),
                             {signal: controller.signal});
    } catch (err) {
      if (err.name !== "AbortError") {
        status.textContent = "could not draw the timeline (" + err.message + ")";
      }
      return;
    }
    if (controller !== drawing) return;
    drawing = null;
    const meta = figure.meta || {};
    hoverTexts(figure);
    const layout = figure.layout || {};
    layout.xaxis = Object.assign({}, layout.xaxis);
    layout.yaxis = Object.assign({}, layout.yaxis, {fixedrange: true});  // a drag picks time only
    // The same lanes stay in view when they are in the new figure too (a new window, colour).
    const shownLane = laneNames[firstLane];
    laneNames = figure.lanes || [];
    lanesPerPage = Math.min(meta.lanes_per_page || laneNames.length, laneNames.length);
    firstLane = Math.max(0, laneNames.indexOf(shownLane));
    const selectedLane = selected ? laneOf(selected.id, figure.data) : null;
    if (selectedLane !== null &&
        (selectedLane < firstLane || selectedLane >= firstLane + lanesPerPage)) {
      firstLane = Math.max(0, selectedLane - 2);
    }
    if (laneNames.length > lanesPerPage) {
      firstLane = Math.min(firstLane, laneNames.length - lanesPerPage);
      layout.yaxis.range = laneRange();
    }
    layout.dragmode = "zoom";
    const since = params.get("since");
    const until = params.get("until");
    if (since && until) {
      layout.xaxis.range = [toPlotly(since), toPlotly(until)];
      layout.xaxis.autorange = false;
    }
    // plotly's resize (window, detail panel) drops layout.height and takes the div's: give it
    if (layout.height) box.style.height = layout.height + "px";
    try {
      await plotlyReady;
    } catch (err) {
      status.textContent = "could not draw the timeline (" + err.message + ")";
      return;
    }
    if (controller !== drawing && drawing !== null) return;
    figureShapes = layout.shapes || [];
    figureAnnotations = layout.annotations || [];
    layout.shapes = figureShapes.concat(highlightShapes(figure.data));
    await Plotly.react(box, figure.data, layout,
                       {responsive: true, displaylogo: false, showTips: false,
                        // a double click autoscales (which resets the window); plotly's "reset
                        // axes" would zoom to the first figure's extent, a window of its own
                        doubleClick: "autosize",
                        modeBarButtonsToRemove: ["select2d", "lasso2d", "resetScale2d"]});
    if (!plotted) {
      plotted = true;
      box.on("plotly_click", onClick);
      box.on("plotly_relayout", onRelayout);
      box.on("plotly_afterplot", nameLabels);
      // a click on an overlay's marker (a plotly annotation): its layer reads the name
      box.on("plotly_clickannotation", (data) => {
        const name = data && data.annotation && data.annotation.name;
        if (name) box.dispatchEvent(new CustomEvent("hindsight:marker-click", {detail: {name}}));
      });
    }
    box.dataset.mode = meta.mode || "gantt";
    box.dataset.selected = selected ? selected.id : "";
    nameLabels();
    showPager();
    status.textContent = meta.mode === "heatmap"
      ? meta.total + " events: counts per lane and time (drag a narrower window or filter to " +
        "see each one)"
      : meta.spans + " events on " + meta.lanes + " lanes";
    const windowed = since || until;
    const shown = meta.total === undefined ? meta.spans : meta.total;
    $("window-status").textContent = (windowed
      ? "Window " + (since ? shortTime(since) : "…") + " → " + (until ? shortTime(until) : "…")
      : "Whole incident") + " · " + shown + " events" + (isSuggested()
      ? " · " + suggested.outside + (suggested.reason === "gap"
        ? " events far from the rest left out" : " events of a long quiet stretch left out")
      : "");
    $("window-reset").hidden = !windowed;
    // hooks: overlays (annotations, sequence steps) redraw themselves on the new figure
    lanes = null;
    box.dispatchEvent(new CustomEvent("hindsight:figure-drawn", {detail: meta}));
    box.dataset.drawn = String(Number(box.dataset.drawn || 0) + 1);  // a finished draw
  }

  // --- lanes: paging through many, full names on the labels ----------------------------------

  function laneRange() {
    return [firstLane + lanesPerPage - 0.5, firstLane - 0.5];  // top down
  }

  // Show the page of lanes that starts at `first` (kept within the lanes).
  function showLanes(first) {
    const last = Math.max(0, laneNames.length - lanesPerPage);
    const wanted = Math.max(0, Math.min(Math.round(first), last));
    if (wanted === firstLane || laneNames.length <= lanesPerPage) return;
    firstLane = wanted;
    if (plotted) Plotly.relayout(box, {"yaxis.range": laneRange()});
    showPager();
  }

  function showPager() {
    const pager = $("lane-pager");
    if (!pager) return;
    pager.hidden = laneNames.length <= lanesPerPage;
    $("lane-range").textContent = (firstLane + 1) + "–" +
      Math.min(firstLane + lanesPerPage, laneNames.length);
    $("lane-count").textContent = laneNames.length;
    $("lanes-up").disabled = firstLane === 0;
    $("lanes-down").disabled = firstLane + lanesPerPage >= laneNames.length;
  }

  // Each lane label (shortened when long) tells its lane's full name on hover.
  function nameLabels() {
    for (const tick of box.querySelectorAll(".ytick")) {
      const name = tick.__data__ ? laneNames[Math.round(tick.__data__.x)] : undefined;
      const text = tick.querySelector("text");
      if (name === undefined || !text) continue;
      let title = text.querySelector("title");
      if (!title) title = text.appendChild(document.createElementNS(text.namespaceURI, "title"));
      title.textContent = name;
    }
  }

  function onClick(data) {
    const point = data && data.points && data.points[0];
    if (!point) return;
    const id = Array.isArray(point.customdata) ? point.customdata[0] : point.customdata;
    if (Number.isInteger(Number(id)) && id !== null && id !== undefined && id !== "") {
      select(Number(id), false);
    }
  }

  // A drag (zoom) on the x axis chooses the window; autoscale (double click) resets it. Our
  // own relayouts (the highlight's shapes, resizes) carry no x range and pass through.
  function onRelayout(update) {
    if (update["xaxis.autorange"]) {
      resetWindow();
      return;
    }
    let start = update["xaxis.range[0]"];
    let end = update["xaxis.range[1]"];
    if (start === undefined && Array.isArray(update["xaxis.range"])) {
      [start, end] = update["xaxis.range"];
    }
    if (start === undefined || end === undefined) return;
    const since = fromPlotly(start);
    const until = fromPlotly(end);
    if (since && until) setWindow(since, until);
  }

  function resize() {
    if (plotted && Plotly.Plots && Plotly.Plots.resize) Plotly.Plots.resize(box);
  }

  // --- the window and the table --------------------------------------------------------------

  function setWindow(since, until) {
    for (const [name, value] of [["since", since], ["until", until]]) {
      if (value) params.set(name, value); else params.delete(name);
      form.elements[name].value = value || "";
    }
    params.delete("after");  // the table's page cursor belongs to the old window
    // the whole span chosen on purpose stays chosen on a reload (no suggested window then)
    if (since || until) params.delete("window"); else params.set("window", "all");
    writeURL();
    refreshTable();
    return draw();
  }

  function resetWindow() {
    if (!params.has("since") && !params.has("until")) return Promise.resolve();
    return setWindow(null, null);
  }

  // The overview of the filtered events over their whole span (no window): the overview strip
  // draws it, and it suggests the first window when the URL names none (``window``: where the
  // events are, leaving out isolated stragglers and a long quiet tail).
  const spanOverview = box.dataset.overviewUrl
    ? getJSON(box.dataset.overviewUrl + "?" + filters(false).toString()).catch(() => null)
    : Promise.resolve(null);

  function isSuggested() {
    return suggested !== null && params.get("since") === suggested.since &&
      params.get("until") === suggested.until;
  }

  // The first view: the window the URL names, else the suggested one, else the whole span (also
  // for a URL that selects an event, which the suggested window might leave out).
  async function firstWindow() {
    if (params.has("since") || params.has("until") || params.has("event") ||
        params.get("window") === "all") return;
    const overview = await spanOverview;
    const wanted = overview && overview.window;
    if (!wanted || params.has("since") || params.has("until")) return;
    suggested = wanted;
    for (const name of WINDOW) {
      params.set(name, wanted[name]);
      form.elements[name].value = wanted[name];
    }
    refreshTable();  // the server rendered the whole span's first rows
  }

  // Keep the window's width and centre it on `iso`; a one-sided window is dropped instead.
  function moveWindowTo(iso) {
    const since = Date.parse(params.get("since"));
    const until = Date.parse(params.get("until"));
    if (Number.isNaN(since) || Number.isNaN(until)) return resetWindow();
    const width = until - since;
    const start = Date.parse(iso) - width / 2;
    return setWindow(new Date(start).toISOString(), new Date(start + width).toISOString());
  }

  async function refreshTable() {
    if (tableRequest) tableRequest.abort();
    const controller = tableRequest = new AbortController();
    const query = new URLSearchParams(params);
    query.set("partial", "events");
    let html;
    try {
      const answer = await fetch(window.location.pathname + "?" + query.toString(),
                                 {credentials: "same-origin", signal: controller.signal});
      if (!answer.ok) throw new Error("HTTP " + answer.status);
      html = await answer.text();
    } catch (err) {
      if (err.name !== "AbortError") say("could not load the events (" + err.message + ")");
      return;
    }
    if (controller !== tableRequest) return;
    tableRequest = null;
    // server-rendered and escaped by Django's templates; parsed, not assigned as innerHTML
    const fresh = new DOMParser().parseFromString(html, "text/html").getElementById("events-table");
    if (fresh) $("events-table").replaceWith(document.adoptNode(fresh));
    markSelectedRow();
  }

  function markSelectedRow() {
    for (const row of document.querySelectorAll("#events-table tr.selected")) {
      row.classList.remove("selected");
    }
    const row = selected && document.querySelector(
      '#events-table tr[data-event="' + Number(selected.id) + '"]');
    if (row) row.classList.add("selected");
  }

  // --- selection -----------------------------------------------------------------------------

  async function select(id, reveal) {
    const ticket = ++selecting;
    let event;
    try {
      event = await getJSON(box.dataset.eventUrl + Number(id) + "/");
    } catch (err) {
      if (ticket === selecting) say("could not open event " + id + " (" + err.message + ")");
      return;
    }
    if (ticket !== selecting) return;
    selected = event;
    params.set("event", event.id);
    writeURL();
    Detail.show(event);
    announceSelection();
    markSelectedRow();
    resize();
    if (reveal && !inWindow(event.received)) await moveWindowTo(event.received);
    else highlight();
    if (reveal) revealSelected();
  }

  function closeDetail() {
    selecting++;
    selected = null;
    params.delete("event");
    writeURL();
    Detail.hide();
    announceSelection();
    markSelectedRow();
    resize();
    highlight();
  }

  // Scroll the page to the selected event's lane when it is out of sight.
  function revealSelected() {
    if (!selected) return;
    const full = box._fullLayout;  // plotly's computed layout: where each lane is drawn
    const lane = laneOf(selected.id, box.data);
    let offset = 0;
    if (lane !== null && full && full.yaxis && full.yaxis.l2p && full._size) {
      offset = full._size.t + full.yaxis.l2p(lane);
    }
    const y = box.getBoundingClientRect().top + offset;
    if (y < 60 || y > window.innerHeight - 40) {
      window.scrollBy({top: y - window.innerHeight / 3});
    }
  }

  // j/k and find-next: the neighbour of the selection in the current filters, past the window
  // (which then pans); with nothing selected, the first (last) event inside the window.
  let pending = 0;
  let queue = Promise.resolve();

  function step(direction, text) {
    if (pending > 2) return queue;  // a held key must not pile up requests
    pending++;
    queue = queue.then(() => stepNow(direction, text)).finally(() => { pending--; });
    return queue;
  }

  async function stepNow(direction, text) {
    const query = filters(!selected);
    if (selected) query.set("from", selected.id);
    query.set("direction", direction);
    if (text) query.append("q", text);
    let answer;
    try {
      answer = await getJSON(box.dataset.stepUrl + "?" + query.toString());
    } catch (err) {
      say("could not step (" + err.message + ")");
      return;
    }
    if (!answer.event) {
      say(text ? "No " + (direction === "next" ? "further" : "earlier") + " event contains “" +
                 text + "”." : "No " + (direction === "next" ? "later" : "earlier") +
                 " event in these filters.");
      return;
    }
    say(text ? "Found “" + text + "” in event " + answer.event.id + "." : "");
    await select(answer.event.id, true);
  }

  // --- wiring --------------------------------------------------------------------------------

  form.addEventListener("change", (e) => {
    const name = e.target.name;
    if (name !== "lanes" && name !== "colour") return;
    params.set(name, e.target.value);
    writeURL();
    draw();
  });

  // Submit without the empty inputs, keeping the selection: a short URL worth sharing.
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    const query = new URLSearchParams();
    for (const [name, value] of new FormData(form)) {
      if (String(value).trim()) query.append(name, String(value).trim());
    }
    if (selected) query.set("event", selected.id);
    if (params.get("sequence")) query.set("sequence", params.get("sequence"));  // hooks
    window.location.search = query.toString();
  });

  $("window-reset").addEventListener("click", resetWindow);
  $("lanes-up").addEventListener("click", () => showLanes(firstLane - lanesPerPage));
  $("lanes-down").addEventListener("click", () => showLanes(firstLane + lanesPerPage));
  $("find-next").addEventListener("click", () => {
    if (findInput.value.trim()) step("next", findInput.value.trim()); else findInput.focus();
  });
  findInput.addEventListener("keydown", (e) => {
    if (e.key !== "Enter") return;
    e.preventDefault();
    if (findInput.value.trim()) step(e.shiftKey ? "previous" : "next", findInput.value.trim());
  });

  $("copy-link").addEventListener("click", async () => {
    const url = window.location.href;
    try {
      await navigator.clipboard.writeText(url);
      say("Link copied.");
    } catch (err) {  // no clipboard here (plain http, permissions): let the user copy it
      const input = el("input", {id: "copy-link-url", value: url, readonly: true, size: 50});
      say("Copy this link: ", input);
      input.select();
    }
  });

  document.addEventListener("keydown", (e) => {
    if (e.ctrlKey || e.metaKey || e.altKey) return;
    if (e.target.closest && e.target.closest("input, textarea, select, [contenteditable]")) return;
    if (e.key === "j" || e.key === "ArrowDown") {
      e.preventDefault();
      step("next");
    } else if (e.key === "k" || e.key === "ArrowUp") {
      e.preventDefault();
      step("previous");
    } else if (e.key === "Escape" && selected) {
      closeDetail();
    }
  });

  // a row of the table selects its event (unless the click was on a link or selected text)
  document.addEventListener("click", (e) => {
    const row = e.target.closest && e.target.closest("#events-table tr[data-event]");
    if (!row || e.target.closest("a") || String(window.getSelection())) return;
    select(Number(row.dataset.event), true);
  });

  // --- integration hooks for notes.js, sequences.js and share.js -------------------------------
  // Overlays are named layers of shapes and annotations drawn over the figure, between its own
  // and the selection's; each layer redraws itself on "hindsight:figure-drawn" (box), learns of
  // clicks on its markers from "hindsight:marker-click" (box; detail: {name} of the marker),
  // and "hindsight:selection" (document) says which event is selected (detail: {event} or null).

  const overlays = new Map();
  let lanes = null;  // event id → lane of the current figure, built when first asked

  function overlaid(key) {
    return [].concat(...[...overlays.values()].map((layer) => layer[key] || []));
  }

  function setOverlay(name, layer) {
    overlays.set(name, layer);
    highlight();
  }

  function laneIndex(eventId) {
    if (!lanes) {
      lanes = new Map();
      for (const trace of box.data || []) {
        if (!trace.customdata || !trace.y) continue;
        trace.customdata.forEach((c, i) => {
          const id = Array.isArray(c) ? c[0] : c;
          if (id !== null && typeof trace.y[i] === "number" && !lanes.has(id)) {
            lanes.set(id, trace.y[i]);
          }
        });
      }
    }
    return lanes.has(eventId) ? lanes.get(eventId) : null;
  }

  function announceSelection() {
    document.dispatchEvent(new CustomEvent("hindsight:selection", {detail: {event: selected}}));
  }

  function setParam(name, value) {
    if (value === null || value === undefined || value === "") params.delete(name);
    else params.set(name, value);
    writeURL();
  }

  window.HindsightTimeline = {
    select: (id) => select(id, true), setWindow, setOverlay, setParam, toPlotly,
    laneOf: laneIndex, selected: () => selected, param: (name) => params.get(name),
    filters, spanOverview, box,
  };

  Detail.init({eventUrl: box.dataset.eventUrl, eventsUrl: box.dataset.eventsUrl,
               linkFor: pageLink, onClose: closeDetail, onSelect: (id) => select(id, true)});
  firstWindow().finally(draw);
  if (/^\d+$/.test(params.get("event") || "")) select(Number(params.get("event")), false);
})();
