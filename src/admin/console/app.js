// The console's shell: the token form, the hash router (#/overview, #/dlq?tenant=acme,
// ...) and the live refresh of the page shown.

import { el, fill } from "./dom.js";
import { showError, token, setToken } from "./api.js";
import * as pages from "./pages.js";

const REFRESH_MS = 3000;

const ROUTES = {
  overview: pages.overview,
  dlq: pages.dlq,
  quarantine: pages.quarantine,
  lanes: pages.lanes,
  replay: pages.replay,
};

// The current route: page name and its query parameters.
function route() {
  const hash = location.hash.replace(/^#\/?/, "");
  const [name, query] = hash.split("?");
  return { name: ROUTES[name] ? name : "overview", params: new URLSearchParams(query || "") };
}

let current = null;
let timer = null;

async function render() {
  if (timer) clearInterval(timer);
  timer = null;
  const { name, params } = route();
  for (const link of document.querySelectorAll("#nav a")) {
    link.classList.toggle("active", link.dataset.page === name);
  }
  document.body.dataset.page = name;
  // A fresh container per render: a slow render of a page left behind fills a detached
  // node instead of the page shown now.
  const root = el("div", { class: `page page-${name}` });
  fill(document.getElementById("page"), root);
  document.getElementById("notice").classList.add("hidden");
  const page = { refresh: null };
  current = page;
  try {
    Object.assign(page, (await ROUTES[name](root, params)) || {});
    showError(null);
  } catch (error) {
    showError(error);
  }
  if (current !== page || !page.refresh) return;
  timer = setInterval(async () => {
    try {
      await page.refresh();
      showError(null);
    } catch (error) {
      showError(error);
    }
  }, REFRESH_MS);
}

function start() {
  const form = document.getElementById("token-form");
  const input = document.getElementById("token");
  input.value = token();
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    setToken(input.value.trim());
    render();
  });
  document.getElementById("token-forget").addEventListener("click", () => {
    setToken("");
    input.value = "";
    render();
  });
  window.addEventListener("hashchange", render);
  render();
}

start();
