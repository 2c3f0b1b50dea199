// Collections, their documents, uploads and the server's ingest progress.

import { api, authHeaders, errorMessage, showTokenForm } from "./api.js";
import { $, COLLECTION_KEY, INGEST_POLL_MS, NAME_PATTERN, PARALLEL_UPLOADS, collectionPath, el, fmtBytes, fmtDate, fmtInt, num, setError, state, ui } from "./page.js";

let collectionsSeq = 0; // only the latest listing is drawn (uploads refresh concurrently)

async function loadCollections(prefer) {
  const seq = ++collectionsSeq;
  try {
    const data = await api("GET", "/api/v1/collections");
    if (seq !== collectionsSeq) return;
    ui.auth.hidden = true; // the call went through: no token needed, or the stored one works
    state.collections = data.collections || [];
    setError(ui.collectionError, "");
    renderCollectionOptions(prefer);
  } catch (err) {
    if (seq === collectionsSeq) setError(ui.collectionError, `Could not list collections: ${err.message}`);
  }
}

function renderCollectionOptions(prefer) {
  const names = state.collections.map((info) => info.name);
  const wanted = [prefer, state.current, sessionStorage.getItem(COLLECTION_KEY), names[0]];
  const chosen = wanted.find((name) => name && names.includes(name)) || "";
  ui.collectionSelect.replaceChildren(...state.collections.map((info) =>
    el("option", { value: info.name, text: `${info.name} (${fmtInt(info.documents)} documents)` })));
  if (!names.length) ui.collectionSelect.append(el("option", { value: "", text: "no collections yet" }));
  ui.collectionSelect.value = chosen;
  selectCollection(chosen);
}

export function selectCollection(name) {
  const changed = name !== state.current;
  state.current = name;
  if (name) sessionStorage.setItem(COLLECTION_KEY, name);
  ui.deleteCollection.disabled = !name;
  renderFigures();
  updateUploadTarget();
  return changed;
}

function renderFigures() {
  const info = state.collections.find((item) => item.name === state.current);
  if (!info) { ui.figures.replaceChildren(); return; }
  const figures = [["Documents", fmtInt(info.documents)], ["Pages", fmtInt(info.pages)],
    ["Passages", fmtInt(info.passages)], ["Chunks", fmtInt(info.chunks)], ["Units", fmtInt(info.units)],
    ["Entities", fmtInt(info.entities)], ["Relations", fmtInt(info.relations)], ["Size", fmtBytes(info.bytes)]];
  ui.figures.replaceChildren(...figures.map(([term, value]) =>
    el("div", { class: "figure" }, el("dt", { text: term }), el("dd", { text: value }))));
}

export async function createCollection(event) {
  event.preventDefault();
  const name = ui.newName.value.trim();
  if (!NAME_PATTERN.test(name)) {
    setError(ui.collectionError, "A name is 1 to 64 lower-case letters, digits, \"_\" or \"-\", starting with a letter or digit.");
    ui.newName.focus();
    return;
  }
  ui.createButton.disabled = true;
  try {
    await api("POST", "/api/v1/collections", { name });
    ui.createForm.reset(); // emptied by a reset, the required field is not marked invalid as a typed-away one is
    setError(ui.collectionError, "");
    await loadCollections(name);
    await loadDocuments();
  } catch (err) {
    setError(ui.collectionError, `Could not create ${name}: ${err.message}`);
  } finally {
    ui.createButton.disabled = false;
  }
}

export async function deleteCollection() {
  const name = state.current;
  if (!name || !confirm(`Delete the collection "${name}" and every document in it?`)) return;
  ui.deleteCollection.disabled = true;
  try {
    await api("DELETE", collectionPath(name));
    setError(ui.collectionError, "");
    if (sessionStorage.getItem(COLLECTION_KEY) === name) sessionStorage.removeItem(COLLECTION_KEY);
    state.current = "";
    await refreshAll();
  } catch (err) {
    setError(ui.collectionError, `Could not delete ${name}: ${err.message}`);
  } finally {
    ui.deleteCollection.disabled = !state.current;
  }
}

export async function refreshAll(prefer) {
  await loadCollections(prefer);
  await loadDocuments();
}

// ------------------------------------------------------------------ documents

let documentsSeq = 0;

