// Page images: fetched with the token, shown in the viewer.

import { authHeaders, errorFrom, token } from "./api.js";
import { collectionPath, el, num, state, ui } from "./page.js";

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
export async function showEvidenceImage(slot, collection, item) {
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

export function forgetPageImages() {
  for (const loading of pageCache.values()) loading.then((url) => url && URL.revokeObjectURL(url), () => {});
  pageCache.clear();
}

export async function showPage(slot, collection, citation, page, label, regions = citation.regions || []) {
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
export function ocrBadge(regions) {
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

export function setUpViewer() {
  ui.viewerClose.addEventListener("click", () => ui.viewer.close());
  ui.viewer.addEventListener("click", (event) => { if (event.target === ui.viewer) ui.viewer.close(); }); // backdrop
  ui.viewer.addEventListener("close", () => {
    if (state.viewerOpener && state.viewerOpener.isConnected) state.viewerOpener.focus();
    state.viewerOpener = null;
  });
}
