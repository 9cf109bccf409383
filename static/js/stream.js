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

poll();
