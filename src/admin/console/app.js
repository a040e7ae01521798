// The console's shell: the token form, the hash router (#/overview, #/dlq?tenant=acme,
// ...) and the live refresh of the page shown.

import { el, fill } from "./dom.js";
import { api, ApiError, showError, token, setToken } from "./api.js";
import * as pages from "./pages.js";

const REFRESH_MS = 3000;
const MIGRATION_POLL_MS = 1000;

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
    if (error.code === "migrating" && current === page) {
      // The store migrates at startup: show its progress, and the page once it is open.
      await showMigration();
      if (current !== page) return;
      timer = setInterval(async () => {
        if (!(await showMigration())) render();
      }, MIGRATION_POLL_MS);
      return;
    }
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

// While the store migrates, the admin address answers only /v1/jobs: the migration's
// progress line goes in the error banner. False once no migration runs (the node is up).
async function showMigration() {
  let jobs;
  try {
    jobs = await api("/v1/jobs");
  } catch (error) {
    // No answer at all: the progress listener has closed and the node's own listener is
    // not up yet. Still starting; rendering now would fail and stay failed.
    return error.code === "migrating" || !(error instanceof ApiError);
  }
  const job = (jobs || []).find((job) => job.kind === "store_migration" && !["done", "failed"].includes(job.state));
  if (!job) return false;
  const banner = document.getElementById("error-banner");
  const total = job.total === null ? "…" : job.total.toLocaleString("en");
  const rate = job.rate_per_s ? `, ${Math.round(job.rate_per_s).toLocaleString("en")}/s` : "";
  const left = job.eta_s === null ? "" : `, about ${Math.ceil(job.eta_s)} s left`;
  fill(banner, `The store is migrating to this version's format: ${job.done.toLocaleString("en")} of ${total} records${rate}${left}. The console loads when the store is open.`);
  banner.dataset.migration = job.state;
  banner.classList.remove("hidden");
  return true;
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
