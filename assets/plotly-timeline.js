// The plotly.js of the incident page: the core (which brings the layout, shapes, annotations,
// the mode bar and the `scatter` trace) plus the trace types timelines/figures/build.py draws
// (scattergl, heatmap) and the analysis pages draw (bar, box).
// A trace type missing here is silently drawn as `scatter`; timelines/tests/test_browser_bundle.py
// fails when the figures use one this bundle lacks.
var Plotly = require('plotly.js/lib/core');

Plotly.register([
  require('plotly.js/lib/scattergl'),
  require('plotly.js/lib/heatmap'),
  require('plotly.js/lib/bar'),
  require('plotly.js/lib/box'),
]);

module.exports = Plotly;
