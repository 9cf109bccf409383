// Incident page: each filter box offers the incident's values with their counts under the
// current filters (its own left out, so that another value can be added), most frequent first;
// typing narrows them (the server matches the text anywhere in the value, in any case).
// Data: /api/v1/incidents/{id}/facets/?field=… (timelines.reads.facets).
(function () {
  "use strict";
  const {el, getJSON, valueName} = window.Hindsight;
  const Timeline = window.HindsightTimeline;
  const form = document.getElementById("filters");
  if (!form || !Timeline || !form.dataset.facetsUrl) return;

  const LIMIT = 20;
  const WAIT_MS = 200;  // after the last key, before asking

  function attach(input) {
    const field = input.name;
    const list = el("datalist", {id: "suggest-" + field});
    input.after(list);
    input.setAttribute("list", list.id);
    input.setAttribute("autocomplete", "off");
    let asked = null;    // the query of the options shown or being fetched
    let pending = 0;
    let controller = null;

    async function suggest() {
      const query = Timeline.filters(true);
      query.delete(field);
      query.set("field", field);
      query.set("limit", LIMIT);
      const typed = input.value.trim();
      if (typed) query.set("contains", typed);
      const key = query.toString();
      if (key === asked) return;
      asked = key;
      if (controller) controller.abort();
      controller = new AbortController();
      let answer;
      try {
        answer = await getJSON(form.dataset.facetsUrl + "?" + key, {signal: controller.signal});
      } catch (err) {
        if (err.name !== "AbortError") asked = null;  // try again on the next key or focus
        return;
      }
      if (key !== asked) return;
      // the events without the field as "(none)", a filter too
      list.replaceChildren(...answer.values.map((v) => el("option", {value: valueName(v.value),
        label: valueName(v.value) + " — " + v.count.toLocaleString("en-US") +
          (v.errors ? " (" + v.errors + " errors)" : "")})));
      input.dataset.suggested = String(list.children.length);
    }

    input.addEventListener("focus", suggest);
    input.addEventListener("input", () => {
      clearTimeout(pending);
      pending = setTimeout(suggest, WAIT_MS);
    });
  }

  for (const input of form.querySelectorAll("input[data-suggest]")) attach(input);
})();
