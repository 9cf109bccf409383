// Incident page: root-cause sequences. A sequence tells a root cause as numbered steps on the
// evidence (events, or annotations); an incident may have several. The chosen one is part of
// the view (sequence=<id> in the URL, so permalinks and share links open it): its steps are
// listed with what each event shows, the note, the delta from the previous step and the offset
// from the first, and drawn on the plot as numbered markers on their events' lanes (at the top
// when a lane is not drawn). Clicking a step or its marker selects its event. Writers create
// sequences, add the selected event as a step (at the end or after the chosen step), reorder,
// remove and annotate steps; the API refuses anyone else anyway.
// Loaded before timeline.js, whose hooks it uses: it starts once every deferred script has run.
document.addEventListener("DOMContentLoaded", () => {
  "use strict";
  const {el, getAll, sendJSON, shortTime, plotlyText, formatDuration} = window.Hindsight;
  const Timeline = window.HindsightTimeline;
  const $ = (id) => document.getElementById(id);
  const panel = $("sequences");
  if (!panel || !Timeline) return;
  const canWrite = $("notes-side").dataset.canWrite === "1";
  const chooser = $("sequence-select");
  const steps = $("sequence-steps");
  const stepForm = $("step-form");  // only for writers
  const COLOUR = "#1d4ed8";
  const POINT_WINDOW_MS = 30_000;
  let sequences = [];
  let current = null;   // the chosen sequence, as the API answers it (with its steps)
  let chosenStep = null;  // id of the step clicked last: "after the chosen step" inserts there

  function say(text) {
    $("sequences-status").textContent = text;
  }

  const itemUrl = (id) => panel.dataset.itemUrl + id + "/";

  // --- loading and choosing ------------------------------------------------------------------

  async function load(choose) {
    try {
      sequences = await getAll(panel.dataset.listUrl + "?page_size=500");
    } catch (err) {
      say("could not load the sequences (" + err.message + ")");
      return;
    }
    chooser.replaceChildren(chooser.options[0],
      ...sequences.map((s) => el("option", {value: s.id}, label(s))));
    const wanted = choose === undefined ? Timeline.param("sequence") : choose;
    if (wanted && !sequences.some((s) => String(s.id) === String(wanted))) {
      say("Sequence " + wanted + " is not in this incident (deleted?).");
    }
    select(wanted);
  }

  function label(sequence) {
    const n = sequence.steps.length;
    return sequence.title + " (" + n + " step" + (n === 1 ? "" : "s") + ")";
  }

  function select(id) {
    current = sequences.find((s) => String(s.id) === String(id)) || null;
    chooser.value = current ? String(current.id) : "";
    if (!current || !current.steps.some((s) => s.id === chosenStep)) chosenStep = null;
    Timeline.setParam("sequence", current ? current.id : null);
    render();
    drawMarkers();
  }

  // An answer of a step route: the whole sequence, renumbered.
  function replace(sequence) {
    const at = sequences.findIndex((s) => s.id === sequence.id);
    if (at >= 0) sequences[at] = sequence; else sequences.push(sequence);
    const option = [...chooser.options].find((o) => o.value === String(sequence.id));
    if (option) option.textContent = label(sequence);
    else chooser.append(el("option", {value: sequence.id}, label(sequence)));
    select(sequence.id);
  }

  // --- the steps -----------------------------------------------------------------------------

  function render() {
    $("sequence-view").hidden = !current;
    steps.replaceChildren();
    updateActions();
    if (!current) return;
    const offsets = current.steps.map((s) => s.offset_ms);
    $("sequence-meta").textContent = label(current) + (current.author ? " · by " + current.author
      : "") + (offsets.length > 1 ? " · spans " + formatDuration(
      Math.max(...offsets) - Math.min(...offsets)) : "");
    $("sequence-export-md").href = itemUrl(current.id).replace(/\/$/, "") + "/export.md";
    $("sequence-export-json").href = itemUrl(current.id).replace(/\/$/, "") + "/export.json";
    steps.replaceChildren(...current.steps.map(stepEntry));
    if (!current.steps.length) {
      steps.append(el("li", {class: "empty"}, canWrite
        ? "No steps yet: select an event on the timeline and add it." : "No steps yet."));
    }
  }

  function offset(ms) {
    return ms === 0 ? "T+0" : (ms < 0 ? "T−" : "T+") + formatDuration(ms);
  }

  function stepEntry(step, index) {
    const last = index === current.steps.length - 1;
    const actions = canWrite ? el("span", {class: "step-actions"},
      el("button", {type: "button", class: "quiet up", title: "Move up", disabled: index === 0,
                    onclick: () => move(step, -1)}, "↑"),
      el("button", {type: "button", class: "quiet down", title: "Move down", disabled: last,
                    onclick: () => move(step, 1)}, "↓"),
      el("button", {type: "button", class: "quiet edit-note", onclick: () => editNote(step)},
         "Edit note"),
      el("button", {type: "button", class: "quiet remove",
                    onclick: (e) => armThen(e.currentTarget, () => removeStep(step))},
         "Remove")) : null;
    return el("li", {class: "step" + (step.id === chosenStep ? " chosen" : ""),
                     dataset: {step: step.id, event: step.event ?? ""}},
      el("span", {class: "step-no", "aria-hidden": "true"}, step.position),
      el("div", {class: "step-main"},
        el("p", {class: "step-head"},
          el("a", {href: "#", class: "step-time", title: "Show on the timeline",
                   onclick: (e) => { e.preventDefault(); choose(step); }}, shortTime(step.at)),
          " ", el("span", {class: "step-delta"}, step.delta_ms === null ? "start" : step.delta),
          " ", el("span", {class: "step-offset hint"}, offset(step.offset_ms))),
        el("p", {class: "step-desc"}, step.description || "(no description)"),
        el("p", {class: "step-note"}, step.note),
        actions));
  }

  // Choose a step: mark it, and select its event (or show the time it stands for).
  function choose(step) {
    chosenStep = step.id;
    for (const row of steps.querySelectorAll("li.step")) {
      row.classList.toggle("chosen", row.dataset.step === String(step.id));
    }
    updateActions();
    if (step.event !== null) return Timeline.select(step.event);
    const at = Date.parse(step.at);
    return Timeline.setWindow(new Date(at - POINT_WINDOW_MS).toISOString(),
                              new Date(at + POINT_WINDOW_MS).toISOString());
  }

  function armThen(button, action) {
    if (button.dataset.armed) {
      action();
      return;
    }
    const text = button.textContent;
    button.dataset.armed = "1";
    button.textContent = "Really?";
    button.classList.add("danger");
    setTimeout(() => {
      delete button.dataset.armed;
      button.textContent = text;
      button.classList.remove("danger");
    }, 4000);
  }

  async function write(url, method, data, failure) {
    try {
      return await sendJSON(url, method, data);
    } catch (err) {
      say(failure + " (" + err.message + ")");
      return null;
    }
  }

  async function move(step, by) {
    const order = current.steps.map((s) => s.id);
    const from = order.indexOf(step.id);
    order.splice(from, 1);
    order.splice(from + by, 0, step.id);
    const answer = await write(itemUrl(current.id) + "reorder/", "POST", {order},
                               "could not reorder");
    if (answer) replace(answer);
  }

  async function removeStep(step) {
    const answer = await write(itemUrl(current.id) + "steps/" + step.id + "/", "DELETE",
                               undefined, "could not remove the step");
    if (answer) replace(answer);
  }

  function editNote(step) {
    const row = steps.querySelector('li[data-step="' + step.id + '"]');
    const input = el("input", {class: "step-note-input", value: step.note, size: 28,
                               "aria-label": "Note of step " + step.position});
    const editor = el("form", {class: "row"}, input,
      el("button", {class: "quiet"}, "Save"),
      el("button", {type: "button", class: "quiet", onclick: render}, "Cancel"));
    editor.addEventListener("submit", async (e) => {
      e.preventDefault();
      const items = current.steps.map((s) => (s.id === step.id ? {id: s.id, note: input.value}
        : {id: s.id}));
      const answer = await write(itemUrl(current.id), "PATCH", {steps: items},
                                 "could not save the note");
      if (answer) replace(answer);
    });
    row.querySelector(".step-note").replaceWith(editor);
    input.focus();
  }

  // --- markers on the plot -------------------------------------------------------------------

  function drawMarkers() {
    const shapes = [];
    const numbers = [];
    for (const step of current ? current.steps : []) {
      const x = Timeline.toPlotly(step.at);
      const marker = {name: "step:" + step.id, text: String(step.position), xref: "x", x,
                      hovertext: plotlyText(step.position + ". " + (step.description || "") +
                                            (step.note ? " — " + step.note : "")),
                      captureevents: true, font: {size: 11, color: "#fff"}, bgcolor: COLOUR,
                      borderpad: 2};
      const lane = step.event === null ? null : Timeline.laneOf(step.event);
      if (lane !== null) {
        numbers.push(Object.assign(marker, {yref: "y", y: lane, showarrow: true, arrowhead: 0,
                                            arrowcolor: COLOUR, ax: 12, ay: -16}));
      } else {
        // above the plot (its top margin), where it covers no lane
        numbers.push(Object.assign(marker, {yref: "paper", y: 1, yanchor: "bottom",
                                            showarrow: false}));
        shapes.push({type: "line", name: "step:" + step.id, xref: "x", yref: "paper",
                     x0: x, x1: x, y0: 0, y1: 1, line: {color: COLOUR, width: 1, dash: "dot"}});
      }
    }
    Timeline.setOverlay("sequence", {shapes, annotations: numbers});
  }

  function onMarker(event) {
    const name = event.detail.name;
    if (!current || !name.startsWith("step:")) return;
    const step = current.steps.find((s) => "step:" + s.id === name);
    if (step) choose(step);
  }

  Timeline.box.addEventListener("hindsight:marker-click", onMarker);
  Timeline.box.addEventListener("hindsight:figure-drawn", () => {
    drawMarkers();
  });

  // --- writing (writers) ---------------------------------------------------------------------

  function updateActions() {
    if (!stepForm) return;
    const selected = Timeline.selected();
    const add = $("step-add");
    add.disabled = !current || !selected;
    add.textContent = selected ? "Add event " + selected.id + " as step"
      : "Add selected event as step";
    const after = stepForm.elements.where.options[1];
    const step = current && current.steps.find((s) => s.id === chosenStep);
    after.disabled = !step;
    after.textContent = step ? "after step " + step.position : "after the chosen step";
    if (after.disabled && stepForm.elements.where.value === "after") {
      stepForm.elements.where.value = "end";
    }
  }

  async function addStep(e) {
    e.preventDefault();
    const selected = Timeline.selected();
    if (!current || !selected) return;
    const data = {event: selected.id, note: stepForm.elements.note.value};
    const step = current.steps.find((s) => s.id === chosenStep);
    if (stepForm.elements.where.value === "after" && step) data.position = step.position + 1;
    const answer = await write(itemUrl(current.id) + "steps/", "POST", data,
                               "could not add the step");
    if (!answer) return;
    stepForm.elements.note.value = "";
    say("Added event " + selected.id + ".");
    replace(answer);
  }

  async function create(e) {
    e.preventDefault();
    const title = e.target.elements.title.value.trim();
    if (!title) return;
    const answer = await write(panel.dataset.listUrl, "POST", {title, steps: []},
                               "could not create the sequence");
    if (!answer) return;
    e.target.reset();
    say("");
    replace(answer);
  }

  async function removeSequence() {
    try {
      await sendJSON(itemUrl(current.id), "DELETE");
    } catch (err) {
      say("could not delete the sequence (" + err.message + ")");
      return;
    }
    sequences = sequences.filter((s) => s.id !== current.id);
    const option = [...chooser.options].find((o) => o.value === String(current.id));
    if (option) option.remove();
    select(null);
  }

  chooser.addEventListener("change", () => {
    say("");
    select(chooser.value || null);
  });
  document.addEventListener("hindsight:selection", updateActions);
  if (stepForm) {
    stepForm.addEventListener("submit", addStep);
    $("sequence-new").addEventListener("submit", create);
    $("sequence-delete").addEventListener("click", (e) => armThen(e.currentTarget,
                                                                  removeSequence));
  }
  load();
});
