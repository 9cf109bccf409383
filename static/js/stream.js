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
// every two seconds while following, detected requests starred. Hover texts come as numbers
// into figure.labels, joined by hover.js as on the incident page.
const figureBox = document.getElementById("stream-figure");

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
        window.HindsightHover.hoverTexts(figure);
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
