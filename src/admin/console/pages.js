// One function per page. Each renders into `root` from the admin API and returns
// `{refresh}` when the page follows the live state (the shell calls it every few seconds).
// Actions call the same /v1/ routes as the `ankusa` verbs.

import { el, fill, table, card, time, count, bytes, seconds } from "./dom.js";
import { api, go, notify } from "./api.js";

// How often a page follows a job it started.
const JOB_POLL_MS = 500;

// ---------------------------------------------------------------------------------------
// Shared pieces.

async function tenantIds() {
  const answer = await api("/v1/tenants");
  return answer.tenants.map((tenant) => tenant.id);
}

function tenantSelect(ids, chosen) {
  return el("select", { name: "tenant", id: "filter-tenant" },
    ids.map((id) => el("option", { value: id, selected: id === chosen }, id)));
}

function field(label, control) {
  return el("label", { class: "field" }, el("span", null, label), control);
}

// A button that asks for a second click before it runs a destructive `action`: no modal
// dialog, and the wording says exactly what the second click does.
function confirmButton(label, confirmLabel, action, attributes) {
  const button = el("button", Object.assign({ type: "button", class: "danger" }, attributes || {}), label);
  let armed = null;
  button.addEventListener("click", async () => {
    if (!armed) {
      fill(button, typeof confirmLabel === "function" ? confirmLabel() : confirmLabel);
      button.classList.add("armed");
      armed = setTimeout(() => {
        armed = null;
        button.classList.remove("armed");
        fill(button, label);
      }, 5000);
      return;
    }
    clearTimeout(armed);
    armed = null;
    button.classList.remove("armed");
    fill(button, label);
    await action();
  });
  return button;
}

// Runs a page action: its failure shows in the page, not as an unhandled rejection.
async function run(action) {
  try {
    await action();
  } catch (error) {
    notify(error.status ? `Failed: ${error.status} ${error.code}: ${error.message}` : `Failed: ${error.message}`);
  }
}

// Refills `node` only when `data` differs from what it shows: a live refresh that found
// nothing new leaves the rows (and a click in progress on them) alone.
function fillIfChanged(node, data, build) {
  const text = JSON.stringify(data);
  if (node.dataset.shown === text) return;
  node.dataset.shown = text;
  fill(node, build());
}

function headersTable(headers) {
  return table(["Header", "Value"], headers, ([name, value]) =>
    el("tr", null, el("td", { class: "mono" }, name), el("td", { class: "mono wrap" }, value)),
    "No stored headers.");
}

// ---------------------------------------------------------------------------------------
// Overview: /v1/stats (the store's counters, node-wide and per tenant, and the breakers
// that are not closed) and /metrics (ingest statuses, ack latency histogram, breaker
// openings), rates from the change between two refreshes.

// How long ago `ms` was, short: "12 s", "4 min", "2 h".
function age(ms) {
  const s = Math.max(0, Math.round((Date.now() - ms) / 1000));
  if (s < 120) return `${s} s`;
  if (s < 7200) return `${Math.round(s / 60)} min`;
  return `${Math.round(s / 3600)} h`;
}

function clock(ms) {
  return new Date(ms).toLocaleTimeString("en-GB");
}

// One breaker's state in words: "open since 14:02:11 (12 s), probe at 14:02:41" or
// "half-open since 14:02:11 (31 s), probing".
function breakerState(b) {
  const since = `since ${clock(b.since_ms)} (${age(b.since_ms)})`;
  return b.state === "half_open"
    ? `half-open ${since}, probing`
    : `open ${since}, probe ${b.next_probe_ms > Date.now() ? `at ${clock(b.next_probe_ms)}` : "due"}`;
}

// A tenant's breakers in its row: the count, then "source → sink" and the state of each.
function tenantBreakers(t) {
  const list = t.breakers || [];
  if (list.length === 0) return el("td", { class: "breakers", "data-breakers": 0 }, "0");
  return el("td", { class: "breakers", "data-breakers": list.length },
    el("strong", null, count(list.length)),
    el("ul", { class: "breaker-list" }, list.map((b) =>
      el("li", { class: "breaker", "data-source": b.source, "data-sink": b.sink, "data-state": b.state },
        el("span", { class: "mono" }, `${b.source} → ${b.sink}`), " ", breakerState(b)))));
}