export async function loadDocuments() {
  const seq = ++documentsSeq;
  const name = state.current;
  ui.documentCaption.textContent = name ? `Documents in ${name}` : "Documents (no collection chosen)";
  if (!name) { renderDocuments([]); return; }
  try {
    const data = await api("GET", `${collectionPath(name)}/documents`);
    if (seq !== documentsSeq) return;
    setError(ui.documentsError, "");
    renderDocuments(data.documents || []);
  } catch (err) {
    if (seq !== documentsSeq) return;
    setError(ui.documentsError, `Could not list the documents of ${name}: ${err.message}`);
    renderDocuments([]);
  }
}

export function renderDocuments(documents) {
  const body = ui.documentTable.tBodies[0];
  if (!documents.length) {
    body.replaceChildren(el("tr", { class: "empty" }, el("td", { colspan: 9, text: "No documents yet." })));
    return;
  }
  body.replaceChildren(...documents.map(documentRow));
}

function documentRow(doc) {
  const rowError = el("span", { class: "row-error error", "aria-live": "polite" });
  const replace = el("button", { type: "button", class: "replace-document", "aria-label": `Replace ${doc.name}`,
    onclick: () => pickReplacement(doc.name) }, "Replace");
  const remove = el("button", { type: "button", class: "delete-document danger", "aria-label": `Delete ${doc.name}`,
    onclick: () => deleteDocument(doc.name, remove, rowError) }, "Delete");
  return el("tr", { class: "document", "data-name": doc.name },
    el("th", { scope: "row", class: "doc-name", title: `document id ${doc.document_id}` }, doc.name,
      el("span", { class: "hint", text: `${doc.media_type || "unknown type"} · ${fmtBytes(doc.bytes)}` })),
    ...["pages", "passages", "chunks", "units", "entities"].map((field) =>
      el("td", { class: "num", text: fmtInt(doc[field]) })),
    el("td", { class: "warnings" }, warningsList(doc.warnings || [])),
    el("td", { class: "added", text: fmtDate(doc.added_at) }),
    el("td", { class: "actions" }, replace, remove, rowError));
}

function warningsList(warnings) {
  if (!warnings.length) return "none";
  return el("details", {},
    el("summary", { text: `${warnings.length} warning${warnings.length === 1 ? "" : "s"}` }),
    el("ul", {}, warnings.map((warning) => el("li", { text: warning }))));
}

async function deleteDocument(name, button, rowError) {
  const collection = state.current;
  if (!confirm(`Delete "${name}" from ${collection}?`)) return;
  button.disabled = true;
  setError(rowError, "");
  try {
    await api("DELETE", `${collectionPath(collection)}/documents/${encodeURIComponent(name)}`);
    await refreshAll();
  } catch (err) {
    setError(rowError, err.message);
  } finally {
    button.disabled = false;
  }
}

// The row's Replace button opens one shared file picker; its choice is uploaded under the row's name.
function pickReplacement(name) {
  state.replaceName = name;
  ui.replaceInput.value = "";
  ui.replaceInput.click();
}

export function onReplacementChosen() {
  const file = ui.replaceInput.files[0];
  if (file && state.replaceName) enqueueUploads([{ file, name: state.replaceName, replacing: true }]);
}

// ------------------------------------------------------------------ uploads

const uploadQueue = [];
let uploadsRunning = 0;

/** The selected collection, or the valid name typed as a new one (the first upload creates it). */
function uploadCollection() {
  const typed = ui.newName.value.trim();
  return state.current || (NAME_PATTERN.test(typed) ? typed : "");
}

export function updateUploadTarget() {
  const target = uploadCollection();
  ui.uploadTarget.textContent = target ? `Files go to the collection ${target}.`
    : "Choose a collection, or type a new collection's name above: the first upload creates it.";
}

export function enqueueUploads(entries) {
  const collection = uploadCollection();
  if (!collection) {
    setError(ui.documentsError, "Choose a collection, or type a new collection name, before uploading.");
    return;
  }
  setError(ui.documentsError, "");
  for (const entry of entries) {
    const item = { ...entry, collection, node: uploadItem(entry, collection) };
    ui.uploadList.prepend(item.node);
    if (entry.file.size === 0) { // refused here, as the server would: no request is sent to fail
      setUploadStatus(item.node, `"${entry.name}" is empty (0 bytes): nothing to upload`, true);
      continue;
    }
    uploadQueue.push(item);
  }
  pumpUploads();
}

