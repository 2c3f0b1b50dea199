// The page's elements, settings and small helpers every part uses.

export const TOKEN_KEY = "thinkserve-token";
export const COLLECTION_KEY = "thinkserve-collection";
export const NAME_PATTERN = /^[a-z0-9][a-z0-9_-]{0,63}$/;
export const PARALLEL_UPLOADS = 2;
export const INGEST_POLL_MS = 500; // how often the server's ingest progress is read while a document ingests
export const SHORT_TEXT = 320; // characters of an evidence item shown before "full text"
export const SIGNALS = ["final", "fused", "semantic", "lexical", "structural", "modality", "page_lexical",
  "rerank", "page_similarity", "page_relevance"];

export const $ = (selector, root = document) => root.querySelector(selector);
export const ui = {
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
export const state = { collections: [], current: "", replaceName: "", viewerOpener: null };

// ------------------------------------------------------------------ small helpers

/** An element with attributes ("class", "text", on<event> handlers) and children (nodes or text). */
export function el(tag, attrs = {}, ...children) {
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

export const num = (value) => Number(value) || 0; // int64 fields come as strings
export const fmtInt = (value) => num(value).toLocaleString("en");
export const fmtMs = (ms) => `${num(ms).toLocaleString("en", { maximumFractionDigits: 1 })} ms`;
export const fmtScore = (value) => num(value).toFixed(3);

export function fmtBytes(value) {
  let size = num(value);
  const units = ["B", "KB", "MB", "GB", "TB"];
  let unit = 0;
  while (size >= 1024 && unit < units.length - 1) { size /= 1024; unit += 1; }
  return `${size.toFixed(unit ? 1 : 0)} ${units[unit]}`;
}

export function fmtDate(seconds) {
  if (num(seconds) <= 0) return "—";
  const date = new Date(num(seconds) * 1000);
  const pad = (n) => String(n).padStart(2, "0");
  return `${date.getFullYear()}-${pad(date.getMonth() + 1)}-${pad(date.getDate())} ${pad(date.getHours())}:${pad(date.getMinutes())}`;
}

export function shorten(text, limit) {
  return text.length > limit ? `${text.slice(0, limit).trimEnd()}…` : text;
}

export function setError(node, message) {
  node.textContent = message || "";
}

export const collectionPath = (name) => `/api/v1/collections/${encodeURIComponent(name)}`;
