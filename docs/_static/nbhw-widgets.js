// Where require.js finds the widget scripts: loaded after require.js and before @jupyter-widgets/html-manager
// (docs/conf.py). The folder is data-widgets (the CDN's) or, by default, the copy scripts/docs.sh saved in
// _static/widgets beside this file.
//  - @jupyter-widgets/*: html-manager finds its icon fonts beside the module's address; without this they are
//    looked for beside each page, where they are not.
//  - anywidget (nbhw's code box, plotly's figures): html-manager asks require.js for a module before its CDN; the
//    saved copy answers offline. With the CDN, html-manager's own fallback finds it there.
(function () {
  var script = document.currentScript;
  var widgets = script.dataset.widgets || script.src.replace(/[^/]*$/, "") + "widgets";
  var paths = { "@jupyter-widgets": widgets, "@jupyter-widgets/html-manager/dist": widgets };
  if (!script.dataset.widgets) {
    paths.anywidget = widgets + "/anywidget";
  }
  window.requirejs.config({ paths: paths });
})();
