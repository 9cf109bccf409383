// Incident page: share links (loaded for writers only). A link gives read-only access to this
// incident to whoever holds it, optionally opening the current view (the page's query: filters,
// window, lanes, colour, selected event; and the chosen sequence). Its URL is in the answer to
// creating it and nowhere else, so it is shown once here with a copy button. The list shows
// each link's uses, last use, expiry and state, with a button to revoke it.
// Loaded before dom.js: it starts once every deferred script has run.
document.addEventListener("DOMContentLoaded", () => {
  "use strict";
  const {el, getJSON, sendJSON, shortTime} = window.Hindsight;
  const $ = (id) => document.getElementById(id);
  const panel = $("share");
  if (!panel) return;
  const form = $("share-form");
  const table = $("share-links").querySelector("tbody");
  let loaded = false;

  function say(...parts) {
    $("share-status").replaceChildren(...parts);
  }

  function minute(iso) {
    return iso ? shortTime(iso).slice(0, 16) : "—";
  }

  function state(link) {
    if (link.revoked_at) return "revoked";
    return link.active ? "active" : "expired";
  }

  async function load() {
    let links;
    try {
      links = await getJSON(panel.dataset.listUrl);
    } catch (err) {
      say("could not load the links (" + err.message + ")");
      return;
    }
    loaded = true;
    table.replaceChildren(...links.map(row));
    if (!links.length) {
      table.append(el("tr", {}, el("td", {colspan: 6, class: "empty"}, "No links yet.")));
    }
    panel.dataset.loaded = String(Number(panel.dataset.loaded || 0) + 1);  // for tests
  }

  function row(link) {
    const view = link.view || {};
    const saved = [view.query ? "view: " + view.query : "",
                   view.sequence ? "sequence " + view.sequence : ""].filter(Boolean).join(" · ");
    const revoke = link.active
      ? el("button", {type: "button", class: "quiet revoke",
                      onclick: (e) => armThen(e.currentTarget, () => revokeLink(link))},
           "Revoke")
      : null;
    return el("tr", {class: "link-" + state(link), dataset: {link: link.id}},
      el("td", {},
        el("strong", {}, link.label || "(no label)"), " ",
        el("code", {class: "hint"}, link.prefix + "…"),
        el("div", {class: "hint"}, "by " + (link.created_by || "—") + ", " +
           minute(link.created_at) + (saved ? " · " + saved : ""))),
      el("td", {class: "num uses"}, link.use_count),
      el("td", {}, minute(link.last_used_at)),
      el("td", {}, link.expires_at ? minute(link.expires_at) : "never"),
      el("td", {class: "state"}, state(link)),
      el("td", {}, revoke));
  }

  function armThen(button, action) {
    if (button.dataset.armed) {
      action();
      return;
    }
    button.dataset.armed = "1";
    button.textContent = "Really revoke?";
    button.classList.add("danger");
    setTimeout(() => {
      delete button.dataset.armed;
      button.textContent = "Revoke";
      button.classList.remove("danger");
    }, 4000);
  }

  async function revokeLink(link) {
    try {
      await sendJSON(panel.dataset.itemUrl + link.id + "/", "DELETE");
    } catch (err) {
      say("could not revoke the link (" + err.message + ")");
      return;
    }
    say("Link " + link.prefix + "… revoked: it stopped working.");
    load();
  }

  // The view as the page's URL holds it; the sequence goes in view.sequence.
  function currentView() {
    const query = new URLSearchParams(window.location.search);
    const sequence = query.get("sequence");
    for (const name of ["sequence", "after", "partial"]) query.delete(name);
    const view = {query: query.toString()};
    if (/^\d+$/.test(sequence || "")) view.sequence = Number(sequence);
    return view;
  }

  async function create(e) {
    e.preventDefault();
    const data = {label: form.elements.label.value.trim()};
    if (form.elements.expires_in.value) data.expires_in = Number(form.elements.expires_in.value);
    if (form.elements.view.checked) data.view = currentView();
    const button = $("share-create");
    button.disabled = true;
    let link;
    try {
      link = await sendJSON(panel.dataset.listUrl, "POST", data);
    } catch (err) {
      say("could not create the link (" + err.message + ")");
      return;
    } finally {
      button.disabled = false;
    }
    $("share-url").value = link.url;
    $("share-created").hidden = false;
    $("share-url").select();
    say("");
    form.reset();
    load();
  }

  async function copy() {
    const input = $("share-url");
    try {
      await navigator.clipboard.writeText(input.value);
      say("Link copied.");
    } catch (err) {  // no clipboard (plain http, permissions): it is selected for the user
      input.select();
      say("Press Ctrl+C to copy the selected link.");
    }
  }

  form.addEventListener("submit", create);
  $("share-copy").addEventListener("click", copy);
  panel.addEventListener("toggle", () => {
    if (panel.open && !loaded) load();
  });
  if (panel.open) load();
});
