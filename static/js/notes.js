// Incident page: annotations beside the Gantt. A note (Markdown, rendered and sanitized by the
// server) on one event or on a time range, with tags and a star. The panel lists the incident's
// annotations under its own filter (tags, any of; starred; text) and draws the listed ones on
// the plot: a marker on the event's lane (at the top when the lane is not drawn), a translucent
// band for a range. Clicking an entry or a marker selects its event or zooms to its range.
// Writers (data-can-write) create, edit, star and delete; the API refuses anyone else anyway.
// Loaded before timeline.js, whose hooks it uses: it starts once every deferred script has run.
document.addEventListener("DOMContentLoaded", () => {
  "use strict";
  const {el, getAll, sendJSON, shortTime, plotlyText, formatDuration} = window.Hindsight;
  const Timeline = window.HindsightTimeline;
  const $ = (id) => document.getElementById(id);
  const panel = $("annotations");
  if (!panel || !Timeline) return;
  const canWrite = $("notes-side").dataset.canWrite === "1";
  const list = $("annotation-list");
  const filterForm = $("annotation-filter");
  const form = $("annotation-form");  // only for writers
  const MARK = "#b45309";
  const STAR = "#ca8a04";
  const BAND = "rgba(217, 119, 6, 0.13)";
  const POINT_WINDOW_MS = 30_000;  // a point without an event opens ±30 s around it
  let annotations = [];  // as the filter lists them, in (start, id) order
  let target = null;     // what the open form writes: {event}, {start, end} or {annotation}
  let loading = 0;       // the latest list request wins

  function say(text) {
    $("annotations-status").textContent = text;
  }

  // --- the list ----------------------------------------------------------------------------

  function filterQuery() {
    const query = new URLSearchParams({page_size: "2000"});
    for (const tag of filterForm.elements.tag.value.split(",")) {
      if (tag.trim()) query.append("tag", tag.trim());
    }
    const text = filterForm.elements.q.value.trim();
    if (text) query.set("q", text);
    if (filterForm.elements.starred.checked) query.set("starred", "true");
    return query;
  }

  async function load() {
    const ticket = ++loading;
    let items;
    try {
      items = await getAll(panel.dataset.listUrl + "?" + filterQuery().toString());
    } catch (err) {
      if (ticket === loading) say("could not load the annotations (" + err.message + ")");
      return;
    }
    if (ticket !== loading) return;
    annotations = items;
    render();
    drawMarkers();
    panel.dataset.loaded = String(Number(panel.dataset.loaded || 0) + 1);  // for tests
  }

  // "2018-10-26 13:05:12" (an event's: when it was received), or a range "2018-10-26
  // 13:05:12 → 13:07:40" (the end's date only when it differs)
  function when(a) {
    const start = shortTime(a.start);
    if (a.event !== null || !a.end || a.end === a.start) return start;
    const end = shortTime(a.end);
    return start + " → " + (end.slice(0, 10) === start.slice(0, 10) ? end.slice(11) : end);
  }

  function what(a) {
    if (a.event !== null) return "event " + a.event;
    if (!a.end) return "a moment";
    return "range of " + formatDuration(Date.parse(a.end) - Date.parse(a.start));
  }

  function render() {
    const filtered = filterQuery().toString() !== "page_size=2000";
    $("annotations-count").textContent = annotations.length + (filtered ? " shown" : "");
    list.replaceChildren(...annotations.map(entry));
    say(annotations.length ? "" : filtered ? "No annotation matches." : "No annotations yet.");
  }

  function entry(a) {
    const star = canWrite
      ? el("button", {type: "button", class: "star", "aria-pressed": String(a.starred),
                      title: a.starred ? "Unstar" : "Star", onclick: () => toggleStar(a)},
           a.starred ? "★" : "☆")
      : el("span", {class: "star", title: a.starred ? "starred" : null}, a.starred ? "★" : "");
    const body = el("div", {class: "note-body"});
    body.innerHTML = a.note_html;  // the one HTML we insert: rendered and sanitized server-side
    const tags = a.tags.map((tag) => el("button", {
      type: "button", class: "tag", dataset: {tag}, title: "Show only this tag",
      onclick: () => { filterForm.elements.tag.value = tag; load(); }}, tag));
    const actions = canWrite ? el("span", {class: "note-actions"},
      el("button", {type: "button", class: "quiet edit", onclick: () => openForm({annotation: a})},
         "Edit"),
      el("button", {type: "button", class: "quiet delete",
                    onclick: (e) => confirmThen(e.currentTarget, "Really delete?",
                                                () => remove(a))}, "Delete")) : null;
    const kind = "note" + (a.starred ? " starred" : "") + (a.event === null ? " range" : "");
    return el("li", {class: kind, dataset: {annotation: a.id, event: a.event ?? ""}},
      el("div", {class: "note-head"}, star,
         el("a", {href: "#", class: "note-when", title: "Show on the timeline",
                  onclick: (e) => { e.preventDefault(); focus(a); }}, when(a)),
         el("span", {class: "hint"}, " · " + what(a) + (a.author ? " · " + a.author : ""))),
      body, tags.length ? el("p", {class: "tags"}, tags) : null, actions);
  }

  // Select the annotation's event, or zoom the window to its range.
  function focus(a) {
    if (a.event !== null) return Timeline.select(a.event);
    const start = Date.parse(a.start);
    const end = a.end ? Date.parse(a.end) : start;
    const pad = end > start ? 0 : POINT_WINDOW_MS;
    return Timeline.setWindow(new Date(start - pad).toISOString(),
                              new Date(end + pad).toISOString());
  }

  // A destructive button asks once more: the first click arms it for a few seconds.
  function confirmThen(button, question, action) {
    if (button.dataset.armed) {
      action();
      return;
    }
    const label = button.textContent;
    button.dataset.armed = "1";
    button.textContent = question;
    button.classList.add("danger");
    setTimeout(() => {
      delete button.dataset.armed;
      button.textContent = label;
      button.classList.remove("danger");
    }, 4000);
  }

  async function toggleStar(a) {
    try {
      await sendJSON(panel.dataset.itemUrl + a.id + "/", "PATCH", {starred: !a.starred});
    } catch (err) {
      say("could not star it (" + err.message + ")");
      return;
    }
    load();
  }

  async function remove(a) {
    try {
      await sendJSON(panel.dataset.itemUrl + a.id + "/", "DELETE");
    } catch (err) {
      say("could not delete it (" + err.message + ")");
      return;
    }
    if (target && target.annotation && target.annotation.id === a.id) closeForm();
    load();
  }

  // --- markers on the plot -------------------------------------------------------------------

  function drawMarkers() {
    const shapes = [];
    const notes = [];
    for (const a of annotations) {
      const x = Timeline.toPlotly(a.start);
      const hover = plotlyText((a.starred ? "★ " : "") + (a.label || "(no text)") +
                               (a.tags.length ? "  [" + a.tags.join(", ") + "]" : ""));
      const marker = {name: "note:" + a.id, text: a.starred ? "★" : "✎", hovertext: hover,
                      captureevents: true, font: {size: 11, color: "#fff"},
                      bgcolor: a.starred ? STAR : MARK, borderpad: 2, xref: "x", x};
      const lane = a.event === null ? null : Timeline.laneOf(a.event);
      if (lane !== null) {
        notes.push(Object.assign(marker, {yref: "y", y: lane, showarrow: true, arrowhead: 0,
                                          arrowcolor: MARK, ax: -12, ay: -16}));
        continue;
      }
      // no lane for it in this figure (a range, a heatmap, another lane grouping): above the
      // plot (its top margin), where it covers no lane
      notes.push(Object.assign(marker, {yref: "paper", y: 1, yanchor: "bottom", xanchor: "left",
                                        showarrow: false}));
      if (a.event === null && a.end) {
        shapes.push({type: "rect", name: "note:" + a.id, xref: "x", yref: "paper",
                     x0: x, x1: Timeline.toPlotly(a.end), y0: 0, y1: 1, layer: "below",
                     line: {width: 0}, fillcolor: BAND});
      } else {
        shapes.push({type: "line", name: "note:" + a.id, xref: "x", yref: "paper", x0: x, x1: x,
                     y0: 0, y1: 1, line: {color: MARK, width: 1, dash: "dot"}});
      }
    }
    Timeline.setOverlay("annotations", {shapes, annotations: notes});
  }

  function onMarker(event) {
    const name = event.detail.name;
    if (!name.startsWith("note:")) return;
    const a = annotations.find((item) => "note:" + item.id === name);
    if (a) {
      focus(a);
      const row = list.querySelector('li[data-annotation="' + a.id + '"]');
      if (row) row.scrollIntoView({block: "nearest"});
    }
  }

  Timeline.box.addEventListener("hindsight:marker-click", onMarker);
  Timeline.box.addEventListener("hindsight:figure-drawn", () => {
    drawMarkers();
    updateActions();
  });

  // --- the form (writers) --------------------------------------------------------------------

  function eventSummary(event) {
    const object = [event.resource, event.namespace, event.name].filter(Boolean).join("/");
    return [shortTime(event.received), event.verb, object].filter(Boolean).join(" · ");
  }

  function openForm(given) {
    if (!form) return;
    target = given;
    const a = given.annotation;
    form.elements.note.value = a ? a.note : "";
    form.elements.tags.value = a ? a.tags.join(", ") : "";
    form.elements.starred.checked = a ? a.starred : false;
    $("annotation-target").textContent = a
      ? "Editing the note on " + what(a) + " (" + when(a) + ")"
      : given.event ? "On event " + given.event.id + ": " + eventSummary(given.event)
        : "On the window " + shortTime(given.start) + " → " + shortTime(given.end);
    $("annotation-save").textContent = a ? "Save changes" : "Save annotation";
    form.hidden = false;
    form.scrollIntoView({block: "nearest"});
    form.elements.note.focus();
  }

  function closeForm() {
    target = null;
    if (form) form.hidden = true;
  }

  async function save(e) {
    e.preventDefault();
    const data = {note: form.elements.note.value,
                  tags: form.elements.tags.value.split(",").map((t) => t.trim()).filter(Boolean),
                  starred: form.elements.starred.checked};
    let url = panel.dataset.listUrl;
    let method = "POST";
    if (target.annotation) {
      url = panel.dataset.itemUrl + target.annotation.id + "/";
      method = "PATCH";
    } else if (target.event) {
      data.event = target.event.id;
    } else {
      data.start = target.start;
      data.end = target.end;
    }
    const button = $("annotation-save");
    button.disabled = true;
    try {
      await sendJSON(url, method, data);
    } catch (err) {
      say("could not save the annotation (" + err.message + ")");
      return;
    } finally {
      button.disabled = false;
    }
    closeForm();
    say(method === "POST" ? "Annotation saved." : "Annotation updated.");
    load();
  }

  function updateActions() {
    if (!form) return;
    const selected = Timeline.selected();
    $("annotate-event").disabled = !selected;
    $("annotate-event").title = selected ? "Annotate event " + selected.id
      : "Select an event first";
    $("annotate-window").disabled = !(Timeline.param("since") && Timeline.param("until"));
  }

  function annotateSelected() {
    const selected = Timeline.selected();
    if (selected) openForm({event: selected});
  }

  // "Annotate this event" in the event detail panel, for writers.
  function addDetailButton() {
    const links = $("detail-links");
    if (!canWrite || !links || $("detail-annotate")) return;
    links.after(el("p", {class: "row", id: "detail-notes"},
      el("button", {type: "button", class: "quiet", id: "detail-annotate",
                    onclick: annotateSelected}, "Annotate this event")));
  }

  // --- wiring --------------------------------------------------------------------------------

  let typing = null;
  filterForm.addEventListener("input", () => {
    clearTimeout(typing);
    typing = setTimeout(load, 250);
  });
  filterForm.addEventListener("submit", (e) => {
    e.preventDefault();
    load();
  });
  document.addEventListener("hindsight:selection", updateActions);
  if (form) {
    form.addEventListener("submit", save);
    $("annotation-cancel").addEventListener("click", closeForm);
    $("annotate-event").addEventListener("click", annotateSelected);
    $("annotate-window").addEventListener("click", () => openForm(
      {start: Timeline.param("since"), end: Timeline.param("until")}));
    addDetailButton();
  }
  updateActions();
  load();
});
