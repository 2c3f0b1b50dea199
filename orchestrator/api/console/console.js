// ThinkServe console: collections, documents, uploads and streamed answers over the JSON API (/api/v1).
// No framework and nothing from elsewhere; every server string reaches the page as text, never as HTML.
// The entry point (index.html loads it as a module); each part is a module of its own.

import { saveToken, signOut, updateSignOut } from "./api.js";
import { booleanChoices, onAsk } from "./asking.js";
import { createCollection, deleteCollection, enqueueUploads, loadDocuments, onReplacementChosen, refreshAll, renderDocuments, selectCollection, setUpDropArea, updateUploadTarget } from "./library.js";
import { ui } from "./page.js";
import { setUpViewer } from "./pages.js";

function init() {
  ui.tokenForm.addEventListener("submit", saveToken);
  ui.signOut.addEventListener("click", signOut);
  ui.collectionSelect.addEventListener("change", () => {
    selectCollection(ui.collectionSelect.value);
    loadDocuments();
  });
  ui.createForm.addEventListener("submit", createCollection);
  ui.newName.addEventListener("input", updateUploadTarget);
  ui.deleteCollection.addEventListener("click", deleteCollection);
  ui.fileInput.addEventListener("change", () => {
    enqueueUploads(Array.from(ui.fileInput.files).map((file) => ({ file, name: file.name })));
    ui.fileInput.value = ""; // choosing the same file again still fires "change"
  });
  ui.replaceInput.addEventListener("change", onReplacementChosen);
  ui.askForm.addEventListener("submit", onAsk);
  booleanChoices();
  setUpDropArea();
  setUpViewer();
  updateSignOut();
  renderDocuments([]);
  refreshAll();
}

init();