// Prometheus text → [{name, labels, value}].
function parseMetrics(text) {
  const samples = [];
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const match = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)/.exec(line);
    if (!match) continue;
    const labels = {};
    for (const label of (match[3] || "").matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) {
      labels[label[1]] = label[2];
    }
    samples.push({ name: match[1], labels, value: Number(match[4]) });
  }
  return samples;
}

function sampleSum(samples, name, labels) {
  return samples
    .filter((s) => s.name === name && Object.entries(labels || {}).every(([k, v]) => s.labels[k] === v))
    .reduce((sum, s) => sum + s.value, 0);
}

// Cumulative buckets of a histogram (summed over label sets), sorted by bound.
function buckets(samples, name) {
  const byBound = new Map();
  for (const s of samples.filter((s) => s.name === `${name}_bucket`)) {
    const bound = s.labels.le === "+Inf" ? Infinity : Number(s.labels.le);
    byBound.set(bound, (byBound.get(bound) || 0) + s.value);
  }
  return [...byBound.entries()].sort((a, b) => a[0] - b[0]);
}

// The q-quantile of cumulative buckets, interpolated inside its bucket as Prometheus's
// histogram_quantile does; null without observations.
function quantile(q, cumulative) {
  const total = cumulative.length ? cumulative[cumulative.length - 1][1] : 0;
  if (total <= 0) return null;
  const rank = q * total;
  let lowerBound = 0;
  let lowerCount = 0;
  for (const [bound, countAt] of cumulative) {
    if (countAt >= rank) {
      if (bound === Infinity) return lowerBound;
      const width = countAt - lowerCount;
      return width > 0 ? lowerBound + (bound - lowerBound) * ((rank - lowerCount) / width) : bound;
    }
    lowerBound = bound;
    lowerCount = countAt;
  }
  return lowerBound;
}

function minus(now, before) {
  if (!before) return now;
  const earlier = new Map(before);
  return now.map(([bound, countAt]) => [bound, countAt - (earlier.get(bound) || 0)]);
}

