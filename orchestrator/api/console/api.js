// The JSON API (/api/v1) and the bearer token it is called with.

import { refreshAll } from "./library.js";
import { TOKEN_KEY, setError, ui } from "./page.js";
import { forgetPageImages } from "./pages.js";

class ApiError extends Error {
  constructor(message, status, code) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

export const token = () => sessionStorage.getItem(TOKEN_KEY) || "";

export function authHeaders(extra = {}) {
  const value = token();
  return value ? { ...extra, Authorization: `Bearer ${value}` } : { ...extra };
}

export function errorMessage(body, fallback) {
  return (body && body.error && body.error.message) || fallback;
}

/** The ApiError of a non-2xx response (its JSON error.message); a 401 brings the token form back. */
export async function errorFrom(response) {
  let body = null;
  try { body = await response.json(); } catch (_) { /* not JSON: the status line will do */ }
  const message = errorMessage(body, `${response.status} ${response.statusText}`.trim());
  if (response.status === 401) showTokenForm(message);
  return new ApiError(message, response.status, (body && body.error && body.error.code) || "");
}

export async function api(method, path, body) {
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

export function showTokenForm(message) {
  const wasHidden = ui.auth.hidden;
  ui.auth.hidden = false;
  setError(ui.tokenError, message);
  if (wasHidden) ui.tokenInput.focus();
}

export function saveToken(event) {
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

export function signOut() {
  sessionStorage.removeItem(TOKEN_KEY);
  forgetPageImages(); // they were fetched with the old token's rights
  updateSignOut();
  showTokenForm("");
}

export function updateSignOut() {
  ui.signOut.hidden = !token();
}
