#!/usr/bin/env bash
# The documentation site, built from a fresh clone with one command:
#   scripts/docs.sh            sets up .venv if needed, builds docs/_build/html afresh (warnings are errors)
#   scripts/docs.sh OUT_DIR    builds into OUT_DIR instead (the test suite builds into a temporary folder)
# Every guide notebook is executed during the build (docs/conf.py); a cell that fails, a broken link or a public
# name without a docstring fails it. The output is a static folder: open OUT_DIR/index.html in a browser.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-docs/_build/html}"

# A .venv that can build: set up (or completed) by scripts/setup.sh, which is idempotent.
if ! .venv/bin/python -c "import sphinx, myst_nb, furo" 2>/dev/null; then
  scripts/setup.sh docs
fi

# The pages show the notebooks' widgets from their saved state, drawn by require.js and @jupyter-widgets/html-manager
# (and anywidget's front end for nbhw's code box and plotly's figures). Saved once beside the docs (docs/_vendor,
# ignored by git), so the site draws its widgets offline; without them (no npm registry reachable) docs/conf.py
# points the pages at the jsDelivr CDN instead, and the widgets draw only where that is reachable.
vendor=docs/_vendor/widgets
fetch_package() {  # name version sha256-of-the-tarball files-in-it...
  local name="$1" version="$2" sha="$3" tmp tarball
  shift 3
  tmp="$(mktemp -d)"
  tarball="$tmp/package.tgz"
  if command -v npm >/dev/null 2>&1; then
    (cd "$tmp" && npm pack --silent "$name@$version" >/dev/null 2>&1 && mv ./*.tgz package.tgz) || true
  fi
  if [ ! -s "$tarball" ] && command -v curl >/dev/null 2>&1; then
    curl -fsSL -o "$tarball" "https://registry.npmjs.org/$name/-/${name##*/}-$version.tgz" 2>/dev/null || true
  fi
  if [ -s "$tarball" ] && echo "$sha  $tarball" | sha256sum -c --quiet - 2>/dev/null; then
    mkdir -p "$tmp/x" && tar -xzf "$tarball" -C "$tmp/x"
    for file in "$@"; do cp $tmp/x/package/$file "$vendor/"; done  # unquoted: a file may be a pattern
    rm -rf "$tmp"
    return 0
  fi
  rm -rf "$tmp"
  return 1
}
if [ ! -s "$vendor/anywidget.js" ]; then
  rm -rf "$vendor" && mkdir -p "$vendor"
  if fetch_package requirejs 2.3.7 31f3330c978fb28684622fe71165dc946432cf0210b2ea8a1ca0233e70f2737d require.js &&
    fetch_package @jupyter-widgets/html-manager 1.0.15 \
      2b9d65cb7913e1c7d671757a10008b32c9c2448d4429513371e55c07d6107638 \
      dist/embed-amd.js 'dist/*.eot' 'dist/*.svg' 'dist/*.ttf' 'dist/*.woff' 'dist/*.woff2' &&
    fetch_package anywidget 0.11.0 44efed0d0c9999ec94cd3a86e317e902591f01df8edb3c8006b7e390b7e15ed8 dist/index.js &&
    mv "$vendor/index.js" "$vendor/anywidget.js"; then
    echo "widget scripts saved in $vendor: the site draws its widgets offline"
  else
    rm -rf "$vendor"
    echo "note: the npm registry could not be reached; the pages load the widget scripts from the jsDelivr CDN" >&2
  fi
fi

start=$SECONDS
# -E: a fresh environment, so every notebook runs again on the code as it is now (Sphinx would reuse the last
# build's outputs of a notebook that did not change).
.venv/bin/python -m sphinx -E -W --keep-going -b html docs "$out"
echo "built in $((SECONDS - start)) s: open $(cd "$out" && pwd)/index.html"
