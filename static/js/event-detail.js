// Incident page: the event detail panel. Shows every field of the selected event, its stored
// (redacted) raw event, links to the views around it (the object's history, the actor, the
// source file) and, for an event about an object, the object's other versions with a diff.
// timeline.js decides what is selected and calls show(); this module only draws.
(function () {
  "use strict";
  const {el, getJSON, shortTime} = window.Hindsight;
  const panel = document.getElementById("detail");
  if (!panel) return;
  const $ = (id) => document.getElementById(id);
  const VERSIONS_SHOWN = 200;
  let options = {};
  let shown = null;  // the event in the panel; answers for any other one are dropped

  function init(given) {
    options = given;
    $("detail-close").addEventListener("click", () => options.onClose && options.onClose());
  }

  function formatValue(value) {
    if (value === null || value === undefined || value === "") return "—";
    if (Array.isArray(value)) return value.length ? value.join(", ") : "—";
    if (typeof value === "object") {
      return Object.keys(value).length ? JSON.stringify(value, null, 1) : "—";
    }
    return String(value);
  }

  function title(event) {
    const what = [event.verb, event.reason].filter(Boolean).join(" ");
    const object = [event.resource, event.namespace, event.name].filter(Boolean).join("/");
    return [event.kind, what, object + (event.subresource ? " (" + event.subresource + ")" : "")]
      .filter(Boolean).join(" · ");
  }

  function show(event) {
    shown = event;
    panel.hidden = false;
    document.body.classList.add("detail-open");
    $("detail-title").textContent = "Event " + event.id;
    $("detail-summary").textContent = shortTime(event.received) + " · " + title(event);
    drawLinks(event);
    const fields = $("detail-fields");
    fields.replaceChildren();
    for (const [key, value] of Object.entries(event)) {
      if (key === "body") continue;
      fields.append(el("dt", {}, key), el("dd", {dataset: {field: key}}, formatValue(value)));
    }
    $("detail-body").textContent = event.body === null || event.body === undefined
      ? "(no stored event)" : JSON.stringify(event.body, null, 2);
    $("detail-diff").hidden = true;
    drawRelated(event);
    drawVersions(event);
  }

  // The objects related to the event's object (GET .../related/, from bundle snapshots): owners,
  // what it owns, its node, claims, volumes, Services, Endpoints and pods; each one a link to its
  // events, and one link to select them all with the object (the related=R/N/X filter).
  async function drawRelated(event) {
    const section = $("detail-related");
    const list = $("related-list");
    list.replaceChildren();
    section.hidden = !(event.resource && event.name);
    if (section.hidden) return;
    $("related-status").textContent = "loading…";
    const params = new URLSearchParams({resource: event.resource, name: event.name});
    if (event.namespace) params.set("namespace", event.namespace);
    let answer;
    try {
      answer = await getJSON(options.eventsUrl.replace(/events\/$/, "related/") + "?" +
                             params.toString());
    } catch (err) {
      if (shown === event) $("related-status").textContent = "could not load: " + err.message;
      return;
    }
    if (shown !== event) return;
    if (!answer.related.length) {
      $("related-status").textContent = "No related objects known (they come from snapshots).";
      return;
    }
    const key = [event.resource, event.namespace, event.name].filter(Boolean).join("/");
    $("related-status").replaceChildren(el("a", {id: "link-related", href: options.linkFor(
      {related: key}, event.id)}, "this object with the " + answer.related.length +
      " related to it"));
    for (const other of answer.related) {
      const label = [other.resource, other.namespace, other.name].filter(Boolean).join("/");
      list.append(el("li", {dataset: {relation: other.relation}}, other.relation + ": ",
        el("a", {href: options.linkFor({resource: other.resource, namespace: other.namespace,
                                        name: other.name}, event.id)}, label)));
    }
  }

  function hide() {
    shown = null;
    panel.hidden = true;
    document.body.classList.remove("detail-open");
  }

  function drawLinks(event) {
    const links = [];
    if (event.resource) {
      links.push(el("a", {id: "link-object", href: options.linkFor({
        resource: event.resource, namespace: event.namespace, name: event.name}, event.id)},
      "this object's history"));
    }
    if (panel.dataset.historyUrl && event.resource && event.name) {
      links.push(el("a", {id: "link-history", href: panel.dataset.historyUrl + "?event=" +
                                                    encodeURIComponent(event.id)},
                    "Object history"));
    }
    if (event.user) {
      links.push(el("a", {id: "link-actor", href: options.linkFor({user: event.user}, event.id)},
                    "this actor (" + event.user + ")"));
    }
    if (event.source) {
      links.push(el("a", {id: "link-source", href: options.linkFor({source: event.source},
                                                                   event.id)},
                    "this source file (" + event.source + ":" + event.line + ")"));
    }
    $("detail-links").replaceChildren(...links.flatMap((link, n) => n ? [" · ", link] : [link]));
  }

  async function drawVersions(event) {
    const section = $("detail-versions");
    const body = section.querySelector("tbody");
    body.replaceChildren();
    section.hidden = !(event.resource && event.name);
    if (section.hidden) return;
    $("versions-status").textContent = "loading…";
    const params = new URLSearchParams({kind: "audit", resource: event.resource,
                                        name: event.name, page_size: VERSIONS_SHOWN});
    if (event.namespace) params.set("namespace", event.namespace);
    // an object's snapshots in bundles are versions too (kind state, reason Snapshot)
    const snapshots = new URLSearchParams(params);
    snapshots.set("kind", "state");
    snapshots.set("reason", "Snapshot");
    let page, taken;
    try {
      [page, taken] = await Promise.all([
        getJSON(options.eventsUrl + "?" + params.toString()),
        getJSON(options.eventsUrl + "?" + snapshots.toString())]);
    } catch (err) {
      if (shown === event) $("versions-status").textContent = "could not load: " + err.message;
      return;
    }
    if (shown !== event) return;
    // an empty namespace filter matches every namespace: keep this object's only
    const versions = page.results.concat(taken.results)
      .filter((v) => v.namespace === event.namespace)
      .sort((a, b) => (a.received < b.received ? -1 : a.received > b.received ? 1 : a.id - b.id));
    $("versions-status").textContent = versions.length <= 1
      ? "No other requests on this object."
      : versions.length + " requests on this object" + (page.next ? " (the first " +
        VERSIONS_SHOWN + ")" : "") + "; a diff compares the objects two of them stored.";
    for (const version of versions) {
      const current = version.id === event.id;
      const action = current ? el("span", {class: "hint"}, "this event")
        : el("button", {type: "button", class: "quiet diff-against",
                        dataset: {against: version.id},
                        onclick: () => drawDiff(event, version, true)}, "diff against this");
      body.append(el("tr", {class: current ? "current" : null, dataset: {event: version.id}},
        el("td", {}, el("a", {href: options.linkFor(null, version.id), title: version.received,
                              onclick: (e) => {
                                e.preventDefault();
                                options.onSelect(version.id);
                              }}, versionTime(version, event))),
        el("td", {}, version.verb || version.reason), el("td", {}, version.user),
        el("td", {}, formatValue(version.code)), el("td", {}, version.level),
        el("td", {}, action)));
    }
  }

  // the time of `version`, with its date only when that differs from the event's
  function versionTime(version, event) {
    const time = shortTime(version.received);
    return time.slice(0, 10) === shortTime(event.received).slice(0, 10) ? time.slice(11) : time;
  }

  // What changed in the object between two of its events, the earlier one first.
  async function drawDiff(event, other, fold) {
    const [older, newer] = [event, other].sort(
      (a, b) => (a.received < b.received ? -1 : a.received > b.received ? 1 : a.id - b.id));
    const section = $("detail-diff");
    const reason = $("diff-reason");
    const body = section.querySelector("tbody");
    const table = $("diff-table");
    section.hidden = false;
    $("diff-title").textContent = "Changes from " + shortTime(older.received) + " " +
      older.verb + " (event " + older.id + ") to " + shortTime(newer.received) + " " +
      newer.verb + " (event " + newer.id + ")";
    reason.hidden = true;
    body.replaceChildren();
    $("diff-folded").replaceChildren("loading…");
    const params = new URLSearchParams({against: older.id});
    if (!fold) params.set("fold", "false");
    let answer;
    try {
      answer = await getJSON(options.eventUrl + newer.id + "/diff/?" + params.toString());
    } catch (err) {
      if (shown !== event) return;
      // 422: one of the two holds no object version; say why rather than show nothing
      reason.textContent = err.status === 422 && err.body && err.body.detail
        ? err.body.detail : "Could not diff: " + err.message;
      reason.hidden = false;
      table.hidden = true;
      $("diff-folded").replaceChildren();
      return;
    }
    if (shown !== event) return;
    table.hidden = false;
    for (const change of answer.changes) {
      body.append(el("tr", {},
        el("td", {}, el("code", {}, change.path)),
        el("td", {class: "before"}, formatValue(change.before)),
        el("td", {class: "after"}, formatValue(change.after))));
    }
    if (!answer.changes.length) {
      body.append(el("tr", {}, el("td", {colspan: 3, class: "empty"}, "No changes.")));
    }
    const folded = answer.folded.length;
    const toggle = (label, nextFold) => el("button", {
      type: "button", class: "quiet", id: "diff-fold-toggle",
      onclick: () => drawDiff(event, other, nextFold)}, label);
    $("diff-folded").replaceChildren(...(fold
      ? (folded ? [folded + " bookkeeping change" + (folded === 1 ? "" : "s") + " folded — ",
                   toggle("show", false)] : [])
      : ["Bookkeeping changes shown — ", toggle("fold them", true)]));
    section.scrollIntoView({block: "nearest"});
  }

  // the diff of `event` (shown) against `other`, as "diff against this" draws it
  const showDiff = (event, other) => drawDiff(event, other, true);

  window.HindsightDetail = {init, show, hide, showDiff};
})();
