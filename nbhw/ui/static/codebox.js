// The code box of nbhw's Load tab: the previewed cell, "Insert cell below" and "Copy".
//
// Insert needs nbhw's JupyterLab extension (js/src/index.js): this view dispatches a bubbling DOM event with the
// code it shows, and the extension inserts a cell holding exactly that code directly below the cell whose output
// holds this view. The kernel is not involved, so it works while another cell runs. Where no extension answers
// (VS Code, Colab) the view says so; Copy and the selectable code stay.

const INSERT_EVENT = 'nbhw-insert-cell'; // keep in sync with js/src/index.js

function button(label, cls) {
  const b = document.createElement('button');
  b.type = 'button';
  b.textContent = label;
  b.className = `jupyter-button widget-button nbhw-codebox-${cls}`;
  return b;
}

function selectText(node) {
  const range = document.createRange();
  range.selectNodeContents(node);
  const selection = window.getSelection();
  selection.removeAllRanges();
  selection.addRange(range);
}

async function copyText(code, node) {
  try {
    await navigator.clipboard.writeText(code);
    return 'Copied to the clipboard';
  } catch (e) {
    // No clipboard API here (an insecure origin, some webviews): copy the selection the old way.
    selectText(node);
    try {
      if (document.execCommand('copy')) {
        return 'Copied to the clipboard';
      }
    } catch (e2) {
      // fall through: the code stays selected
    }
    return 'The code is selected: press Ctrl+C (Cmd+C) to copy it';
  }
}

function render({ model, el }) {
  el.classList.add('nbhw-codebox');
  const code = document.createElement('pre');
  code.className = 'nbhw-codebox-code';
  const bar = document.createElement('div');
  bar.className = 'nbhw-codebox-bar';
  const insert = button('Insert cell below', 'insert');
  const copy = button('Copy', 'copy');
  const status = document.createElement('span');
  status.className = 'nbhw-codebox-status';
  bar.append(insert, copy, status);
  el.append(code, bar);

  const show = () => {
    const text = model.get('code');
    code.innerHTML = model.get('html');
    code.dataset.empty = text ? 'false' : 'true';
    insert.disabled = !text;
    copy.disabled = !text;
    status.textContent = model.get('note');
  };
  insert.addEventListener('click', () => {
    const text = model.get('code');
    if (!text) {
      return;
    }
    const event = new CustomEvent(INSERT_EVENT, { bubbles: true, cancelable: true, detail: { code: text } });
    const inserted = !el.dispatchEvent(event);
    status.textContent = inserted
      ? 'Inserted a cell below'
      : "This front end can't insert cells from here (it needs JupyterLab 4 or Notebook 7 with nbhw installed): use Copy, or select the code";
  });
  copy.addEventListener('click', async () => {
    const text = model.get('code');
    if (text) {
      status.textContent = await copyText(text, code);
    }
  });
  model.on('change:code', show);
  model.on('change:html', show);
  model.on('change:note', show);
  show();
  return () => {
    model.off('change:code', show);
    model.off('change:html', show);
    model.off('change:note', show);
  };
}

export default { render };
