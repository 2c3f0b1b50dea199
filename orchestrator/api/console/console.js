// ThinkServe console: collections, documents, uploads and streamed answers over the JSON API (/api/v1).
// No framework and nothing from elsewhere; every server string reaches the page as text, never as HTML.
(() => {
  "use strict";

  const TOKEN_KEY = "thinkserve-token";
  const COLLECTION_KEY = "thinkserve-collection";
  const NAME_PATTERN = /^[a-z0-9][a-z0-9_-]{0,63}$/;
  const PARALLEL_UPLOADS = 2;
  const INGEST_POLL_MS = 500; // how often the server's ingest progress is read while a document ingests
  const SHORT_TEXT = 320; // characters of an evidence item shown before "full text"
  const SIGNALS = ["final", "fused", "semantic", "lexical", "structural", "modality", "page_lexical",
    "rerank", "page_similarity", "page_relevance"];

  const $ = (selector, root = document) => root.querySelector(selector);
  const ui = {
    signOut: $("#sign-out"), auth: $("#auth"), tokenForm: $("#token-form"), tokenInput: $("#token-input"),
    tokenError: $("#token-error"), collectionSelect: $("#collection-select"), figures: $("#collection-figures"),
    deleteCollection: $("#delete-collection"), createForm: $("#create-collection-form"),
    newName: $("#new-collection-name"), createButton: $("#create-collection"), collectionError: $("#collection-error"),
    uploadArea: $("#upload-area"), fileInput: $("#file-input"), uploadTarget: $("#upload-target"),
    uploadList: $("#upload-list"), documentsError: $("#documents-error"), documentTable: $("#document-list"),
    documentCaption: $("#document-caption"), replaceInput: $("#replace-input"), askForm: $("#ask-form"),
    question: $("#question"), askButton: $("#ask"), askError: $("#ask-error"), options: $("#options"),
    results: $("#results"), noResults: $("#no-results"), viewer: $("#page-viewer"),
    viewerTitle: $("#page-viewer-title"), viewerFrame: $("#page-viewer-figure"), viewerClose: $("#page-viewer-close"),
  };
  const state = { collections: [], current: "", replaceName: "", viewerOpener: null };

  // ------------------------------------------------------------------ small helpers

  /** An element with attributes ("class", "text", on<event> handlers) and children (nodes or text). */
  function el(tag, attrs = {}, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs)) {
      if (value === undefined || value === null || value === false) continue;
      if (key === "class") node.className = value;
      else if (key === "text") node.textContent = value;
      else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
      else node.setAttribute(key, value === true ? "" : String(value));
    }
    for (const child of children.flat()) {
      if (child !== null && child !== undefined && child !== false) node.append(child);
    }
    return node;
  }

  const num = (value) => Number(value) || 0; // int64 fields come as strings
  const fmtInt = (value) => num(value).toLocaleString("en");
  const fmtMs = (ms) => `${num(ms).toLocaleString("en", { maximumFractionDigits: 1 })} ms`;
  const fmtScore = (value) => num(value).toFixed(3);

  function fmtBytes(value) {
    let size = num(value);
    const units = ["B", "KB", "MB", "GB", "TB"];
    let unit = 0;
    while (size >= 1024 && unit < units.length - 1) { size /= 1024; unit += 1; }
    return `${size.toFixed(unit ? 1 : 0)} ${units[unit]}`;
  }

  function fmtDate(seconds) {
    if (num(seconds) <= 0) return "—";
    const date = new Date(num(seconds) * 1000);
    const pad = (n) => String(n).padStart(2, "0");
    return `${date.getFullYear()}-${pad(date.getMonth() + 1)}-${pad(date.getDate())} ${pad(date.getHours())}:${pad(date.getMinutes())}`;
  }

  function shorten(text, limit) {
    return text.length > limit ? `${text.slice(0, limit).trimEnd()}…` : text;
  }

  function setError(node, message) {
    node.textContent = message || "";
  }

  const collectionPath = (name) => `/api/v1/collections/${encodeURIComponent(name)}`;

  // ------------------------------------------------------------------ API and token

  class ApiError extends Error {
    constructor(message, status, code) {
      super(message);
      this.status = status;
      this.code = code;
    }
  }

  const token = () => sessionStorage.getItem(TOKEN_KEY) || "";

  function authHeaders(extra = {}) {
    const value = token();
    return value ? { ...extra, Authorization: `Bearer ${value}` } : { ...extra };
  }

  function errorMessage(body, fallback) {
    return (body && body.error && body.error.message) || fallback;
  }

  /** The ApiError of a non-2xx response (its JSON error.message); a 401 brings the token form back. */
  async function errorFrom(response) {
    let body = null;
    try { body = await response.json(); } catch (_) { /* not JSON: the status line will do */ }
    const message = errorMessage(body, `${response.status} ${response.statusText}`.trim());
    if (response.status === 401) showTokenForm(message);
    return new ApiError(message, response.status, (body && body.error && body.error.code) || "");
  }

  async function api(method, path, body) {
    const init = { method, headers: authHeaders() };
    if (body !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    let response;
    try {
      response = await fetch(path, init);
    } catch (err) {
      throw new ApiError(`network error: ${err.message}`, 0, "NETWORK");
    }
    if (!response.ok) throw await errorFrom(response);
    return response.json();
  }

  function showTokenForm(message) {
    const wasHidden = ui.auth.hidden;
    ui.auth.hidden = false;
    setError(ui.tokenError, message);
    if (wasHidden) ui.tokenInput.focus();
  }

  function saveToken(event) {
    event.preventDefault();
    const value = ui.tokenInput.value.trim();
    if (!value) { setError(ui.tokenError, "Enter a token."); return; }
    sessionStorage.setItem(TOKEN_KEY, value);
    ui.tokenInput.value = "";
    setError(ui.tokenError, "");
    ui.auth.hidden = true;
    updateSignOut();
    refreshAll();
  }

  function signOut() {
    sessionStorage.removeItem(TOKEN_KEY);
    forgetPageImages(); // they were fetched with the old token's rights
    updateSignOut();
    showTokenForm("");
  }

  function updateSignOut() {
    ui.signOut.hidden = !token();
  }

  // ------------------------------------------------------------------ collections

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

  function selectCollection(name) {
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

  async function createCollection(event) {
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

  async function deleteCollection() {
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

  async function refreshAll(prefer) {
    await loadCollections(prefer);
    await loadDocuments();
  }

  // ------------------------------------------------------------------ documents

  let documentsSeq = 0;

  async function loadDocuments() {
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

  function renderDocuments(documents) {
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

  function onReplacementChosen() {
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

  function updateUploadTarget() {
    const target = uploadCollection();
    ui.uploadTarget.textContent = target ? `Files go to the collection ${target}.`
      : "Choose a collection, or type a new collection's name above: the first upload creates it.";
  }

  function enqueueUploads(entries) {
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

  function setUpDropArea() {
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

  // ------------------------------------------------------------------ asking

  let askPending = 0;
  let cardCount = 0;

  /** The options set in the panel: numbers, booleans ("on"/"off") and enums; empty ones are left out. */
  /** Every on/off option offers the same three choices: the server's default, on, off. */
  function booleanChoices() {
    for (const select of ui.options.querySelectorAll('select[data-kind="bool"]')) {
      select.replaceChildren(...[["", "server default"], ["on", "on"], ["off", "off"]].map(([value, text]) =>
        el("option", { value, text })));
    }
  }

  function readOptions() {
    const options = {};
    const problems = [];
    for (const field of ui.options.querySelectorAll("[name]")) {
      const raw = field.value.trim();
      if (!field.checkValidity()) { problems.push(`${field.name}: ${field.validationMessage}`); continue; }
      if (!raw) continue;
      const kind = field.dataset.kind;
      if (kind === "bool") options[field.name] = raw === "on";
      else if (kind === "int") {
        if (!/^-?\d+$/.test(raw)) { problems.push(`${field.name} must be a whole number`); continue; }
        // seed is a uint64: protobuf's JSON takes a string where a number would lose digits
        options[field.name] = Number.isSafeInteger(Number(raw)) ? Number(raw) : raw;
      } else if (kind === "float") options[field.name] = Number(raw);
      else options[field.name] = raw;
    }
    return { options, problems };
  }

  function describeOptions(options) {
    const parts = Object.entries(options).map(([key, value]) =>
      `${key}=${typeof value === "boolean" ? (value ? "on" : "off") : value}`);
    return parts.length ? parts.join(", ") : "server defaults";
  }

  function onAsk(event) {
    event.preventDefault();
    const question = ui.question.value.trim();
    if (!question) { setError(ui.askError, "Type a question first."); ui.question.focus(); return; }
    if (!state.current) { setError(ui.askError, "Choose or create a collection first."); return; }
    const { options, problems } = readOptions();
    if (problems.length) { setError(ui.askError, problems.join("; ")); return; }
    setError(ui.askError, "");
    const card = createCard(question, options, state.current);
    ui.results.prepend(card.node);
    ui.noResults.hidden = true;
    runQuery(card);
  }

  /** A part of the card a person opens when they want it (how the answer was made): folded away at first. */
  function block(title, content) {
    return el("details", { class: "block", hidden: true }, el("summary", {}, el("h4", { text: title })), content);
  }

  /**
   * A card reads at a glance: the answer, its citations and the cited page with the quoted sentences marked come
   * first; the route, the evidence list, the timings and the cost are folded away below.
   */
  function createCard(question, options, collection) {
    const id = `result-${++cardCount}`;
    const card = { id, question, options, collection, controller: null, evidence: new Map() };
    card.status = el("div", { class: "status", "aria-live": "polite", role: "status" });
    card.retry = el("button", { type: "button", class: "retry", hidden: true, onclick: () => retry(card) }, "Retry");
    card.answer = el("p", { class: "answer-text", "aria-live": "polite", onclick: (e) => followMarker(card, e) });
    card.info = el("div", { class: "answer-info" });
    card.citations = el("ul", { class: "citations" });
    card.citationsTitle = el("h4", { text: "Citations" });
    // not a landmark: every card has its citations, and landmarks of one name would be many
    card.citationsPart = el("div", { class: "citations-part", hidden: true }, card.citationsTitle, card.citations);
    card.otherQuotes = el("ul", { class: "citations other" });
    card.page = el("div", { class: "answer-page" });
    card.route = el("div", { class: "route" });
    card.evidenceList = el("ol", { class: "evidence" });
    card.waterfall = el("div", { class: "waterfall" });
    card.cost = el("table", { class: "cost" });
    card.blocks = {
      others: block("Also quoted, from lower-ranked evidence", card.otherQuotes),
      route: block("Route", card.route), evidence: block("Evidence", card.evidenceList),
      waterfall: block("Where the time went", card.waterfall), cost: block("Model calls and cost", card.cost),
    };
    card.heading = el("h3", { id: `${id}-q`, tabindex: -1, text: question });
    card.node = el("article", { class: "result", id, "aria-labelledby": `${id}-q` },
      el("header", { class: "result-head" }, card.heading,
        el("button", { type: "button", class: "close", "aria-describedby": `${id}-q`, onclick: () => closeCard(card) },
          "Close")),
      el("p", { class: "options-used" }, el("span", { class: "hint", text: `${collection} · ` }), describeOptions(options)),
      card.status, card.retry,
      el("div", { class: "answer-main" },
        el("div", { class: "answer-body" }, card.answer, card.citationsPart, card.blocks.others), card.page),
      card.info,
      el("div", { class: "how" }, card.blocks.route, card.blocks.evidence, card.blocks.waterfall, card.blocks.cost));
    return card;
  }

  function resetCard(card) {
    if (card.controller) card.controller.abort();
    card.failed = false;
    card.final = null;
    card.streaming = false;
    card.evidence = new Map();
    card.retry.hidden = true;
    card.status.classList.remove("error", "done");
    for (const node of [card.answer, card.info, card.citations, card.otherQuotes, card.page, card.route, card.evidenceList,
      card.waterfall, card.cost]) {
      node.replaceChildren();
    }
    card.citationsPart.hidden = true;
    for (const node of Object.values(card.blocks)) node.hidden = true;
  }

  function setStatus(card, text, failed = false) {
    if (card.status.textContent !== text) card.status.textContent = text;
    card.status.classList.toggle("error", failed);
    card.status.classList.toggle("done", text === "done");
  }

  function failCard(card, message) {
    card.failed = true;
    setStatus(card, message, true);
    card.answer.removeAttribute("aria-busy");
    card.retry.hidden = false;
  }

  function retry(card) {
    card.heading.focus(); // the Retry button is about to disappear
    runQuery(card);
  }

  function closeCard(card) {
    if (card.controller) card.controller.abort();
    const next = card.node.nextElementSibling || card.node.previousElementSibling;
    card.node.remove();
    if (next) $(".close", next).focus(); else ui.question.focus();
    ui.noResults.hidden = ui.results.children.length > 0;
  }

  async function runQuery(card) {
    resetCard(card);
    setStatus(card, "routing");
    const controller = new AbortController();
    card.controller = controller;
    askPending += 1;
    ui.askButton.disabled = true; // until the server answers, so that one press asks once
    let response;
    try {
      response = await fetch(`${collectionPath(card.collection)}/query`, {
        method: "POST", signal: controller.signal,
        headers: authHeaders({ "Content-Type": "application/json", Accept: "text/event-stream" }),
        body: JSON.stringify({ question: card.question, options: card.options }),
      });
    } catch (err) {
      if (!controller.signal.aborted) failCard(card, `connection failed: ${err.message}`);
      return;
    } finally {
      askPending -= 1;
      ui.askButton.disabled = askPending > 0;
    }
    if (!response.ok) {
      failCard(card, (await errorFrom(response)).message);
      return;
    }
    card.answer.setAttribute("aria-busy", "true");
    try {
      const finished = await readEvents(response, (event) => onQueryEvent(card, event));
      if (card.failed || controller.signal.aborted) return;
      if (!card.final) {
        failCard(card, finished ? "the answer ended without a final result" : "connection lost before the answer finished");
      }
    } catch (err) {
      if (!controller.signal.aborted) failCard(card, `connection lost: ${err.message}`);
    }
  }

  /** The data of one Server-Sent Events message (its data: lines joined), or null without any. */
  function eventData(message) {
    const lines = message.split(/\r?\n/).filter((line) => line.startsWith("data:"));
    return lines.length ? lines.map((line) => line.slice(5).replace(/^ /, "")).join("\n") : null;
  }

  /** Reads the POST's event stream, calling onEvent per JSON message; true when [DONE] came. */
  async function readEvents(response, onEvent) {
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    const take = (message) => {
      const data = eventData(message);
      if (data === null) return false;
      if (data === "[DONE]") return true;
      let event;
      try { event = JSON.parse(data); } catch (_) { throw new Error("the server sent an unreadable event"); }
      onEvent(event);
      return false;
    };
    for (;;) {
      const { value, done } = await reader.read();
      buffer += done ? decoder.decode() : decoder.decode(value, { stream: true });
      let boundary;
      while ((boundary = /\r?\n\r?\n/.exec(buffer))) { // messages end with a blank line
        const message = buffer.slice(0, boundary.index);
        buffer = buffer.slice(boundary.index + boundary[0].length);
        if (take(message)) { reader.cancel().catch(() => {}); return true; }
      }
      if (done) return take(buffer);
    }
  }

  function onQueryEvent(card, event) {
    if (event.error) {
      failCard(card, errorMessage(event, "the query failed"));
    } else if (event.route) {
      renderRoute(card, event.route);
      setStatus(card, "retrieving");
    } else if (event.evidence) {
      renderEvidence(card, event.evidence.items || []);
      setStatus(card, "answering");
    } else if (event.delta) {
      card.streaming = true;
      card.answer.append(event.delta.text || "");
      setStatus(card, "answering");
    } else if (event.final) {
      card.final = event.final;
      renderFinal(card, event.final);
      card.answer.removeAttribute("aria-busy");
      setStatus(card, "done");
    }
  }

  function renderRoute(card, route) {
    const probabilities = (route.probabilities || []).map((p) => num(p).toFixed(2)).join(" / ");
    const modalities = Object.entries(route.modalities || {}).map(([type, strength]) => `${type} ${num(strength).toFixed(2)}`);
    const rows = [
      ["Label", `${route.label || "—"}${probabilities ? ` (p = ${probabilities})` : ""}`],
      ["Source", route.source || "—"],
      ["Intent", route.intent || "—"],
      ["Complexity score", fmtScore(route.complexity_score)],
      ["Sub-questions", (route.sub_questions || []).length
        ? el("ol", {}, route.sub_questions.map((q) => el("li", { text: q }))) : "none"],
    ];
    if ((route.entities || []).length) rows.push(["Entities", route.entities.join(", ")]);
    if (modalities.length) rows.push(["Modalities", modalities.join(", ")]);
    if (route.instruction) rows.push(["Instruction", route.instruction]);
    card.route.replaceChildren(el("dl", {}, rows.map(([term, value]) =>
      el("div", { class: "pair" }, el("dt", { text: term }), el("dd", {}, value)))));
    setBlockTitle(card.blocks.route, `Route: ${route.label || "—"}${route.source ? `, by ${route.source}` : ""}`);
    card.blocks.route.hidden = false;
  }

  const evidenceId = (card, rank) => `${card.id}-ev-${rank}`;

  function renderEvidence(card, items) {
    card.evidence = new Map(items.map((item) => [num(item.rank), item]));
    card.evidenceList.replaceChildren(...items.map((item) => evidenceItem(card, item)));
    card.blocks.evidence.hidden = false;
    setBlockTitle(card.blocks.evidence, `Evidence (${items.length})`);
  }

  function setBlockTitle(block, text) {
    block.querySelector("h4").textContent = text;
  }

  function evidenceItem(card, item) {
    const signals = item.signals || {};
    const text = item.text || "";
    const chips = SIGNALS.filter((name) => num(signals[name]) !== 0)
      .map((name) => el("span", { class: "signal", text: `${name} ${fmtScore(signals[name])}` }));
    const foundBy = signals.found_by || [];
    return el("li", { class: "evidence-item", id: evidenceId(card, item.rank), tabindex: -1, value: num(item.rank) || null },
      el("p", { class: "ev-head" },
        el("span", { class: "ev-rank", text: `[${item.rank}]` }), " ",
        el("strong", { text: item.document_name || item.document_id || "?" }),
        num(item.page) >= 0 ? ` · p. ${num(item.page) + 1}` : "",
        item.block_type ? ` · ${item.block_type}` : "",
        el("span", { class: "hint", text: ` · score ${fmtScore(item.score)}` })),
      item.section ? el("p", { class: "ev-section hint", text: item.section }) : null,
      el("p", { class: "ev-text", text: shorten(text, SHORT_TEXT) }),
      imageSlot(card, item),
      text.length > SHORT_TEXT ? el("details", {}, el("summary", { text: "full text" }), el("p", { text })) : null,
      el("p", { class: "signals" }, chips,
        foundBy.length ? el("span", { class: "found-by", text: `found by ${foundBy.join(", ")}` }) : null));
  }

  function imageSlot(card, item) {
    if (!item.asset || (item.kind !== "unit" && item.kind !== "page")) return null;
    const slot = el("div", { class: "evidence-image-slot" });
    showEvidenceImage(slot, card.collection, item);
    return slot;
  }

  /** The answer with its "[n]" (or "[n, m]") markers as links to the card's evidence items. */
  function renderAnswerText(card, text) {
    const parts = [];
    const markers = /\[(\d+(?:\s*,\s*\d+)*)\]/g;
    let last = 0;
    for (let match; (match = markers.exec(text));) {
      const ranks = match[1].split(",").map((rank) => Number(rank.trim()));
      if (!ranks.every((rank) => card.evidence.has(rank))) continue; // not a marker we can resolve: plain text
      parts.push(text.slice(last, match.index));
      if (ranks.length === 1) parts.push(markerLink(card, ranks[0], `[${ranks[0]}]`));
      else {
        parts.push("[");
        ranks.forEach((rank, i) => parts.push(i ? ", " : "", markerLink(card, rank, String(rank))));
        parts.push("]");
      }
      last = match.index + match[0].length;
    }
    parts.push(text.slice(last));
    card.answer.replaceChildren(...parts.filter((part) => part !== ""));
    if (!text) card.answer.textContent = "(no answer text)";
  }

  function markerLink(card, rank, label, className = "citation-marker") {
    const item = card.evidence.get(rank);
    const where = item && num(item.page) >= 0 ? `, p. ${num(item.page) + 1}` : "";
    return el("a", { class: className, href: `#${evidenceId(card, rank)}`, "data-rank": rank,
      title: item ? `Evidence ${rank}: ${item.document_name}${where}` : `Evidence ${rank}` }, label);
  }

  function followMarker(card, event) {
    const link = event.target.closest("a[data-rank]");
    if (!link) return;
    event.preventDefault(); // scroll within the card row rather than jump the page by its hash
    const target = document.getElementById(evidenceId(card, link.dataset.rank));
    if (!target) return;
    card.blocks.evidence.open = true;
    target.scrollIntoView({ block: "nearest", inline: "nearest", behavior: "smooth" });
    target.focus({ preventScroll: true });
    target.classList.add("flash");
    setTimeout(() => target.classList.remove("flash"), 1600);
  }

  function renderFinal(card, final) {
    renderAnswerText(card, final.text || "");
    const usage = final.usage || {};
    const facts = [`answer: ${final.answer_source || "?"}`, `finish: ${final.finish_reason || "?"}`,
      `retrieval: ${final.retrieval_mode || "full"}`,
      `${fmtInt(usage.model_calls)} model calls`,
      `${fmtInt(usage.prompt_tokens)} prompt + ${fmtInt(usage.completion_tokens)} completion tokens`];
    card.info.replaceChildren(el("p", { class: "hint", text: facts.join(" · ") }));
    if (final.degraded) {
      card.info.append(el("p", { class: "degraded", text: `Degraded: ${final.degraded_reason || "a stage was skipped"}` }));
    }
    if (final.uncertainty) card.info.append(uncertaintyNote(final.uncertainty));
    renderCitations(card, final.citations || []);
    const total = (final.timings || []).find((t) => t.stage === "total");
    if (renderWaterfall(card.waterfall, final.timings || [])) {
      setBlockTitle(card.blocks.waterfall, `Where the time went${total ? `: ${fmtMs(total.milliseconds)}` : ""}`);
      card.blocks.waterfall.hidden = false;
    }
    renderCost(card.cost, final.cost || {});
    setBlockTitle(card.blocks.cost, `Model calls and cost: ${fmtInt(usage.model_calls)} calls, ` +
      `${fmtMs((final.cost || {}).model_ms)} of model time`);
    card.blocks.cost.hidden = false;
  }

  function uncertaintyNote(u) {
    const entropies = (u.entropies || []).map((e) => num(e).toFixed(2)).join(", ");
    return el("p", { class: "hint", text: `Uncertainty loop: ${fmtInt(u.iterations)} rounds, ${fmtInt(u.evidence_used)} ` +
      `evidence kept, entropies [${entropies}] vs threshold ${num(u.threshold).toFixed(2)} nats` +
      `${u.uncertain ? " (still uncertain)" : ""}` });
  }

  /**
   * Which citations the card shows as supporting the answer: those of the best-ranked evidence item the answer
   * quotes. The extractive answerer quotes the sentences closest to the question wherever they are, and a
   * lower-ranked passage's often only shares the question's words (issue 55: a question about an average income
   * cited two unrelated passages as if they answered it). Those stay in the answer's text, with their markers, and
   * are listed apart, folded away, not as citations.
   */
  function supportingCitations(citations) {
    const best = Math.min(...citations.map((citation) => num(citation.evidence_rank)));
    return citations.filter((citation) => num(citation.evidence_rank) === best);
  }

  function renderCitations(card, citations) {
    card.citationsPart.hidden = false;
    if (!citations.length) {
      card.citationsTitle.textContent = "Citations";
      card.citations.replaceChildren(el("li", { class: "hint", text: "No citations." }));
      return;
    }
    const supporting = supportingCitations(citations);
    const others = citations.filter((citation) => !supporting.includes(citation));
    card.citationsTitle.textContent = `Citations (${supporting.length})`;
    card.citations.replaceChildren(...supporting.map((citation, i) => citationItem(card, citation, i > 0)));
    const [first] = supporting;
    const page = num(first.page);
    if (page >= 0) { // the cited page, large, with every supporting quote on it marked
      const regions = supporting.filter((c) => num(c.page) === page).flatMap((c) => c.regions || []);
      showPage(card.page, card.collection, first, page, `Page ${page + 1} of ${first.document_name || ""}`, regions);
    }
    if (others.length) {
      card.otherQuotes.replaceChildren(...others.map((citation) => citationItem(card, citation, false)));
      setBlockTitle(card.blocks.others, `Also quoted, from lower-ranked evidence (${others.length})`);
      card.blocks.others.hidden = false;
    }
  }

  /** A citation: its evidence, document, page and quote; `withPage`: its page image as a thumbnail beside it. */
  function citationItem(card, citation, withPage) {
    const page = num(citation.page);
    const rank = num(citation.evidence_rank);
    const name = citation.document_name || "";
    const slot = withPage && page >= 0 ? el("div", { class: "page-slot" }) : null;
    const item = el("li", { class: "citation" },
      el("p", { class: "cite-head" },
        card.evidence.has(rank) ? markerLink(card, rank, `[${rank}]`, "citation-ref") : `[${rank}]`, " ",
        el("strong", { text: name }), page >= 0 ? ` · page ${page + 1}` : "", ocrBadge(citation.regions || [])),
      citation.quote ? el("blockquote", { class: "quote", text: citation.quote }) : null,
      slot);
    item.querySelector(".cite-head").addEventListener("click", (event) => followMarker(card, event));
    if (slot) showPage(slot, card.collection, citation, page, `Page ${page + 1} of ${name}`);
    return item;
  }

  // ------------------------------------------------------------------ page images

  const pageCache = new Map(); // image path -> Promise of an object URL (null: no image)

  /** An image the API serves under the token (fetched with its header: never a token in a URL), cached. */
  function authorizedImage(path) {
    if (!pageCache.has(path)) {
      const loading = fetch(path, { headers: authHeaders() }).then(async (response) => {
        if (response.status === 404) return null;
        if (!response.ok) throw await errorFrom(response);
        return URL.createObjectURL(await response.blob());
      });
      loading.catch(() => pageCache.delete(path)); // a failure may pass: fetch again next time
      pageCache.set(path, loading);
    }
    return pageCache.get(path);
  }

  const pageImage = (collection, documentId, page) =>
    authorizedImage(`${collectionPath(collection)}/pages/${encodeURIComponent(documentId)}/${page}`);
  const unitImage = (collection, passageId) =>
    authorizedImage(`${collectionPath(collection)}/evidence/${encodeURIComponent(passageId)}/image`);

  /** A unit's figure, table or equation image, or a page hit's page, beside its evidence item. */
  async function showEvidenceImage(slot, collection, item) {
    const page = num(item.page);
    const where = `${item.block_type || "image"} from ${item.document_name || "the document"}${page >= 0 ? `, page ${page + 1}` : ""}`;
    try {
      const url = item.kind === "page" ? await pageImage(collection, item.document_id, page)
        : await unitImage(collection, item.passage_id);
      if (url) slot.replaceChildren(el("img", { class: "evidence-image", src: url, alt: where }));
      else slot.replaceChildren(el("p", { class: "hint", text: `no image is stored for this ${item.block_type || "item"}` }));
    } catch (err) {
      slot.replaceChildren(el("p", { class: "error", text: `image: ${err.message || "network error"}` }));
    }
  }

  function forgetPageImages() {
    for (const loading of pageCache.values()) loading.then((url) => url && URL.revokeObjectURL(url), () => {});
    pageCache.clear();
  }

  async function showPage(slot, collection, citation, page, label, regions = citation.regions || []) {
    slot.replaceChildren(el("p", { class: "hint", text: "loading page image…" }));
    const documentId = (citation.passage_id || "").split(":")[0];
    try {
      const url = await pageImage(collection, documentId, page);
      if (!url) { slot.replaceChildren(el("p", { class: "no-page hint", text: "no page image" })); return; }
      slot.replaceChildren(pageFigure(url, regions, page, label));
    } catch (err) {
      slot.replaceChildren(el("p", { class: "error", text: `page image: ${err.message || "network error"}` }));
    }
  }

  /** " · OCR 0.93" when text of the regions was read from the page's image (its least certain line), else nothing. */
  function ocrBadge(regions) {
    const read = regions.filter((region) => region.ocr_confidence !== undefined).map((region) => num(region.ocr_confidence));
    if (!read.length) return null;
    const lowest = Math.min(...read);
    return el("span", { class: "ocr-badge", title: "read from the page image by OCR; the recogniser's confidence in its least certain line",
      text: ` · OCR ${lowest.toFixed(2)}` });
  }

  /** Highlight boxes for the regions on `page`: bbox is on a 0-1000 scale of the page, so /10 gives percent. OCR
   * regions are outlined apart (their text was read from the image, not the document's own). */
  function regionBoxes(regions, page) {
    return regions.filter((region) => num(region.page) === page && (region.bbox || []).length >= 4).map((region) => {
      const [x0, y0, x1, y1] = region.bbox.map(num);
      const box = el("div", { class: region.ocr_confidence !== undefined ? "bbox ocr" : "bbox", "aria-hidden": "true" });
      box.style.left = `${x0 / 10}%`; // CSSOM styles: the console's CSP forbids style attributes, not these
      box.style.top = `${y0 / 10}%`;
      box.style.width = `${Math.max(0, x1 - x0) / 10}%`;
      box.style.height = `${Math.max(0, y1 - y0) / 10}%`;
      return box;
    });
  }

  function pageFigure(url, regions, page, label) {
    const figure = el("figure", { class: "citation-page", tabindex: 0, role: "button",
      "aria-label": `${label}: open larger` },
      el("img", { class: "page-image", src: url, alt: label }), regionBoxes(regions, page));
    const open = () => openViewer(url, regions, page, label, figure);
    figure.addEventListener("click", open);
    figure.addEventListener("keydown", (event) => {
      if (event.key === "Enter" || event.key === " ") { event.preventDefault(); open(); }
    });
    return figure;
  }

  function openViewer(url, regions, page, label, opener) {
    state.viewerOpener = opener;
    ui.viewerTitle.textContent = label;
    ui.viewerFrame.replaceChildren(el("img", { class: "page-image", src: url, alt: label }), ...regionBoxes(regions, page));
    ui.viewer.showModal(); // a modal <dialog> closes on Escape by itself
    ui.viewerClose.focus();
  }

  function setUpViewer() {
    ui.viewerClose.addEventListener("click", () => ui.viewer.close());
    ui.viewer.addEventListener("click", (event) => { if (event.target === ui.viewer) ui.viewer.close(); }); // backdrop
    ui.viewer.addEventListener("close", () => {
      if (state.viewerOpener && state.viewerOpener.isConnected) state.viewerOpener.focus();
      state.viewerOpener = null;
    });
  }

  // ------------------------------------------------------------------ time and cost

  const hasStart = (timing) => timing.start_ms !== undefined && timing.start_ms !== null;

  /**
   * Bars on one time axis (0 to the "total" timing). Stages with start_ms sit at their offset; those without
   * were timed inside retrieval (dense, sparse, graph, fusion) and follow one another from retrieval's start.
   */
  function renderWaterfall(container, timings) {
    if (!timings.length) return false;
    const total = timings.find((t) => t.stage === "total");
    const placed = timings.filter((t) => t !== total && hasStart(t))
      .map((t) => ({ timing: t, start: num(t.start_ms), part: false }))
      .sort((a, b) => a.start - b.start);
    const retrieval = placed.find((row) => row.timing.stage === "retrieval");
    let cursor = retrieval ? retrieval.start : 0;
    const parts = timings.filter((t) => t !== total && !hasStart(t)).map((t) => {
      const row = { timing: t, start: cursor, part: Boolean(retrieval) };
      cursor += num(t.milliseconds);
      return row;
    });
    const span = total ? num(total.milliseconds)
      : Math.max(cursor, ...placed.map((row) => row.start + num(row.timing.milliseconds)));
    const rows = total ? [{ timing: total, start: 0, part: false }] : [];
    for (const row of placed) {
      rows.push(row);
      if (row === retrieval) rows.push(...parts);
    }
    if (!retrieval) rows.push(...parts);
    container.replaceChildren(timeAxis(span), ...rows.map((row) => stageRow(row, span || 1)));
    return true;
  }

  function timeAxis(span) {
    return el("div", { class: "axis", "aria-hidden": "true" }, el("span", { class: "stage-label" }),
      el("div", { class: "axis-ticks" }, [0, 0.25, 0.5, 0.75, 1].map((f) =>
        el("span", { text: f ? fmtMs(span * f).replace(" ms", "") : "0 ms" }))));
  }

  function stageRow({ timing, start, part }, span) {
    const ms = num(timing.milliseconds);
    const isTotal = timing.stage === "total";
    const left = isTotal ? 0 : Math.min(100, (start / span) * 100);
    const width = isTotal ? 100 : Math.min(100 - left, (ms / span) * 100);
    const label = `${timing.stage} ${fmtMs(ms)}`;
    const bar = el("div", { class: "stage-bar", "data-stage": timing.stage,
      title: `${label}${isTotal ? "" : ` from ${fmtMs(start)}`}${part ? " (part of retrieval)" : ""}` });
    bar.style.left = `${left}%`;
    bar.style.width = `${width}%`;
    return el("div", { class: `stage-row${part ? " part" : ""}${isTotal ? " total" : ""}` },
      el("span", { class: "stage-label", text: part ? `↳ ${label}` : label }),
      el("div", { class: "stage-track" }, bar));
  }

  function renderCost(table, cost) {
    const models = cost.models || [];
    const head = ["Model", "Stage", "Calls", "Items", "Tokens in", "Tokens out", "Model ms"];
    const byStage = Object.entries(cost.orchestrator_ms_by_stage || {}).sort((a, b) => num(b[1]) - num(a[1]));
    const totalRow = (title, ms) => el("tr", { class: "sum" },
      el("th", { scope: "row", colspan: 6, text: title }), el("td", { class: "num", text: fmtMs(ms) }));
    table.replaceChildren(
      el("caption", { text: "Model calls by stage, then where the orchestrator spent its own time" }),
      el("thead", {}, el("tr", {}, head.map((title) => el("th", { scope: "col", text: title })))),
      el("tbody", {}, models.length ? models.map((m) => el("tr", {},
        el("th", { scope: "row", text: m.model }), el("td", { text: m.stage }),
        ...["calls", "items", "tokens_in", "tokens_out"].map((f) => el("td", { class: "num", text: fmtInt(m[f]) })),
        el("td", { class: "num", text: fmtMs(m.model_ms) })))
        : el("tr", {}, el("td", { colspan: 7, class: "hint", text: "No model calls." }))),
      el("tbody", { class: "totals" }, totalRow("Model time (any call in flight)", cost.model_ms),
        totalRow("Orchestrator time (the rest)", cost.orchestrator_ms),
        byStage.map(([stage, ms]) => totalRow(`orchestrator: ${stage}`, ms))));
  }

  // ------------------------------------------------------------------ start

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
})();