export async function overview(root) {
  const cards = el("div", { class: "cards", id: "overview-cards" });
  const tenants = el("div", { id: "overview-tenants" });
  const breakers = el("div", { id: "overview-breakers" });
  const note = el("p", { class: "hint" });
  root.append(el("h2", null, "Overview"), note, cards, el("h3", null, "Tenants"), tenants,
    el("h3", null, "Open breakers"), breakers);
  let previous = null;

  async function refresh() {
    const [stats, metricsText] = await Promise.all([api("/v1/stats"), api("/metrics", { text: true })]);
    const at = performance.now();
    const samples = parseMetrics(metricsText);
    const ack = buckets(samples, "ankusa_ingest_ack_seconds");
    const statuses = ["2xx", "4xx", "5xx"].map((status) => [status, sampleSum(samples, "ankusa_ingest_requests_total", { status })]);
    const elapsed = previous ? (at - previous.at) / 1000 : 0;
    const rate = (now, before) => (previous && elapsed > 0 ? Math.max(0, (now - before) / elapsed) : null);
    const perSecond = (value) => (value === null ? "—" : `${value.toFixed(1)}/s`);

    // Quantiles of the last refresh interval when it saw acks, else since the start.
    const windowAck = previous ? minus(ack, previous.ack) : null;
    const windowTotal = windowAck && windowAck.length ? windowAck[windowAck.length - 1][1] : 0;
    const ackShown = windowTotal > 0 ? windowAck : ack;
    const ackScope = windowTotal > 0 ? `last ${elapsed.toFixed(0)} s, ${count(windowTotal)} acks` : "since start";

    const node = stats.node;
    const before = previous ? previous.stats.node : null;
    fill(cards,
      card("Ingest rate", perSecond(rate(node.ingested_total, before && before.ingested_total)),
        `${count(node.ingested_total)} hooks ingested`, "card-ingest"),
      card("Ingest responses", statuses.map(([status, value]) => `${status} ${count(value)}`).join(" · "),
        statuses.map(([status, value]) => {
          const r = previous ? rate(value, sampleSum(previous.samples, "ankusa_ingest_requests_total", { status })) : null;
          return `${status} ${perSecond(r)}`;
        }).join(" · "), "card-statuses"),
      card("Ack latency p50 / p90 / p99",
        [0.5, 0.9, 0.99].map((q) => seconds(quantile(q, ackShown))).join(" / "), ackScope, "card-ack"),
      card("Pending", count(node.pending), `${bytes(node.bytes)} · ${count(node.inflight)} in flight`, "card-pending"),
      card("Dead letters", count(node.dead), `${count(node.dead_lettered_total)} dead-lettered ever`, "card-dead"),
      card("Quarantined", count(node.quarantined), null, "card-quarantined"),
      card("Breakers open",
        count(stats.breakers_open !== undefined ? stats.breakers_open : sampleSum(samples, "ankusa_dispatch_breakers_open")),
        `${count(sampleSum(samples, "ankusa_dispatch_breaker_opens_total"))} opens ever`, "card-breakers"),
      card("Lanes blocked", `${count(node.lanes_blocked)} of ${count(node.lanes)}`,
        `${count(node.lane_members)} members waiting`, "card-lanes"),
      card("Delivered", count(node.delivered_total), `${count(node.deduped_total)} repeats deduped`, "card-delivered"));

    const earlier = new Map(((previous && previous.stats.tenants) || []).map((t) => [t.id, t]));
    fill(tenants, table(
      ["Tenant", "Ingest", "Pending", "Bytes", "In flight", "Dead", "Quarantined", "Lanes blocked", "Waiting", "Breakers open", "Delivered"],
      stats.tenants,
      (t) => {
        const old = earlier.get(t.id);
        return el("tr", { "data-tenant": t.id },
          el("td", null, t.id),
          el("td", { class: "num" }, perSecond(old ? rate(t.ingested_total, old.ingested_total) : null)),
          el("td", { class: "num" }, count(t.pending)),
          el("td", { class: "num" }, bytes(t.bytes)),
          el("td", { class: "num" }, count(t.inflight)),
          el("td", { class: "num" }, el("a", { href: `#/dlq?tenant=${encodeURIComponent(t.id)}` }, count(t.dead))),
          el("td", { class: "num" }, el("a", { href: `#/quarantine?tenant=${encodeURIComponent(t.id)}` }, count(t.quarantined))),
          el("td", { class: "num" }, el("a", { href: `#/lanes?tenant=${encodeURIComponent(t.id)}` }, `${count(t.lanes_blocked)} of ${count(t.lanes)}`)),
          el("td", { class: "num" }, count(t.lane_members)),
          tenantBreakers(t),
          el("td", { class: "num" }, count(t.delivered_total)));
      },
      "No tenants."));
    // Node-wide: each breaker once, with the core that keeps it (a shared source's
    // breaker, tenant "—", parks every tenant of its core).
    fill(breakers, table(
      ["Source → sink", "Kind", "State", "Since", "Next probe", "Failures", "Tenant", "Core"],
      stats.breakers || [],
      (b) => el("tr", { "data-source": b.source, "data-sink": b.sink, "data-state": b.state },
        el("td", { class: "mono" }, `${b.source} → ${b.sink}`),
        el("td", null, b.kind),
        el("td", null, b.state === "half_open" ? "half-open" : "open"),
        el("td", null, `${clock(b.since_ms)} (${age(b.since_ms)})`),
        el("td", null, b.next_probe_ms === null ? "probing" : b.next_probe_ms > Date.now() ? clock(b.next_probe_ms) : "due"),
        el("td", { class: "num" }, count(b.consecutive_failures)),
        el("td", null, b.tenant === null ? "— (shared source)" : b.tenant),
        el("td", { class: "num" }, b.core)),
      "No breaker is open: every sink is taking attempts."));
    fill(note, `Node-wide and per tenant; rates over the last refresh. Updated ${new Date().toLocaleTimeString("en-GB")}.`);
    previous = { at, stats, samples, ack };
  }

  await refresh();
  return { refresh };
}

// ---------------------------------------------------------------------------------------
// Dead letters: GET /v1/dlq with filters, GET /v1/dlq/hook for one hook's envelope,
// POST /v1/dlq/revive and /v1/dlq/purge for one row or a selection, and a background
// revive of every dead row the filters name, followed at /v1/jobs/{id}.

