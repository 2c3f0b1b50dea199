// Time and cost of an answer: stages, model calls and what they cost.

import { el, fmtInt, fmtMs, num } from "./page.js";

const hasStart = (timing) => timing.start_ms !== undefined && timing.start_ms !== null;

/**
 * Bars on one time axis (0 to the "total" timing). Stages with start_ms sit at their offset; those without
 * were timed inside retrieval (dense, sparse, graph, fusion) and follow one another from retrieval's start.
 */
export function renderWaterfall(container, timings) {
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

export function renderCost(table, cost) {
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
