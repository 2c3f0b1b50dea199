// Asking: the question's options, the streamed answer, its evidence and citations.

import { authHeaders, errorFrom, errorMessage } from "./api.js";
import { renderCost, renderWaterfall } from "./costs.js";
import { $, SHORT_TEXT, SIGNALS, collectionPath, el, fmtInt, fmtMs, fmtScore, num, setError, shorten, state, ui } from "./page.js";
import { ocrBadge, showEvidenceImage, showPage } from "./pages.js";

let askPending = 0;
let cardCount = 0;

/** The options set in the panel: numbers, booleans ("on"/"off") and enums; empty ones are left out. */
/** Every on/off option offers the same three choices: the server's default, on, off. */
export function booleanChoices() {
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

export function onAsk(event) {
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