export async function dlq(root, params) {
  const ids = await tenantIds();
  const tenant = params.get("tenant") || ids[0] || "";
  const filters = { tenant };
  for (const name of ["source", "sink", "reason"]) {
    if (params.get(name)) filters[name] = params.get(name);
  }
  const after = params.get("after") || "";
  const inspected = params.get("seq");

  const form = el("form", { id: "dlq-filters", class: "filters" },
    field("Tenant", tenantSelect(ids, tenant)),
    field("Source", el("input", { name: "source", value: filters.source || "", placeholder: "any" })),
    field("Sink", el("input", { name: "sink", value: filters.sink || "", placeholder: "any" })),
    field("Reason contains", el("input", { name: "reason", value: filters.reason || "", placeholder: "any" })),
    el("button", { type: "submit" }, "Apply"));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const chosen = {};
    for (const [name, value] of new FormData(form).entries()) {
      if (value) chosen[name] = value;
    }
    go("dlq", chosen);
  });

  const selected = new Set();
  const list = el("div", { id: "dlq-list" });
  const detail = el("div", { id: "dlq-detail" });
  const pager = el("div", { class: "pager" });
  const rowKey = (item) => `${item.seq}\u0000${item.sink}`;

  async function revive(rows) {
    let revived = 0;
    let skipped = 0;
    for (const row of rows) {
      const answer = await api("/v1/dlq/revive", { method: "POST", body: { tenant, seq: row.seq, sink: row.sink } });
      revived += answer.revived;
      skipped += answer.skipped;
    }
    notify(`Revived ${revived} row${revived === 1 ? "" : "s"}${skipped ? `, ${skipped} skipped` : ""}.`);
  }

  async function purge(rows) {
    let purged = 0;
    let hooks = 0;
    for (const row of rows) {
      const answer = await api("/v1/dlq/purge", { method: "POST", body: { tenant, seq: row.seq, sink: row.sink } });
      purged += answer.purged;
      hooks += answer.hooks_deleted;
    }
    notify(`Purged ${purged} row${purged === 1 ? "" : "s"} (${hooks} hook${hooks === 1 ? "" : "s"} deleted).`);
  }

  // Every dead row the filters name, as one revive job in the background: the API selects
  // by tenant, source and sink, so a reason filter (free text) cannot be revived whole.
  const scope = [`tenant ${tenant}`, filters.source && `source ${filters.source}`, filters.sink && `sink ${filters.sink}`]
    .filter(Boolean).join(", ");
  const jobLine = el("p", { id: "dlq-job", class: "hint hidden" });

  function showJob(job) {
    const result = job.result ? `: revived ${count(job.result.revived)}, skipped ${count(job.result.skipped)}` : "";
    const error = job.error ? `: ${job.error.status} ${job.error.code}: ${job.error.message}` : "";
    const progress = job.total === null ? "counting the rows" : `${count(job.done)} of ${count(job.total)} rows`;
    const rate = job.rate_per_s ? `, ${job.rate_per_s.toFixed(0)}/s` : "";
    const left = job.state === "running" && job.eta_s !== null ? `, about ${Math.ceil(job.eta_s)} s left` : "";
    fill(jobLine, ["done", "failed"].includes(job.state)
      ? `Revive job ${job.id} (${scope}) ${job.state}${result}${error}.`
      : `Revive job ${job.id} (${scope}) ${job.state}: ${progress}${rate}${left}.`);
    jobLine.dataset.job = job.id;
    jobLine.dataset.state = job.state;
    jobLine.classList.remove("hidden");
  }

  async function reviveAll() {
    const body = { tenant, background: true };
    if (filters.source) body.source = filters.source;
    if (filters.sink) body.sink = filters.sink;
    let job = await api("/v1/dlq/revive", { method: "POST", body });
    notify(`Revive started as job ${job.id}.`);
    showJob(job);
    // Followed until it ends or the page is left (a later render replaces `root`).
    while (!["done", "failed"].includes(job.state) && root.isConnected) {
      await new Promise((resolve) => setTimeout(resolve, JOB_POLL_MS));
      job = await api(`/v1/jobs/${job.id}`);
      showJob(job);
    }
    if (root.isConnected) await refresh();
  }

  const selection = () => [...selected].map((key) => {
    const [seq, sink] = key.split("\u0000");
    return { seq: Number(seq), sink };
  });
  const selectedNote = el("span", { id: "dlq-selected", class: "hint" });
  const reviveSelected = el("button", { type: "button", id: "dlq-revive-selected", onclick: () => run(async () => {
    await revive(selection());
    selected.clear();
    await refresh();
  }) }, "Revive selected");
  const purgeSelected = confirmButton("Purge selected", () => `Click again to purge ${selected.size} row(s)`, () => run(async () => {
    await purge(selection());
    selected.clear();
    await refresh();
  }), { id: "dlq-purge-selected" });
  function showSelection() {
    fill(selectedNote, selected.size ? `${selected.size} selected` : "Select rows to revive or purge them.");
    reviveSelected.disabled = selected.size === 0;
    purgeSelected.disabled = selected.size === 0;
  }
  showSelection();
  const actions = el("div", { class: "actions" },
    reviveSelected,
    purgeSelected,
    filters.reason
      ? el("button", { type: "button", id: "dlq-revive-all", disabled: true, title: "Revive all selects by tenant, source and sink: clear the reason filter, or select the rows." }, "Revive all")
      : confirmButton("Revive all", `Click again to revive every dead row of ${scope}`, () => run(reviveAll), { id: "dlq-revive-all", class: "" }),
    selectedNote);

  async function refresh() {
    const query = new URLSearchParams(filters);
    if (after) query.set("after", after);
    const page = await api(`/v1/dlq?${query}`);
    const shown = new Set(page.items.map(rowKey));
    for (const key of [...selected]) if (!shown.has(key)) selected.delete(key);
    showSelection();
    fillIfChanged(list, [page.items, [...selected]], () => table(["", "Seq", "Source", "Sink", "Attempts", "Reason", "Received", ""], page.items, (item) => {
      const key = rowKey(item);
      const selectable = item.sink !== null;
      const box = el("input", { type: "checkbox", class: "select", disabled: !selectable, checked: selected.has(key) });
      box.addEventListener("change", () => {
        if (box.checked) selected.add(key);
        else selected.delete(key);
        showSelection();
      });
      return el("tr", { "data-seq": item.seq, "data-sink": item.sink || "", class: String(item.seq) === inspected ? "inspected" : null },
        el("td", null, box),
        el("td", { class: "num" }, el("a", { href: `#/dlq?${new URLSearchParams(Object.assign({}, filters, { seq: item.seq }))}`, class: "inspect" }, item.seq)),
        el("td", null, item.source || "—"),
        el("td", null, item.sink || "—"),
        el("td", { class: "num" }, count(item.attempts)),
        el("td", { class: "wrap" }, item.reason),
        el("td", null, time(item.received_at_ms)),
        el("td", null, selectable
          ? el("button", { type: "button", class: "revive", onclick: () => run(async () => {
            await revive([{ seq: item.seq, sink: item.sink }]);
            await refresh();
          }) }, "Revive")
          : null));
    }, "No dead letters match."));
    const links = [];
    if (after) links.push(el("a", { href: `#/dlq?${new URLSearchParams(filters)}` }, "First page"));
    if (page.next) links.push(el("a", { href: `#/dlq?${new URLSearchParams(Object.assign({}, filters, { after: page.next }))}`, id: "dlq-next" }, "Next page"));
    fill(pager, links);
    if (inspected) await showHook();
  }

  async function showHook() {
    let envelope;
    try {
      envelope = await api(`/v1/dlq/hook?${new URLSearchParams({ tenant, seq: inspected })}`);
    } catch (error) {
      if (error.status !== 404) throw error;
      fillIfChanged(detail, error.message, () => [el("h3", null, `Hook ${inspected}`), el("p", { class: "hint" }, error.message)]);
      return;
    }
    const dead = envelope.rows.filter((row) => row.state === "dead" && row.sink !== null);
    fillIfChanged(detail, envelope, () => [
      el("h3", null, `Hook ${envelope.seq} of ${envelope.source}, received ${time(envelope.received_at_ms)}`),
      el("h4", null, "Delivery rows"),
      table(["Sink", "State", "Attempts", "First attempt", "Last error", "Reason", ""], envelope.rows, (row) =>
        el("tr", { "data-sink": row.sink || "" },
          el("td", null, row.sink || "—"),
          el("td", null, row.state),
          el("td", { class: "num" }, count(row.attempts)),
          el("td", null, time(row.first_attempt_at_ms)),
          el("td", { class: "wrap" }, row.last_error || "—"),
          el("td", { class: "wrap" }, row.reason || "—"),
          el("td", null, row.state === "dead" && row.sink !== null
            ? el("button", { type: "button", class: "revive", onclick: () => run(async () => {
              await revive([{ seq: envelope.seq, sink: row.sink }]);
              await refresh();
            }) }, "Revive")
            : null)),
      "The hook has no delivery rows left."),
      dead.length
        ? el("div", { class: "actions" }, confirmButton("Purge this hook's dead rows", "Click again to purge", () => run(async () => {
          await purge(dead.map((row) => ({ seq: envelope.seq, sink: row.sink })));
          await refresh();
        })))
        : null,
      el("h4", null, "Stored headers"),
      headersTable(envelope.headers),
      el("h4", null, `Body (${bytes(envelope.body_bytes)}${envelope.body_truncated ? ", preview" : ""})`),
      el("pre", { class: "body", id: "dlq-body" }, envelope.body_preview)]);
  }

  root.append(el("h2", null, "Dead letters"), form, actions, jobLine, list, pager, detail);
  if (!tenant) {
    fill(list, el("p", { class: "hint" }, "No tenants."));
    return {};
  }
  await refresh();
  return { refresh };
}

