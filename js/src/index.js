// nbhw in JupyterLab 4 and Notebook 7: "Insert cell below" in a panel puts the panel's code in a new cell
// directly below the cell that shows the panel.
//
// The panel's buttons (an anywidget view inside a cell's output) dispatch a bubbling DOM event carrying the
// code. This plugin finds the notebook cell whose node holds the event's target and inserts a code cell at the
// next index through the notebook's shared model. Nothing goes through the kernel, so it works while another
// cell runs, and nothing depends on which cell is active or selected.
import { INotebookTracker } from '@jupyterlab/notebook';

// Keep in sync with nbhw/ui/static/codebox.js, which dispatches it.
const INSERT_EVENT = 'nbhw-insert-cell';

function findCell(tracker, target) {
  let found = null;
  tracker.forEach(panel => {
    if (found === null && panel.content.node.contains(target)) {
      const notebook = panel.content;
      const index = notebook.widgets.findIndex(cell => cell.node.contains(target));
      if (index >= 0) {
        found = { notebook, index };
      }
    }
  });
  return found;
}

function insertBelow(tracker, event) {
  const code = event.detail && event.detail.code;
  if (!(event.target instanceof Node) || typeof code !== 'string') {
    return false;
  }
  const found = findCell(tracker, event.target);
  if (found === null || !found.notebook.model) {
    return false;
  }
  const { notebook, index } = found;
  notebook.model.sharedModel.insertCell(index + 1, { cell_type: 'code', source: code, metadata: {} });
  notebook.deselectAll();
  notebook.activeCellIndex = index + 1;
  return true;
}

const plugin = {
  id: 'nbhw:insert-cell',
  description: "Inserts the code of an nbhw panel directly below the panel's cell.",
  autoStart: true,
  requires: [INotebookTracker],
  activate: (app, tracker) => {
    document.addEventListener(INSERT_EVENT, event => {
      if (insertBelow(tracker, event)) {
        // Tells the panel the cell is in: it shows "inserted" rather than its fallback.
        event.preventDefault();
      }
    });
  }
};

export default plugin;
