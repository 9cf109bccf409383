// Small helpers shared by the incident page's scripts (event-detail.js, timeline.js, notes.js,
// sequences.js, share.js).
// Every value goes into the DOM as text (textContent, attributes), never as HTML.
(function () {
  "use strict";

  // el("a", {href: url, class: "x"}, "text", otherNode) → a new element
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "class") node.className = value;
      else if (key === "dataset") Object.assign(node.dataset, value);
      else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
      else node.setAttribute(key, value === true ? "" : String(value));
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  // GET a JSON resource of our API with the session cookie; rejects with an Error whose
  // .status and .body (the parsed answer, when JSON) say what went wrong.
  async function getJSON(url, options) {
    const answer = await fetch(url, Object.assign(
      {headers: {Accept: "application/json"}, credentials: "same-origin"}, options || {}));
    let body = null;
    try { body = await answer.json(); } catch (err) { body = null; }
    if (!answer.ok) {
      const error = new Error((body && body.detail) || "HTTP " + answer.status);
      error.status = answer.status;
      error.body = body;
      throw error;
    }
    return body;
  }

  // --- for the notes, sequences and share panels (notes.js, sequences.js, share.js) ----------

  // The CSRF token the page was rendered with (data-csrf-token), else Django's cookie.
  function csrfToken() {
    const holder = document.querySelector("[data-csrf-token]");
    if (holder && holder.dataset.csrfToken) return holder.dataset.csrfToken;
    const match = /(?:^|;\s*)csrftoken=([^;]+)/.exec(document.cookie);
    return match ? decodeURIComponent(match[1]) : "";
  }

  // A DRF error body as one line: {"detail": "…"} or {"field": ["…"], "steps": {"0": {…}}}.
  function problem(body) {
    if (!body || typeof body !== "object") return body ? String(body) : "";
    if (Array.isArray(body)) return body.map(problem).join(" ");
    if (body.detail) return String(body.detail);
    return Object.entries(body).map(([key, value]) => (
      key === "non_field_errors" ? problem(value) : key + ": " + problem(value))).join("; ");
  }

  // POST/PATCH/PUT/DELETE JSON to our API with the session and the CSRF token; resolves with
  // the parsed answer (null for 204), rejects like getJSON with the server's reason.
  async function sendJSON(url, method, data) {
    const options = {method, credentials: "same-origin",
                     headers: {Accept: "application/json", "X-CSRFToken": csrfToken()}};
    if (data !== undefined) {
      options.headers["Content-Type"] = "application/json";
      options.body = JSON.stringify(data);
    }
    const answer = await fetch(url, options);
    let body = null;
    if (answer.status !== 204) {
      try { body = await answer.json(); } catch (err) { body = null; }
    }
    if (!answer.ok) {
      const error = new Error(problem(body) || "HTTP " + answer.status);
      error.status = answer.status;
      error.body = body;
      throw error;
    }
    return body;
  }

  // Every page of a cursor-paginated list ({"results", "next"}), up to `limit` items.
  async function getAll(url, limit) {
    const items = [];
    let next = url;
    while (next && items.length < (limit || 5000)) {
      const page = await getJSON(next);
      items.push(...page.results);
      next = page.next;
    }
    return items;
  }

  // Text for plotly's labels, which read a few HTML tags and entities: make them inert.
  function plotlyText(text) {
    return String(text).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
  }

  // A duration for people, as incidents.notes.format_duration writes it: "7 ms", "1.5 s",
  // "2 min 3 s" (whole seconds from a minute on).
  function formatDuration(ms) {
    const trim = (value) => value.toFixed(3).replace(/\.?0+$/, "");
    ms = Math.abs(ms);
    if (Math.round(ms * 1000) / 1000 < 1000) return trim(ms) + " ms";
    if (Math.round(ms) / 1000 < 60) return trim(ms / 1000) + " s";
    let seconds = Math.round(ms / 1000);
    const parts = [];
    for (const [size, unit] of [[86400, "d"], [3600, "h"], [60, "min"], [1, "s"]]) {
      const n = Math.floor(seconds / size);
      seconds -= n * size;
      if (n) parts.push(n + " " + unit);
    }
    return parts.join(" ");
  }

  // "2018-10-26T13:25:18.266512Z" → "2018-10-26 13:25:18.266512" (UTC, as the table shows it)
  function shortTime(iso) {
    return iso ? String(iso).replace("T", " ").replace(/(Z|[+-]00:00)$/, "") : "";
  }

  // A field's value as the page names it and a filter takes it: "(none)" for an event without
  // one (an empty text, no code; timelines.figures.lanes.NONE)
  function valueName(value) {
    return value === "" || value === null || value === undefined ? "(none)" : String(value);
  }

  window.Hindsight = {el, getJSON, shortTime, sendJSON, getAll, problem, plotlyText,
                      formatDuration, csrfToken, valueName};
})();