// ---------------------------------------------------------------------------------------
// Quarantine: GET /v1/quarantine and /v1/quarantine/hook; POST /v1/quarantine/release
// and /v1/quarantine/delete.

export async function quarantine(root, params) {
  const ids = await tenantIds();
  const tenant = params.get("tenant") || ids[0] || "";
  const after = params.get("after") || "";
  const inspected = params.get("seq");
  const form = el("form", { id: "quarantine-filters", class: "filters" },
    field("Tenant", tenantSelect(ids, tenant)),
    el("button", { type: "submit" }, "Show"));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    go("quarantine", { tenant: new FormData(form).get("tenant") });
  });
  const list = el("div", { id: "quarantine-list" });
  const pager = el("div", { class: "pager" });
  const detail = el("div", { id: "quarantine-detail" });

  async function release(seq) {
    const answer = await api("/v1/quarantine/release", { method: "POST", body: { tenant, seq } });
    notify(answer.new_seq !== null
      ? `Released hook ${seq} as hook ${answer.new_seq}.`
      : `Hook ${seq} repeats hook ${answer.duplicate_of} inside its dedupe window; it left quarantine without a new hook.`);
  }

  async function remove(seq) {
    await api("/v1/quarantine/delete", { method: "POST", body: { tenant, seq } });
    notify(`Deleted quarantined hook ${seq}.`);
  }

  const buttons = (seq) => [
    el("button", { type: "button", class: "release", onclick: () => run(async () => {
      await release(seq);
      await refresh();
    }) }, "Release"),
    confirmButton("Delete", "Click again to delete", () => run(async () => {
      await remove(seq);
      await refresh();
    }), { class: "danger delete" }),
  ];

  async function refresh() {
    const query = new URLSearchParams({ tenant });
    if (after) query.set("after", after);
    const page = await api(`/v1/quarantine?${query}`);
    fillIfChanged(list, page.items, () => table(["Seq", "Source", "Reason", "Received", "Size", ""], page.items, (item) =>
      el("tr", { "data-seq": item.seq, class: String(item.seq) === inspected ? "inspected" : null },
        el("td", { class: "num" }, el("a", { href: `#/quarantine?${new URLSearchParams({ tenant, seq: item.seq })}`, class: "inspect" }, item.seq)),
        el("td", null, item.source || "—"),
        el("td", { class: "wrap" }, item.reason),
        el("td", null, time(item.received_at_ms)),
        el("td", { class: "num" }, bytes(item.body_bytes)),
        el("td", null, buttons(item.seq))),
    "Nothing in quarantine."));
    const links = [];
    if (after) links.push(el("a", { href: `#/quarantine?${new URLSearchParams({ tenant })}` }, "First page"));
    if (page.next !== null) links.push(el("a", { href: `#/quarantine?${new URLSearchParams({ tenant, after: page.next })}` }, "Next page"));
    fill(pager, links);
    if (inspected) await showHook();
  }

  async function showHook() {
    let hook;
    try {
      hook = await api(`/v1/quarantine/hook?${new URLSearchParams({ tenant, seq: inspected })}`);
    } catch (error) {
      if (error.status !== 404) throw error;
      fillIfChanged(detail, error.message, () => [el("h3", null, `Hook ${inspected}`), el("p", { class: "hint" }, error.message)]);
      return;
    }
    fillIfChanged(detail, hook, () => [
      el("h3", null, `Quarantined hook ${hook.seq} of ${hook.source || "an unknown source"}`),
      el("p", null, `Reason: ${hook.reason}. Received ${time(hook.received_at_ms)}.`),
      el("div", { class: "actions" }, buttons(hook.seq)),
      el("h4", null, "Stored headers"),
      headersTable(hook.headers),
      el("h4", null, `Body (${bytes(hook.body_bytes)})`),
      el("pre", { class: "body", id: "quarantine-body" }, hook.body)]);
  }

  root.append(el("h2", null, "Quarantine"), form, list, pager, detail);
  if (!tenant) {
    fill(list, el("p", { class: "hint" }, "No tenants."));
    return {};
  }
  await refresh();
  return { refresh };
}

