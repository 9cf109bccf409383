// Incident page: the insights. One line under the title counts the incident's findings (GET
// …/insights/, stored once per data version) and names the most severe; opened, the list lies
// over the page (the timeline below never moves), the most severe first, each with its
// one-line explanation and its evidence: "show on the timeline" opens the page filtered to the insight's events (id=…, or
// the insight's own filters when it names more events than a URL should carry). Writers can
// start a root-cause sequence from an insight: its events become the steps, in time order.
document.addEventListener("DOMContentLoaded", () => {
  "use strict";
  const {el, getJSON, sendJSON, formatDuration} = window.Hindsight;
  const panel = document.getElementById("insights");
  if (!panel) return;
  const list = document.getElementById("insights-list");
  const status = document.getElementById("insights-status");
  const top = document.getElementById("insights-top");
  const SHOWN_ON_THE_LINE = 3;
  const canWrite = panel.dataset.canWrite === "1";
  // ids in a link: ~11 characters each, so that the URL stays well under the 4 KiB request
  // line that servers such as gunicorn accept
  const MAX_URL_IDS = 100;
  const FILTERS = ["user", "verb", "resource", "namespace", "name", "code"];

  // The page's URL showing an insight's events on the timeline (the whole span of them:
  // window=all), and what it shows.
  function evidence(insight, extra) {
    const query = new URLSearchParams();
    const ids = insight.events || [];
    let label;
    if (ids.length && (ids.length <= MAX_URL_IDS || !insight.filters)) {
      ids.slice(0, MAX_URL_IDS).forEach((id) => query.append("id", id));
      const total = Math.max(insight.event_count || 0, ids.length);
      label = ids.length > MAX_URL_IDS || total > ids.length
        ? "show the first " + Math.min(ids.length, MAX_URL_IDS) + " of " + total + " events"
        : "show " + (ids.length === 1 ? "the event" : "the " + ids.length + " events");
    } else if (insight.filters) {
      for (const name of FILTERS) {
        for (const value of (insight.filters[name] || [])) query.append(name, value);
      }
      if (insight.since || insight.start) query.set("since", insight.since || insight.start);
      if (insight.until || insight.end) query.set("until", insight.until || insight.end);
      label = "show its " + (insight.event_count || ids.length) + " events (by filter)";
    } else {
      return null;
    }
    query.set("window", "all");
    for (const [name, value] of Object.entries(extra || {})) query.set(name, value);
    return {href: panel.dataset.pageUrl + "?" + query.toString() + "#timeline", label};
  }

  function details(insight) {
    const lines = [];
    if (insight.trace && insight.trace.steps && insight.trace.steps.length) {
      lines.push(el("p", {class: "hint"}, "Trace[" + insight.trace.id + "], " +
        formatDuration(insight.trace.total_ms || 0) + ":"),
      el("pre", {class: "trace-steps"}, insight.trace.steps.join("\n")));
    }
    if (insight.kind === "audit-coverage" && insight.resources) {
      lines.push(el("table", {class: "grid compact"},
        el("thead", {}, el("tr", {}, el("th", {}, "resource"), el("th", {}, "levels"),
          el("th", {}, "writes without body"))),
        el("tbody", {}, insight.resources.slice(0, 30).map((r) => el("tr", {},
          el("td", {}, r.resource || "(non-resource)"),
          el("td", {}, Object.entries(r.levels).map(([k, v]) => k + " " + v).join(", ")),
          el("td", {}, r.writes ? r.writes_without_body + " of " + r.writes : "—"))))));
    }
    // findings on bundles: what they are about, and each termination or condition
    if (insight.objects && insight.objects.length) {
      lines.push(el("p", {class: "hint"}, insight.objects.slice(0, 20).map((o) =>
        o.resource + "/" + (o.namespace ? o.namespace + "/" : "") + o.name).join(", ") +
        (insight.objects.length > 20 ? " …" : "")));
    }
    const facts = insight.facts || [];
    if (facts.length && facts[0].container !== undefined) {
      lines.push(el("table", {class: "grid compact"},
        el("thead", {}, el("tr", {}, ...["pod", "container", "started", "finished", "reason",
                                         "exit code", "restarts"].map((h) => el("th", {}, h)))),
        el("tbody", {}, facts.map((f) => el("tr", {}, ...[f.pod, f.container, f.started,
          f.finished, f.reason, f.exit_code, f.restarts].map((v) => el("td", {},
            v === null || v === undefined ? "—" : String(v))))))));
    } else if (facts.length && facts[0].condition !== undefined) {
      lines.push(el("table", {class: "grid compact"},
        el("thead", {}, el("tr", {}, ...["condition", "status", "since", "message"].map(
          (h) => el("th", {}, h)))),
        el("tbody", {}, facts.map((f) => el("tr", {}, ...[f.condition, f.status, f.since,
          f.message].map((v) => el("td", {}, v || "—")))))));
    }
    return lines.length ? el("details", {class: "insight-more"}, el("summary", {}, "details"),
      ...lines) : null;
  }

  async function startSequence(insight, button) {
    button.disabled = true;
    status.textContent = "making a sequence…";
    try {
      const url = panel.dataset.sequenceUrl.replace(/\/0\/sequence\/$/,
                                                    "/" + insight.id + "/sequence/");
      const sequence = await sendJSON(url, "POST", {});
      const link = evidence(insight, {sequence: sequence.id});
      window.location.assign(link ? link.href : panel.dataset.pageUrl + "?sequence=" +
                             sequence.id + "#timeline");
    } catch (err) {
      status.textContent = "could not make the sequence (" + err.message + ")";
      button.disabled = false;
    }
  }

  function entry(insight) {
    const link = evidence(insight);
    return el("li", {class: "insight severity-" + insight.severity,
                     dataset: {kind: insight.kind, insight: insight.id}},
      el("p", {class: "insight-head"},
        el("span", {class: "severity"}, insight.severity), " ",
        el("strong", {class: "insight-title"}, insight.title), " ",
        el("span", {class: "hint"}, insight.kind)),
      el("p", {class: "insight-explanation"}, insight.explanation),
      el("p", {class: "insight-actions"},
        link ? el("a", {href: link.href, class: "evidence"}, link.label) : null,
        canWrite && (insight.events || []).length ? el("button", {
          type: "button", class: "quiet start-sequence",
          onclick: (e) => startSequence(insight, e.currentTarget)}, "Start a sequence") : null),
      details(insight));
  }

  async function load() {
    let found;
    try {
      found = await getJSON(panel.dataset.url);
    } catch (err) {
      status.textContent = "could not load the insights (" + err.message + ")";
      return;
    }
    list.replaceChildren(...found.map(entry));
    document.getElementById("insights-empty").hidden = found.length > 0;
    const counts = {};
    for (const item of found) counts[item.severity] = (counts[item.severity] || 0) + 1;
    status.textContent = found.length ? ["critical", "warning", "info"].filter((s) => counts[s])
      .map((s) => counts[s] + " " + s).join(" · ") + ":" : "no findings (open to see what was checked)";
    top.replaceChildren(...found.slice(0, SHOWN_ON_THE_LINE).map((item) => el(
      "span", {class: "insight-chip severity-" + item.severity}, item.title)));
    // a link to the page's #insights (the demo's) opens on the findings
    if (window.location.hash === "#insights" && found.length) panel.open = true;
  }

  // and so does a link to #insights followed on the page itself (the hash changes, no load)
  window.addEventListener("hashchange", () => {
    if (window.location.hash === "#insights" && list.children.length) panel.open = true;
  });

  // the list lies over the page: Escape or a click elsewhere closes it
  document.addEventListener("keydown", (e) => {
    if (e.key === "Escape" && panel.open) panel.open = false;
  });
  document.addEventListener("click", (e) => {
    if (panel.open && !panel.contains(e.target)) panel.open = false;
  });

  load();
});
