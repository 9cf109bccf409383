// The hover texts of a timeline figure (a Gantt of timelines/figures/build.py), shared by the pages
// that draw one: the incident page (timeline.js) and a stream's live view (stream.js).
// Hover texts come as numbers into the figure's table of strings (figure.labels), to keep the
// answer small; joined here as timelines/figures/build.py hover_texts says (a browser test compares
// the two). A bar is a segment of three points (start, end, gap): its text goes on both ends (a
// short bar is two pixels wide, and the pointer is as often nearer its end).
(function () {
  "use strict";

  // HH:MM:SS.ffffff (UTC) of an x value (epoch milliseconds, exact to the microsecond)
  function clock(ms) {
    const micros = ((Math.round(ms * 1000) % 86400e6) + 86400e6) % 86400e6;
    const pad = (n, width) => String(Math.floor(n)).padStart(width, "0");
    return pad(micros / 3600e6, 2) + ":" + pad(micros / 60e6 % 60, 2) + ":" +
      pad(micros / 1e6 % 60, 2) + "." + pad(micros % 1e6, 6);
  }

  // Sets each trace's text from its labels (and drops the labels, which are not plotly's).
  function hoverTexts(figure) {
    const strings = figure.labels || [];
    for (const trace of figure.data || []) {
      const {labels, x, y} = trace;
      delete trace.labels;
      if (!labels) {  // texts of their own (lifespans): each bar's on its end too
        const text = trace.text;
        if (trace.mode !== "lines" || !Array.isArray(text) || !Array.isArray(y)) continue;
        for (let i = 1; i < text.length; i++) {
          if (text[i] === null && y[i] !== null && y[i - 1] !== null) text[i] = text[i - 1];
        }
        continue;
      }
      const parts = labels.parts;
      const text = new Array(x.length).fill(null);
      if (labels.form === "bar") {
        for (let p = 0, i = 0; p < parts.length; p += 4, i += 3) {
          const took = parts[p + 3] < 0 ? "open" : (parts[p + 3] / 1000).toFixed(3) + " ms";
          text[i] = text[i + 1] = clock(x[i]) + " " + labels.kind + " " + strings[parts[p]] +
            " " + strings[parts[p + 1]] + " " + strings[parts[p + 2]] + " (" + took + ")";
        }
      } else if (labels.form === "detection") {  // [rules, what, object, user] per star
        for (let i = 0; i < x.length; i++) {
          text[i] = "⚑ " + strings[parts[4 * i]] + ": " + strings[parts[4 * i + 1]] + " " +
            strings[parts[4 * i + 2]] + " by " + strings[parts[4 * i + 3]] + " at " +
            clock(x[i]);
        }
      } else {  // a mutation marker: [what, user]
        for (let i = 0; i < x.length; i++) {
          text[i] = strings[parts[2 * i]] + " by " + strings[parts[2 * i + 1]] + " at " +
            clock(x[i]);
        }
      }
      trace.text = text;
    }
  }

  window.HindsightHover = {clock, hoverTexts};
})();