// ---------------------------------------------------------------------------------------
// Lanes: GET /v1/lanes (a tenant's busy lanes from the store's lane families, a page at a
// time) and the tenant's lane counters from /v1/stats.

export async function lanes(root, params) {
  const ids = await tenantIds();
  const tenant = params.get("tenant") || ids[0] || "";
  const filters = { tenant };
  if (params.get("sink")) filters.sink = params.get("sink");
  if (params.get("blocked") === "true") filters.blocked = "true";
  const after = params.get("after") || "";
  const form = el("form", { id: "lanes-filters", class: "filters" },
    field("Tenant", tenantSelect(ids, tenant)),
    field("Sink", el("input", { name: "sink", value: filters.sink || "", placeholder: "any" })),
    el("label", { class: "check" },
      el("input", { type: "checkbox", name: "blocked", value: "true", checked: filters.blocked === "true" }),
      " only blocked (head waiting for a retry)"),
    el("button", { type: "submit" }, "Show"));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const chosen = {};
    for (const [name, value] of new FormData(form).entries()) {
      if (value) chosen[name] = value;
    }
    go("lanes", chosen);
  });
  const summary = el("div", { class: "cards", id: "lanes-summary" });
  const list = el("div", { id: "lanes-list" });
  const pager = el("div", { class: "pager" });

  async function refresh() {
    const query = new URLSearchParams(filters);
    if (after) query.set("after", after);
    const [stats, page] = await Promise.all([api("/v1/stats"), api(`/v1/lanes?${query}`)]);
    const counters = stats.tenants.find((t) => t.id === tenant) || {};
    fill(summary,
      card("Busy lanes", count(counters.lanes), "lanes with a head", "lanes-busy"),
      card("Blocked", count(counters.lanes_blocked), "heads waiting for a retry", "lanes-blocked"),
      card("Members waiting", count(counters.lane_members), "behind their heads", "lanes-members"));
    fillIfChanged(list, page.items, () => table(
      ["Source", "Sink", "Ordering key", "Head", "State", "Attempts", "Last error", "Waiting"],
      page.items,
      (lane) => el("tr", { "data-lane": lane.lane, "data-state": lane.state },
        el("td", null, lane.source || "—"),
        el("td", null, lane.sink || "—"),
        el("td", { class: "mono wrap" }, lane.ordering_key === null ? "—" : lane.ordering_key || "(keyless)"),
        el("td", { class: "num" }, lane.head_seq),
        el("td", null, lane.state.replace("_", " ")),
        el("td", { class: "num" }, count(lane.attempts)),
        el("td", { class: "wrap" }, lane.last_error || "—"),
        el("td", { class: "num" }, `${count(lane.members_waiting)}${lane.members_more ? "+" : ""}`)),
      "No busy lanes match."));
    const links = [];
    if (after) links.push(el("a", { href: `#/lanes?${new URLSearchParams(filters)}` }, "First page"));
    if (page.next) links.push(el("a", { href: `#/lanes?${new URLSearchParams(Object.assign({}, filters, { after: page.next }))}` }, "Next page"));
    fill(pager, links);
  }

  root.append(el("h2", null, "Ordering lanes"),
    el("p", { class: "hint" }, "Busy lanes of ordered sinks: each lane's head (the one row of the lane that may be attempted), its attempts, and the members waiting behind it."),
    form, summary, list, pager);
  if (!tenant) {
    fill(list, el("p", { class: "hint" }, "No tenants."));
    return {};
  }
  await refresh();
  return { refresh };
}

