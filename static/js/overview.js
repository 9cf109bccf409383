// Incident page: the overview strip above the timeline, which answers "what happened?" before
// any filter is typed.
//
// - events over time across the whole span of the filters (no window), stacked by outcome for
//   requests and by kind for other evidence, with the current window shaded: a click on a bar,
//   or a drag across bars, makes that stretch the window;
// - the top users, verbs, resources, namespaces, response codes, Event reasons, user agents …
//   of the current view (filters and window), those that hold values, with their counts and
//   errors: a click on one adds it to the filters.
// Data: /api/v1/incidents/{id}/overview/ (timelines.reads.overview); the span's overview is the one
// timeline.js fetched for the first window (HindsightTimeline.spanOverview).
(function () {
  "use strict";
  const {el, getJSON, shortTime, valueName} = window.Hindsight;
  const Timeline = window.HindsightTimeline;
  const strip = document.getElementById("overview");
  if (!strip || !Timeline) return;

  const SVG = "http://www.w3.org/2000/svg";
  const HEIGHT = 56;  // px of the tallest bar
  const colours = JSON.parse(document.getElementById("timeline-colours").textContent);
  // stacking order, bottom up: what went well, then other evidence, then errors on top
  const ORDER = ["2xx", "3xx", "open", "other", "event", "log", "trace", "4xx", "5xx"];
  // The lists, in order of preference: the first LISTS of them that hold a value are shown (an
  // incident of Events and log lines has no users, verbs or codes, but reasons and components).
  const FIELDS = [["user", "Users"], ["verb", "Verbs"], ["resource", "Resources"],
                  ["namespace", "Namespaces"], ["code", "Codes"], ["reason", "Reasons"],
                  ["user_agent", "User agents"], ["component", "Components"], ["node", "Nodes"],
                  ["kind", "Kinds"], ["source", "Source files"]];
  const LISTS = 7;
  const SHOWN = 5;  // values per list
  const chart = document.getElementById("overview-chart");
  const lists = document.getElementById("overview-facets");
  const status = document.getElementById("overview-status");
  let span = null;     // the overview of the whole span
  let loading = null;  // AbortController of the window's overview in flight

  function svg(tag, attrs, ...children) {
    const node = document.createElementNS(SVG, tag);
    for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, String(value));
    node.append(...children);
    return node;
  }

  function count(n) {
    return Number(n).toLocaleString("en-US");
  }

  // --- events over time ----------------------------------------------------------------------

  function drawChart() {
    const histogram = span && span.histogram;
    chart.replaceChildren();
    if (!histogram) return;
    const width = chart.clientWidth || 800;
    const {bins, bin_ms: binMs} = histogram;
    const start = Date.parse(histogram.start);
    const series = [...histogram.series].sort(
      (a, b) => ORDER.indexOf(a.name) - ORDER.indexOf(b.name));
    const totals = new Array(bins).fill(0);
    for (const s of series) s.counts.forEach((n, i) => { totals[i] += n; });
    const top = Math.max(1, ...totals);
    const step = width / bins;
    const plot = svg("svg", {width, height: HEIGHT + 16, class: "overview-svg",
                             "aria-label": "events over time"});
    for (let i = 0; i < bins; i++) {
      if (!totals[i]) continue;
      // at least 2 px for a bin with events: a lone straggler must show beside a burst
      const height = Math.max(2, HEIGHT * totals[i] / top);
      let y = HEIGHT;
      const bar = svg("g", {class: "bin", "data-bin": i});
      for (const s of series) {
        const n = s.counts[i];
        if (!n) continue;
        const h = height * n / totals[i];
        y -= h;
        bar.append(svg("rect", {x: i * step, y, width: Math.max(step - 1, 1), height: h,
                                fill: colours[s.name] || "#94a3b8"}));
      }
      const from = new Date(start + i * binMs).toISOString();
      const to = new Date(start + (i + 1) * binMs).toISOString();
      const parts = series.filter((s) => s.counts[i]).map((s) => s.name + " " + count(s.counts[i]));
      bar.append(svg("title", {}, shortTime(from) + " → " + shortTime(to) + ": " +
                     count(totals[i]) + " events (" + parts.join(", ") + ")"));
      // the whole column catches the pointer, not only the bar
      bar.prepend(svg("rect", {x: i * step, y: 0, width: step, height: HEIGHT,
                               fill: "transparent"}));
      plot.append(bar);
    }
    plot.append(svg("line", {x1: 0, x2: width, y1: HEIGHT + 0.5, y2: HEIGHT + 0.5,
                             class: "overview-axis"}));
    const end = new Date(start + bins * binMs).toISOString();
    plot.append(svg("text", {x: 0, y: HEIGHT + 13, class: "overview-tick"},
                    shortTime(histogram.start).slice(0, 16)),
                svg("text", {x: width, y: HEIGHT + 13, class: "overview-tick",
                             "text-anchor": "end"}, shortTime(end).slice(0, 16)));
    const since = Date.parse(Timeline.param("since") || "");
    const until = Date.parse(Timeline.param("until") || "");
    if (!Number.isNaN(since) || !Number.isNaN(until)) {
      const x0 = Number.isNaN(since) ? 0 : Math.max(0, (since - start) / binMs * step);
      const x1 = Number.isNaN(until) ? width : Math.min(width, (until - start) / binMs * step);
      plot.append(svg("rect", {x: x0, y: 0, width: Math.max(x1 - x0, 2), height: HEIGHT,
                               class: "overview-window"}));
    }
    chart.append(plot);
    chart.dataset.bins = bins;
  }

  // How many bursts of events the histogram holds: runs of bins with events, apart by at least
  // two empty bins (a sixtieth of the span).
  function bursts(histogram) {
    if (!histogram) return 0;
    const bins = histogram.series.reduce(
      (sums, s) => sums.map((n, i) => n + s.counts[i]), new Array(histogram.bins).fill(0));
    let runs = 0;
    let empty = Infinity;
    for (const n of bins) {
      if (n && empty >= 2) runs++;
      empty = n ? 0 : empty + 1;
    }
    return runs;
  }

  // A click on a bar, or a drag across bars: that stretch becomes the window.
  let pressed = null;
  function binAt(event) {
    const group = event.target.closest && event.target.closest("g.bin");
    return group ? Number(group.dataset.bin) : null;
  }
  chart.addEventListener("mousedown", (event) => {
    pressed = binAt(event);
    if (pressed !== null) event.preventDefault();
  });
  chart.addEventListener("mouseup", (event) => {
    const released = binAt(event);
    const first = pressed;
    pressed = null;
    if (first === null || released === null || !span || !span.histogram) return;
    const {start, bin_ms: binMs} = span.histogram;
    const from = Date.parse(start) + Math.min(first, released) * binMs;
    const to = Date.parse(start) + (Math.max(first, released) + 1) * binMs;
    Timeline.setWindow(new Date(from).toISOString(), new Date(to).toISOString());
  });

  // --- the top values ------------------------------------------------------------------------

  // A link to this page with one more filter value (keeping the window, lanes, colour).
  function filterLink(field, value) {
    const query = new URLSearchParams(window.location.search);
    for (const name of ["after", "event", "partial"]) query.delete(name);
    if (!query.getAll(field).includes(String(value))) query.append(field, value);
    return window.location.pathname + "?" + query.toString() + "#timeline";
  }

  // A long value shortened in the middle, where it says least: the end of a path or of a
  // service account's name tells more than the start (the full value is the title).
  const LABEL = 23;  // characters of a value's label, fewer where the list is narrower
  function shorten(text, limit = LABEL) {
    if (text.length <= limit) return text;
    const head = Math.floor((limit - 1) / 3);
    return text.slice(0, head) + "…" + text.slice(text.length - (limit - 1 - head));
  }

  // The labels of a list's values: each shortened, except where two would look alike (a
  // must-gather's …/logs/current.log of several pods, sonobuoy's logs of each node): those
  // show the fewest of their parts between slashes that tell each from the others (as the
  // lanes' labels do, timelines.figures.lanes.short_labels), else the characters in which
  // they differ (ip-10-0-26-239…), where that tells them apart.
  function labelsOf(texts, limit = LABEL) {
    const labels = texts.map((t) => shorten(t, limit));
    // those a way told apart leave the others alike, a smaller group told apart again
    for (let round = 0; round < 3; round++) {
      const groups = new Map();
      labels.forEach((label, i) => groups.set(label, (groups.get(label) || []).concat([i])));
      let changed = false;
      for (const [label, members] of groups) {
        if (members.length < 2) continue;
        const alike = members.map((i) => texts[i]);
        const others = new Set(labels.filter((l) => l !== label));
        const apart = (tried) => new Set(tried).size === tried.length
          && !tried.some((t) => others.has(t));
        const longest = (tried) => Math.max(...tried.map((t) => t.length));
        // of the ways that tell them all apart, the shortest labels (the list's width cuts)
        const ways = [byParts(alike, limit), byDifference(alike, limit)];
        const good = ways.filter(apart).sort((a, b) => longest(a) - longest(b));
        const tried = good.length ? good[0] : ways[1];
        const seen = new Map();
        tried.forEach((t) => seen.set(t, (seen.get(t) || 0) + 1));
        members.forEach((i, k) => {
          if (seen.get(tried[k]) === 1 && !others.has(tried[k])) {
            labels[i] = tried[k];
            others.add(tried[k]);
            changed = true;
          }
        });
      }
      if (!changed) break;
    }
    return labels;
  }

  // each text by the fewest of its parts that tell it from the others, the deepest first
  function byParts(texts, limit) {
    const parts = texts.map((t) => t.split("/"));
    return parts.map((mine, k) => {
      let alike = parts.filter((_, j) => j !== k);
      const chosen = [];
      while (alike.length) {
        let best = -1, most = 0;
        mine.forEach((part, at) => {
          const differ = alike.filter((p) => p.length <= at || p[at] !== part).length;
          if (differ >= most && differ > 0) { best = at; most = differ; }
        });
        if (best < 0) break;
        chosen.push(best);
        alike = alike.filter((p) => p.length > best && p[best] === mine[best]);
      }
      return shorten("…/" + chosen.sort((a, b) => a - b).map((at) => mine[at]).join("/"), limit);
    });
  }

  // each text by what lies between the start and the end they all share (cut where a word
  // of a name starts or ends), after a short shared start kept whole
  const SEPARATOR = /[-./_:]/;
  function byDifference(texts, limit) {
    const shortest = Math.min(...texts.map((t) => t.length));
    let start = 0;
    while (start < shortest && texts.every((t) => t[start] === texts[0][start])) start++;
    while (start > 0 && !SEPARATOR.test(texts[0][start - 1])) start--;
    let end = 0;  // the shared end's length
    while (end < shortest - start && texts.every((t) => t[t.length - 1 - end] ===
                                                 texts[0][texts[0].length - 1 - end])) end++;
    while (end > 0 && !SEPARATOR.test(texts[0][texts[0].length - end])) end--;
    return texts.map((t) => {
      // a long shared start by its last word or two (…ip-10-0-195-177…)
      let head = t.slice(0, start);
      if (start > 10) {
        let from = start - 9;
        while (from < start && !SEPARATOR.test(t[from - 1])) from++;
        head = "…" + t.slice(from, start);
      }
      return shorten(head + t.slice(start, t.length - end) + (end ? "…" : ""), limit);
    });
  }

  function isError(field, value) {
    return field === "code" && Number(value) >= 400;
  }

  function drawLists(overview) {
    const facets = (overview && overview.facets) || {};
    const valued = ([field]) => ((facets[field] || {}).values || []).some(
      (v) => v.value !== "" && v.value !== null);
    lists.replaceChildren(...FIELDS.filter(valued).slice(0, LISTS).map(([field, title]) => {
      // the values first, then how many events have none (Events and log lines have no user)
      const all = facets[field].values;
      const none = all.filter((v) => v.value === "" || v.value === null);
      const values = all.filter((v) => !none.includes(v)).slice(0, SHOWN).concat(none);
      const top = Math.max(1, ...values.filter((v) => !none.includes(v)).map((v) => v.count));
      const texts = values.map((v) => valueName(v.value));
      const rows = values.map((v, index) => {
        const empty = v.value === "" || v.value === null;
        const label = texts[index];
        const errors = isError(field, v.value) ? v.count : v.errors || 0;
        const width = Math.min(100, Math.round(100 * v.count / top));
        const bar = empty ? null : el("span", {class: "facet-bar" + (errors ? " has-errors" : ""),
                                               style: "width:" + width + "%"});
        const name = el("span", {class: "facet-value", title: label});  // fitLabels names it
        const numbers = el("span", {class: "facet-count"}, count(v.count),
                           errors && !isError(field, v.value)
                             ? el("span", {class: "facet-errors", title: "answered 4xx or 5xx"},
                                  " · " + count(errors) + " err") : null);
        const cls = "facet" + (isError(field, v.value) ? " error" : "") + (empty ? " none" : "");
        // "(none)" is a filter too: the events without the field (?namespace=(none))
        return el("li", {class: cls}, el("a", {href: filterLink(field, label),
                                               dataset: {field, value: label}}, bar, name, numbers));
      });
      const list = el("div", {class: "facet-list", dataset: {field}},
                      el("h3", {}, title), values.length ? el("ol", {}, rows)
                        : el("p", {class: "hint"}, "—"));
      list.texts = texts;
      return list;
    }));
    fitLabels();
  }

  // Each list's labels (labelsOf); a list narrower than its labels (the page's width shares it
  // with six others) labels its values again in the characters it shows, so that what tells
  // them apart is not cut off; again when the page's width changes, or the folded overview
  // opens.
  function fitLabels() {
    for (const list of lists.children) {
      if (!list.texts) continue;
      const names = Array.from(list.querySelectorAll(".facet-value"));
      const show = (labels) => names.forEach((name, index) => {
        name.textContent = labels[index];
      });
      show(labelsOf(list.texts));
      // the characters that fit, from the widest label's overflow (letters differ in width:
      // measured again until none overflows)
      let fit = LABEL;
      for (let tries = 0; tries < 8; tries++) {
        const over = names.filter((name) => name.clientWidth > 0
                                            && name.scrollWidth > name.clientWidth);
        if (!over.length || fit <= 8) break;
        fit = Math.max(8, Math.min(fit - 1, ...over.map((name) => Math.floor(
          name.textContent.length * name.clientWidth / name.scrollWidth))));
        show(labelsOf(list.texts, fit));
      }
    }
  }

  let listed = null;  // the window the lists count

  async function refreshLists() {
    const windowKey = (Timeline.param("since") || "") + "|" + (Timeline.param("until") || "");
    if (windowKey === listed) return;
    listed = windowKey;
    if (loading) loading.abort();
    if (!Timeline.param("since") && !Timeline.param("until")) {
      drawLists(span);
      return;
    }
    const controller = loading = new AbortController();
    try {
      const overview = await getJSON(strip.dataset.overviewUrl + "?" + Timeline.filters(true),
                                     {signal: controller.signal});
      if (controller === loading) drawLists(overview);
    } catch (err) {
      if (err.name !== "AbortError") status.textContent = "could not count (" + err.message + ")";
    }
  }

  async function start() {
    span = await Timeline.spanOverview;
    if (!span) {
      status.textContent = "could not load the overview";
      return;
    }
    const apart = bursts(span.histogram);
    status.textContent = count(span.total) + " events" + (span.range
      ? ", " + shortTime(span.range[0]).slice(0, 16) + " → " +
        shortTime(span.range[1]).slice(0, 16) : "") +
      (apart > 1 ? ", in " + apart + " bursts apart" : "");
    drawChart();
    refreshLists();
    strip.dataset.loaded = "1";
  }

  Timeline.box.addEventListener("hindsight:figure-drawn", () => {
    if (!span) return;
    drawChart();  // the window's shading
    refreshLists();
  });
  strip.addEventListener("toggle", () => {  // folded, it had no width
    if (!strip.open) return;
    drawChart();
    fitLabels();
  });
  // Drawn again whenever the strip's width changes: the window's, and the event's details
  // opening beside the page (the chart, drawn in pixels, stood out of its card then).
  let resizing = 0, drawnWidth = 0;
  new ResizeObserver(() => {
    if (!strip.clientWidth || strip.clientWidth === drawnWidth) return;
    drawnWidth = strip.clientWidth;
    clearTimeout(resizing);
    resizing = setTimeout(() => { drawChart(); fitLabels(); }, 150);
  }).observe(strip);
  start();
})();
