// Builds dist/plotly-timeline.min.js from plotly-timeline.js with the options of plotly.js's own
// build (node_modules/plotly.js/esbuild-config.js), minified. Run by scripts/assets.sh.
//
// package.json pins regl-line2d to 3.1.3 ("overrides"), the version plotly.js's own dist holds:
// 3.1.4 takes a reversed axis range (the Gantt's lanes run downwards) for an empty one and draws
// every WebGL line on the plot's edge. timelines/tests/test_browser_drawing.py reads the pixels
// of the built bundle's Gantt and fails on such a build.
'use strict';

const path = require('path');
const esbuild = require('esbuild');
const { environmentPlugin } = require('esbuild-plugin-environment');
const { glsl } = require('esbuild-plugin-glsl');
const InlineCSSPlugin = require('esbuild-plugin-inline-css');
const { version } = require('plotly.js/package.json');

const outfile = path.join(__dirname, 'dist', 'plotly-timeline.min.js');

esbuild.build({
  entryPoints: [path.join(__dirname, 'plotly-timeline.js')],
  outfile,
  format: 'iife',
  globalName: 'Plotly',
  bundle: true,
  minify: true,
  sourcemap: false,
  banner: {
    js: `/*! plotly.js v${version}, partial bundle for Hindsight (core, scattergl, heatmap, bar, box). ` +
        'Copyright Plotly Technologies Inc. MIT license */',
  },
  plugins: [InlineCSSPlugin(), glsl({ minify: true }), environmentPlugin({ NODE_DEBUG: false })],
  alias: {
    // as in plotly.js: gl-text must use the plotly flavour of regl (one copy, not two)
    regl: '@plotly/regl',
    stream: 'stream-browserify',
  },
  define: { global: 'window', 'define.amd': 'false' },
  target: 'es2016',
  logLevel: 'warning',
}).then(() => {
  console.log(`${path.relative(process.cwd(), outfile)}: plotly.js v${version}`);
}, () => {
  process.exit(1);  // esbuild has already printed the errors
});