// ---------------------------------------------------------------------------------------
// Archive replay: POST /v1/archive/replay in the background for one tenant, source and
// time range; the job it answers (GET /v1/jobs) counts the entries first, then shows its
// progress toward that count.

function jobRow(job) {
  const request = job.request || {};
  const progress = job.total === null ? `${count(job.done)} (counting)` : `${count(job.done)} of ${count(job.total)}`;
  const outcome = job.error
    ? `${job.error.status} ${job.error.code}: ${job.error.message}`
    : job.result ? Object.entries(job.result).map(([name, value]) => `${name} ${count(value)}`).join(", ") : "—";
  return el("tr", { "data-job": job.id, "data-kind": job.kind, "data-state": job.state },
    el("td", { class: "num" }, job.id),
    el("td", null, job.kind.replace("_", " ")),
    el("td", null, [request.tenant, request.source].filter(Boolean).join(" / ") || "—"),
    el("td", null, job.state),
    el("td", { class: "num" }, progress),
    el("td", { class: "num" }, job.rate_per_s ? `${job.rate_per_s.toFixed(0)}/s` : "—"),
    el("td", { class: "num" }, job.eta_s === null ? "—" : `${Math.ceil(job.eta_s)} s`),
    el("td", null, time(job.created_at_ms)),
    el("td", { class: "wrap" }, outcome));
}