function pumpUploads() {
  while (uploadsRunning < PARALLEL_UPLOADS && uploadQueue.length) {
    const item = uploadQueue.shift();
    uploadsRunning += 1;
    uploadFile(item).then(async (outcome) => {
      uploadsRunning -= 1;
      pumpUploads();
      await refreshAll(item.collection); // an upload reads "done" only once the table lists its document
      setUploadStatus(item.node, outcome.text, outcome.failed);
      if (outcome.report) item.node.append(uploadReport(outcome.report));
    });
  }
}

function uploadItem(entry, collection) {
  const note = entry.replacing ? ` (replacing, from ${entry.file.name})` : "";
  return el("li", { class: "upload" },
    el("span", { class: "upload-name", text: entry.name }),
    el("span", { class: "hint", text: `${note} → ${collection}, ${fmtBytes(entry.file.size)}` }),
    el("progress", { class: "upload-progress", max: 1, value: 0, "aria-label": `Upload of ${entry.name}` }),
    el("span", { class: "upload-status", "aria-live": "polite", text: "queued" }),
    el("p", { class: "upload-live" }),
    el("ul", { class: "upload-warnings", "aria-label": `Warnings while ${entry.name} ingests` }));
}

function setUploadStatus(node, text, failed = false) {
  const status = $(".upload-status", node);
  if (status.textContent !== text) status.textContent = text; // the same text again is not announced again
  status.classList.toggle("error", failed);
  node.classList.toggle("error", failed);
}

/**
 * PUT the file's bytes with XMLHttpRequest (fetch reports no upload progress). Resolves, never rejects, with
 * the final status text: {text: "done", report} or {text: the error message, failed: true}.
 */
function uploadFile(item) {
  return new Promise((resolve) => {
    const progress = $("progress", item.node);
    const fail = (text) => {
      unwatchIngest(item);
      progress.value = 0; // stops the indeterminate "processing" animation
      resolve({ text, failed: true });
    };
    const xhr = new XMLHttpRequest();
    xhr.open("PUT", `${collectionPath(item.collection)}/documents/${encodeURIComponent(item.name)}`);
    for (const [key, value] of Object.entries(authHeaders())) xhr.setRequestHeader(key, value);
    xhr.setRequestHeader("Content-Type", item.file.type || "application/octet-stream");
    xhr.upload.onprogress = (event) => {
      if (event.lengthComputable && event.total) progress.value = event.loaded / event.total;
    };
    // Every byte is sent; the server now parses and indexes (it can take a while): the bar follows the pages it
    // has read, as it tells them (indeterminate until it has begun the document).
    xhr.upload.onload = () => {
      progress.removeAttribute("value");
      setUploadStatus(item.node, "processing");
      watchIngest(item);
    };
    xhr.onload = () => {
      unwatchIngest(item);
      let body = null;
      try { body = JSON.parse(xhr.responseText); } catch (_) { /* reported below */ }
      if (xhr.status < 200 || xhr.status >= 300 || !body) {
        const message = errorMessage(body, `${xhr.status} ${xhr.statusText}`.trim() || "the server's answer was unreadable");
        if (xhr.status === 401) showTokenForm(message);
        fail(message);
        return;
      }
      progress.value = 1;
      resolve({ text: "done", report: body });
    };
    xhr.onerror = () => fail("network error: the upload did not complete");
    xhr.onabort = () => fail("upload cancelled");
    setUploadStatus(item.node, "uploading");
    xhr.send(item.file);
  });
}

// ------------------------------------------------------------------ ingest progress, from the server

const watchedUploads = new Set(); // uploads whose bytes are sent and whose report has not come
let ingestTimer = null;

function watchIngest(item) {
  watchedUploads.add(item);
  if (!ingestTimer) ingestTimer = setTimeout(pollIngest, INGEST_POLL_MS);
}

function unwatchIngest(item) {
  watchedUploads.delete(item);
  $(".upload-live", item.node).replaceChildren();
  $(".upload-warnings", item.node).replaceChildren();
}

/** Reads what the server has done of each watched upload's document (one request per collection) and shows it. */
async function pollIngest() {
  const collections = new Set([...watchedUploads].map((item) => item.collection));
  await Promise.all([...collections].map(async (collection) => {
    let documents = null;
    let problem = "";
    try {
      documents = (await api("GET", `${collectionPath(collection)}/ingest`)).documents || [];
    } catch (err) {
      problem = `progress unavailable: ${err.message}`;
    }
    const byName = new Map((documents || []).map((doc) => [doc.name, doc]));
    for (const item of watchedUploads) {
      if (item.collection !== collection) continue;
      if (problem) $(".upload-live", item.node).textContent = problem;
      else showIngest(item, byName.get(item.name.trim()));
    }
  }));
  ingestTimer = watchedUploads.size ? setTimeout(pollIngest, INGEST_POLL_MS) : null;
}

