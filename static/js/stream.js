// A stream's live view: the newest events, following the tail (the events API polled once a
// second from the last event seen), and a click on two events to take their times as the
// window to cut.
const table = document.getElementById("tail");
const body = table.querySelector("tbody");
const follow = document.getElementById("follow");
const KEEP = 500;
const seen = new Set();
let since = null;
let picks = [];

function cell(text) {
  const td = document.createElement("td");
  td.textContent = text ?? "";
  return td;
}

function add(event) {
  if (seen.has(event.id)) return;
  seen.add(event.id);
  const tr = document.createElement("tr");
  tr.dataset.received = event.received;
  for (const value of [event.received, event.user, event.verb, event.resource, event.namespace,
                       event.name, event.code, event.stage]) tr.append(cell(value));
  body.prepend(tr);
  while (body.rows.length > KEEP) body.deleteRow(body.rows.length - 1);
}

async function poll() {
  if (follow.checked) {
    const params = new URLSearchParams({page_size: "1000"});
    if (since) params.set("since", since);
    try {
      let url = `${table.dataset.url}?${params}`;
      while (url) {
        const answer = await fetch(url, {credentials: "same-origin"});
        if (!answer.ok) break;
        const page = await answer.json();
        for (const event of page.results) {
          add(event);
          if (!since || event.received > since) since = event.received;
        }
        url = page.next;
      }
      const newest = document.getElementById("stream-newest");
      if (since && newest) newest.textContent = since;
    } catch (error) {
      console.warn("stream tail:", error);
    }
  }
  setTimeout(poll, 1000);
}

body.addEventListener("click", (click) => {
  const row = click.target.closest("tr");
  const sinceInput = document.getElementById("cut-since");
  if (!row || !sinceInput) return;
  picks = [...picks, row.dataset.received].slice(-2).sort();
  sinceInput.value = picks[0];
  document.getElementById("cut-until").value = picks[picks.length - 1];
});

// The incident page's Gantt of the last minutes (GET /api/v1/streams/{id}/figure/), redrawn
// every two seconds while following. Hover texts come as numbers into figure.labels, joined
// as static/js/timeline.js joins them (bars only: the tail has no lifespans to label).
const figureBox = document.getElementById("stream-figure");

function clock(ms) {
  const micros = ((Math.round(ms * 1000) % 86400e6) + 86400e6) % 86400e6;
  const pad = (n, width) => String(Math.floor(n)).padStart(width, "0");
  return pad(micros / 3600e6, 2) + ":" + pad(micros / 60e6 % 60, 2) + ":" +
    pad(micros / 1e6 % 60, 2) + "." + pad(micros % 1e6, 6);
}

function hoverTexts(figure) {
  const strings = figure.labels || [];
  for (const trace of figure.data || []) {
    const {labels, x} = trace;
    delete trace.labels;
    if (!labels) continue;
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

// Selecting a window on the timeline (a zoom on its time axis) stops following, so that the
// drawing stays, and takes the window as the one to cut.
function fromPlotly(value) {
  if (typeof value === "number") return new Date(value).toISOString();
  const m = /^(\d{4}-\d\d-\d\d)(?:[ T](\d\d):(\d\d)(?::(\d\d)(\.\d+)?)?)?/.exec(String(value));
  if (!m) return null;
  return m[1] + "T" + (m[2] || "00") + ":" + (m[3] || "00") + ":" + (m[4] || "00") +
    (m[5] || "") + "Z";
}

let listening = false;

function onRelayout(update) {
  let start = update["xaxis.range[0]"];
  let end = update["xaxis.range[1]"];
  if (start === undefined && Array.isArray(update["xaxis.range"])) [start, end] = update["xaxis.range"];
  const sinceInput = document.getElementById("cut-since");
  if (start === undefined || !sinceInput) return;
  follow.checked = false;
  sinceInput.value = fromPlotly(start);
  document.getElementById("cut-until").value = fromPlotly(end);
}

async function drawFigure() {
  if (figureBox && window.Plotly && follow.checked) {
    try {
      const answer = await fetch(figureBox.dataset.url, {credentials: "same-origin"});
      if (answer.ok) {
        const figure = await answer.json();
        hoverTexts(figure);
        await window.Plotly.react(figureBox, figure.data, figure.layout, {responsive: true});
        if (!listening) {
          figureBox.on("plotly_relayout", onRelayout);
          listening = true;
        }
      }
    } catch (error) {
      console.warn("stream timeline:", error);
    }
  }
  setTimeout(drawFigure, 2000);
}

poll();
drawFigure();