export async function replay(root, params) {
  const ids = await tenantIds();
  const tenant = params.get("tenant") || ids[0] || "";
  // The last day up to the next whole minute, so the default range includes what arrived
  // this minute (datetime-local counts in minutes; the form reads and writes UTC).
  const now = Date.now();
  const until = new Date(now + 60 * 1000);
  const dayAgo = new Date(now - 24 * 3600 * 1000);
  const utc = (date) => date.toISOString().slice(0, 16);
  const form = el("form", { id: "replay-form", class: "filters" },
    field("Tenant", tenantSelect(ids, tenant)),
    field("Source", el("input", { name: "source", required: true, value: params.get("source") || "" })),
    field("Received from (UTC)", el("input", { name: "from", type: "datetime-local", required: true, value: utc(dayAgo) })),
    field("until (UTC)", el("input", { name: "to", type: "datetime-local", required: true, value: utc(until) })),
    el("button", { type: "submit", id: "replay-start" }, "Start replay"));
  const jobs = el("div", { id: "replay-jobs" });

  async function refresh() {
    const answer = await api("/v1/jobs");
    fillIfChanged(jobs, answer, () => table(
      ["Job", "Kind", "Tenant / source", "State", "Done", "Rate", "Left", "Created", "Outcome"],
      answer.jobs || answer, jobRow, "No replay or revive has run since the gateway started."));
  }

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const data = new FormData(form);
    const request = {
      tenant: data.get("tenant"),
      source: data.get("source"),
      from_ms: Date.parse(`${data.get("from")}Z`),
      to_ms: Date.parse(`${data.get("to")}Z`),
      background: true,
    };
    run(async () => {
      const job = await api("/v1/archive/replay", { method: "POST", body: request });
      notify(`Replay started as job ${job.id}.`);
      await refresh();
    });
  });

  root.append(el("h2", null, "Archive replay"),
    el("p", { class: "hint" }, "Delivered hooks of one source received in the range are ingested again as new hooks, delivered to the sinks the source has now. The job counts the range first, then shows its progress."),
    form, el("h3", null, "Jobs on this node"), jobs);
  await refresh();
  return { refresh };
}
