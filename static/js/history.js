// Object history page: everything about one object in time order (GET .../history/), each
// version with a diff against the version before it. The detail panel and its diff are the
// incident page's (event-detail.js); this module lists and chooses.
(function () {
  "use strict";
  const {el, getJSON, shortTime} = window.Hindsight;
  const Detail = window.HindsightDetail;
  const $ = (id) => document.getElementById(id);
  const section = $("history");
  if (!section) return;
  const data = section.dataset;
  const query = new URLSearchParams(window.location.search);
  let object = null;
  let byId = new Map();

  // the incident page, filtered to this object (and the event selected there)
  function timelineLink(only, eventId) {
    const params = new URLSearchParams();
    for (const [name, value] of Object.entries(only || object || {})) {
      if (value) params.set(name, value);
    }
    if (eventId) params.set("event", eventId);
    return data.incidentUrl + "?" + params.toString();
  }

  async function open(id) {
    const event = await getJSON(data.eventUrl + Number(id) + "/");
    Detail.show(event);
    for (const row of document.querySelectorAll("#history-table tr.current")) {
      row.classList.remove("current");
    }
    const row = document.querySelector(`#history-table tr[data-event="${Number(id)}"]`);
    if (row) row.classList.add("current");
    return event;
  }

  async function diffWithPrevious(item) {
    const previous = byId.get(item.previous_version);
    const event = await open(item.id);
    Detail.showDiff(event, previous);
  }

  function what(item) {
    if (item.kind === "audit") {
      return [item.verb, item.subresource && "(" + item.subresource + ")"].filter(Boolean)
        .join(" ");
    }
    return [item.reason, item.message].filter(Boolean).join(": ");
  }

  function draw(answer) {
    object = answer.object;
    byId = new Map(answer.events.map((item) => [item.id, item]));
    $("history-object").textContent = [object.resource, object.namespace, object.name]
      .filter(Boolean).join("/");
    $("history-timeline").href = timelineLink(null, query.get("event"));
    $("history-status").textContent = answer.events.length + " event" +
      (answer.events.length === 1 ? "" : "s") + " · " + answer.versions + " version" +
      (answer.versions === 1 ? "" : "s") +
      (answer.truncated ? " · only the first " + answer.events.length + " are listed" : "");
    const body = $("history-table").querySelector("tbody");
    body.replaceChildren();
    for (const item of answer.events) {
      let version = null;
      if (item.version) {
        version = el("span", {class: "badge version"}, "version");
      } else if (item.version_note) {
        version = el("span", {class: "hint", title: item.version_note}, "no object");
      }
      const actions = [el("a", {href: timelineLink(null, item.id), class: "timeline-link"},
                          "timeline")];
      if (item.version && item.previous_version) {
        actions.push(" · ", el("button", {type: "button", class: "quiet diff-previous",
                                          dataset: {against: item.previous_version},
                                          onclick: () => diffWithPrevious(item)},
                               "diff with previous version"));
      }
      const who = item.kind === "audit" || item.kind === "trace" ? item.user
        : item.component || (item.source ? item.source + ":" + item.line : "");
      body.append(el("tr", {dataset: {event: item.id, kind: item.kind},
                            class: item.version ? "version" : null},
        el("td", {}, el("a", {href: "#", title: item.received,
                              onclick: (e) => { e.preventDefault(); open(item.id); }},
                          shortTime(item.received))),
        el("td", {}, item.kind), el("td", {class: "what"}, what(item)), el("td", {}, who),
        el("td", {}, item.code === null ? "" : String(item.code)), el("td", {}, version),
        el("td", {}, actions)));
    }
    if (!answer.events.length) {
      body.append(el("tr", {}, el("td", {colspan: 7, class: "empty"},
                                  "Nothing about this object in the incident.")));
    }
  }

  Detail.init({eventUrl: data.eventUrl, eventsUrl: data.eventsUrl, linkFor: timelineLink,
               onClose: () => Detail.hide(), onSelect: (id) => open(id)});
  getJSON(data.historyUrl + "?" + query.toString()).then(draw).catch((err) => {
    $("history-status").textContent = "Could not load the history: " +
      (err.body ? window.Hindsight.problem(err.body) : err.message);
  });
})();
