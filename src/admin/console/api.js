// The admin API as the pages use it: the token, the one fetch helper, the banners that
// show a refused token or a failed request, and navigation between pages.
//
// Every figure and every action of the console is a request to the admin API under /v1/
// (the same API the `ankusa` verbs use), sent with `Authorization: Bearer <token>` when a
// token is set. The token lives in sessionStorage: it survives a reload of the tab, not
// the tab itself.

import { fill } from "./dom.js";

const TOKEN_KEY = "ankusa.admin_token";

export function setToken(value) {
  if (value) sessionStorage.setItem(TOKEN_KEY, value);
  else sessionStorage.removeItem(TOKEN_KEY);
}

// An answer of the admin API that is not a 2xx: its status, code and message.
export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

export function token() {
  return sessionStorage.getItem(TOKEN_KEY) || "";
}

// Fetches `path` from the admin listener and returns its JSON (or text, for /metrics).
// A 401 flips the console into its "token refused" state before the error is thrown.
export async function api(path, options = {}) {
  const headers = {};
  if (token()) headers.authorization = `Bearer ${token()}`;
  let body;
  if (options.body !== undefined) {
    headers["content-type"] = "application/json";
    body = JSON.stringify(options.body);
  }
  const response = await fetch(path, { method: options.method || "GET", headers, body, cache: "no-store" });
  if (response.status === 401) {
    showAuth("refused");
    throw new ApiError(401, "unauthorized", "the admin token was refused");
  }
  if (path.startsWith("/v1")) showAuth("ok");
  const text = await response.text();
  if (!response.ok) {
    let code = "error";
    let message = text;
    try {
      const answer = JSON.parse(text);
      code = answer.error || code;
      message = answer.message || message;
    } catch (_) {
      // Not JSON: the text itself is the message.
    }
    throw new ApiError(response.status, code, message);
  }
  return options.text ? text : JSON.parse(text);
}

// "refused": the API answered 401 (no token, or a wrong one); "ok": it answered.
function showAuth(state) {
  document.body.dataset.auth = state;
  const banner = document.getElementById("auth-banner");
  if (state === "refused") {
    const message = token()
      ? "Token refused: the admin API answered 401 to the token given. Enter the instance's admin_token."
      : "Token required: the admin API answered 401. Enter the instance's admin_token.";
    fill(banner, message);
    banner.classList.remove("hidden");
    document.getElementById("token").focus();
  } else {
    banner.classList.add("hidden");
  }
}

// A failure of the page's last request, shown until the next one succeeds.
export function showError(error) {
  const banner = document.getElementById("error-banner");
  if (!error || error.status === 401) {
    banner.classList.add("hidden");
    return;
  }
  fill(banner, error.status ? `${error.status} ${error.code}: ${error.message}` : String(error.message || error));
  banner.classList.remove("hidden");
}

// A short notice of what an action did ("revived 1 row").
export function notify(text) {
  const status = document.getElementById("notice");
  fill(status, text);
  status.classList.remove("hidden");
}

// Moves to `name` with `params` (filters live in the hash, so a view can be linked).
export function go(name, params) {
  const query = new URLSearchParams(params || {}).toString();
  location.hash = `#/${name}${query ? `?${query}` : ""}`;
}

