// Incident page: live progress of uploads that are still being ingested.
// Polls each unfinished upload's status URL once a second and updates its row in place: the
// file being read, then "ready" (its events are there) while the analyses behind it run.
(function () {
  "use strict";
  // Analysis links (data-carry-filters) open with the page's current filters: its URL's query,
  // which the timeline keeps up to date; set before the link is followed, opened or copied
  for (const type of ["pointerdown", "focusin"]) {
    document.addEventListener(type, (event) => {
      const link = event.target.closest && event.target.closest("a[data-carry-filters]");
      if (link) link.search = window.location.search;
    });
  }
  // "Show all files": the finished uploads folded away while others run or have failed
  const all = document.getElementById("uploads-all");
  if (all) {
    all.addEventListener("click", () => {
      document.getElementById("uploads").classList.remove("attention-only");
      all.remove();
    });
  }
  const rows = Array.from(document.querySelectorAll("tr[data-upload][data-finished='0']"));
  if (!rows.length) return;

  function size(bytes) {
    const units = ["bytes", "KB", "MB", "GB", "TB"];
    let i = 0;
    while (bytes >= 1024 && i < units.length - 1) { bytes /= 1024; i++; }
    return (i ? bytes.toFixed(1) : bytes) + " " + units[i];
  }

  function set(row, field, text) {
    const cell = row.querySelector("[data-field='" + field + "']");
    if (cell) cell.textContent = text;
  }

  async function poll(row) {
    let upload;
    try {
      const answer = await fetch(row.dataset.statusUrl, {headers: {Accept: "application/json"}, credentials: "same-origin"});
      if (!answer.ok) throw new Error(answer.status);
      upload = await answer.json();
    } catch (err) {
      setTimeout(() => poll(row), 3000);  // transient: try again later
      return;
    }
    const status = row.querySelector("[data-field='status']");
    status.textContent = upload.status;
    status.className = "status status-" + upload.status;
    row.querySelector("progress").value = upload.progress;
    set(row, "bytes", size(upload.bytes_read) + " / " + size(upload.bytes_total));
    set(row, "events", upload.events);
    set(row, "skipped_lines", upload.skipped_lines);
    set(row, "redacted", upload.redacted);
    const analyses = upload.analyses || {};
    set(row, "stage", upload.stage !== "ready" ? "" : "ready; analysing" + (analyses.total
      ? " " + analyses.done + "/" + analyses.total + (analyses.running ? " (" + analyses.running + ")" : "")
      : ""));
    if (upload.stage === "ready" && !row.dataset.ready) {
      row.dataset.ready = "1";  // the first answer is there: the events can be seen already
      const hint = document.getElementById("reload-hint");
      if (hint) hint.hidden = false;
    }
    if (upload.status === "done" || upload.status === "failed") {
      if (upload.message) set(row, "problems", upload.message);
      row.dataset.finished = "1";
      const hint = document.getElementById("reload-hint");
      if (hint && !row.dataset.ready) hint.hidden = false;  // (if ready, said so already)
      return;
    }
    setTimeout(() => poll(row), 1000);
  }

  rows.forEach(poll);
})();
