// Incident page: rename, move to another team, delete (loaded for the incident's admins and
// superusers only). Each is a call to the incident's API (PATCH, DELETE) with the session and the
// CSRF token, as share.js makes them; a refusal is shown beside the controls (or in the delete
// dialog) with the server's reason, never swallowed.
// Loaded before dom.js: it starts once every deferred script has run.
document.addEventListener("DOMContentLoaded", () => {
  "use strict";
  const {sendJSON} = window.Hindsight;
  const $ = (id) => document.getElementById(id);
  const panel = $("incident-admin");
  if (!panel) return;
  const url = panel.dataset.url;
  let title = $("incident-title").textContent;

  function say(text) {
    $("admin-status").textContent = text;
  }

  // --- rename: the title changes in place, no reload --------------------------------------------
  const renameForm = $("rename-form");

  function editing(on) {
    renameForm.hidden = !on;
    $("rename").hidden = on;
    if (on) {
      renameForm.elements.title.value = title;
      renameForm.elements.title.select();
    }
  }

  async function rename(e) {
    e.preventDefault();
    const wanted = renameForm.elements.title.value.trim();
    if (!wanted) {
      say("A title cannot be empty.");
      return;
    }
    const save = renameForm.querySelector("button:not([type=button])");
    save.disabled = true;
    try {
      title = (await sendJSON(url, "PATCH", {title: wanted})).title;
    } catch (err) {
      say("Could not rename it: " + err.message);
      return;
    } finally {
      save.disabled = false;
    }
    $("incident-title").textContent = title;
    $("delete-title").textContent = title;
    document.title = title + " · Hindsight";
    editing(false);
    say("Renamed.");
  }

  $("rename").addEventListener("click", () => editing(true));
  $("rename-cancel").addEventListener("click", () => editing(false));
  renameForm.addEventListener("submit", rename);

  // --- move: another team owns it; the page is loaded again (what one may do may change) --------
  const teams = $("move-team");
  if (teams) {
    teams.addEventListener("change", () => {
      $("move").disabled = !teams.value;
    });
    $("move").addEventListener("click", async () => {
      const team = teams.value;
      if (!team) return;
      $("move").disabled = true;
      try {
        await sendJSON(url, "PATCH", {team});
      } catch (err) {
        say("Could not move it: " + err.message);
        $("move").disabled = false;
        return;
      }
      say("Moved to " + team + ".");
      window.location.reload();
    });
  }

  // --- delete: confirmed by typing the title, then to the incident list --------------------------
  const dialog = $("delete-dialog");
  const form = $("delete-form");
  const typed = form.elements.confirm;
  const confirm = $("delete-confirm");

  function matches() {
    return typed.value.trim() === title.trim();
  }

  $("delete").addEventListener("click", () => {
    form.reset();
    confirm.disabled = true;
    $("delete-status").textContent = "";
    dialog.showModal();
    typed.focus();
  });
  $("delete-cancel").addEventListener("click", () => dialog.close());
  typed.addEventListener("input", () => {
    confirm.disabled = !matches();
  });
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    if (!matches()) return;
    confirm.disabled = true;
    $("delete-status").textContent = "Deleting…";
    try {
      await sendJSON(url, "DELETE");
    } catch (err) {
      $("delete-status").textContent = "Could not delete it: " + err.message;
      confirm.disabled = false;
      return;
    }
    // the list says it was deleted (a message of the session, see IncidentViewSet.destroy)
    window.location.assign(panel.dataset.listUrl);
  });
});