const STAGES = { open: "opening", parse: "parsing", ocr: "reading pages by OCR", chunk: "indexing: chunks",
  describe: "indexing: describing figures", extract: "indexing: entities", embed: "indexing: embeddings",
  sentences: "indexing: sentences", commit: "saving", publish: "publishing" };

/** One document as the server has got with it: its stage, pages read of total (the bar), OCR, pages/s, warnings.
 * Not listed: not begun yet (waiting for an ingest slot), or just finished (its report is on its way). */
function showIngest(item, doc) {
  if (!doc) return;
  const total = num(doc.pages_total);
  const read = num(doc.pages_read);
  const planned = num(doc.ocr_pages_planned);
  const ocr = num(doc.ocr_pages);
  let stage = STAGES[doc.stage] || doc.stage;
  if (doc.stage === "parse" && planned) stage += "; OCR reads the pages without a text layer meanwhile";
  setUploadStatus(item.node, stage);
  const progress = $("progress", item.node);
  if (total > 0) progress.value = Math.min(1, read / total);
  const parts = [`${fmtInt(read)} of ${fmtInt(total)} pages read`];
  if (planned || ocr) parts.push(`OCR ${fmtInt(Math.min(ocr, planned || ocr))} of ${fmtInt(planned || ocr)} pages`);
  parts.push(`${num(doc.pages_per_s).toFixed(2)} pages/s`, `${num(doc.seconds).toFixed(0)} s`);
  $(".upload-live", item.node).textContent = parts.join(" · ");
  const list = $(".upload-warnings", item.node);
  const shown = [...list.children].map((li) => li.textContent);
  for (const warning of doc.warnings || []) {
    if (!shown.includes(warning)) list.append(el("li", { text: warning }));
  }
}

function uploadReport(report) {
  const doc = report.document || {};
  const warnings = doc.warnings || [];
  const figures = [["Pages", fmtInt(doc.pages)], ["Read by OCR", fmtInt(doc.ocr_pages)],
    ["Passages", fmtInt(report.passages)], ["Chunks", fmtInt(doc.chunks)],
    ["Units", fmtInt(doc.units)], ["Entities", fmtInt(doc.entities)], ["Warnings", fmtInt(warnings.length)],
    ["Seconds", num(report.seconds).toFixed(2)]];
  const notes = [];
  if (report.already_present) notes.push("already present: nothing changed");
  if (report.replaced) notes.push("replaced the earlier version");
  if (report.visible === false) notes.push("not yet visible to queries");
  const stages = (report.stages || []).map((stage) => `${stage.stage} ${(num(stage.milliseconds) / 1000).toFixed(2)} s`);
  return el("div", { class: "upload-report" },
    el("dl", { class: "figures" }, figures.map(([term, value]) =>
      el("div", { class: "figure" }, el("dt", { text: term }), el("dd", { text: value })))),
    stages.length ? el("p", { class: "stage-times", text: `Stages: ${stages.join(" · ")}` }) : null,
    notes.length ? el("p", { class: "hint", text: notes.join("; ") }) : null,
    warnings.length ? el("ul", { class: "warning-list" }, warnings.map((w) => el("li", { text: w }))) : null);
}

export function setUpDropArea() {
  const area = ui.uploadArea;
  const hasFiles = (event) => event.dataTransfer && Array.from(event.dataTransfer.types).includes("Files");
  area.addEventListener("dragover", (event) => {
    if (!hasFiles(event)) return;
    event.preventDefault();
    area.classList.add("dragging");
  });
  area.addEventListener("dragleave", (event) => {
    if (!area.contains(event.relatedTarget)) area.classList.remove("dragging");
  });
  area.addEventListener("drop", (event) => {
    event.preventDefault();
    area.classList.remove("dragging");
    const files = Array.from(event.dataTransfer.files || []);
    if (files.length) enqueueUploads(files.map((file) => ({ file, name: file.name })));
  });
  // A file dropped beside the area must not make the browser leave the console to open it.
  for (const type of ["dragover", "drop"]) {
    window.addEventListener(type, (event) => { if (hasFiles(event)) event.preventDefault(); });
  }
}
