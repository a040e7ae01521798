// DOM helpers. Data from the API (hook bodies, headers, destinations' error text) is
// untrusted: it only ever reaches the page as text nodes or attribute values, never as
// markup, so nothing here parses HTML.

// el("tr", {class: "row", onclick: fn}, "text", child, ...): an element with attributes,
// event listeners (on* keys) and children (strings become text nodes; null is skipped).
export function el(tag, attributes, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name.startsWith("on") && typeof value === "function") {
      node.addEventListener(name.slice(2), value);
    } else if (value === true) {
      node.setAttribute(name, "");
    } else {
      node.setAttribute(name, String(value));
    }
  }
  append(node, children);
  return node;
}

function append(node, children) {
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    if (Array.isArray(child)) append(node, child);
    else if (child instanceof Node) node.appendChild(child);
    else node.appendChild(document.createTextNode(String(child)));
  }
}

// Replaces every child of `node` with `children`.
export function fill(node, ...children) {
  node.replaceChildren();
  append(node, children);
  return node;
}

// A table with a header row and one row per item; `row(item)` returns a <tr>.
export function table(headings, items, row, empty) {
  const body = el("tbody", null, items.map(row));
  if (items.length === 0) {
    body.appendChild(el("tr", null, el("td", { colspan: headings.length, class: "empty" }, empty || "Nothing here.")));
  }
  return el("table", null, el("thead", null, el("tr", null, headings.map((h) => el("th", null, h)))), body);
}

// A labelled number card of the overview.
export function card(label, value, detail, id) {
  return el("div", { class: "card", id: id || null },
    el("div", { class: "card-label" }, label),
    el("div", { class: "card-value" }, value),
    detail ? el("div", { class: "card-detail" }, detail) : null);
}

export function time(ms) {
  if (ms === null || ms === undefined) return "—";
  return new Date(ms).toISOString().replace("T", " ").replace("Z", " UTC");
}

export function count(value) {
  if (value === null || value === undefined) return "—";
  return Number(value).toLocaleString("en");
}

export function bytes(value) {
  if (value === null || value === undefined) return "—";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let amount = Number(value);
  let unit = 0;
  while (amount >= 1024 && unit < units.length - 1) {
    amount /= 1024;
    unit += 1;
  }
  return `${unit === 0 ? amount : amount.toFixed(1)} ${units[unit]}`;
}

export function seconds(value) {
  if (value === null || value === undefined || !isFinite(value)) return "—";
  if (value < 0.001) return `${(value * 1e6).toFixed(0)} µs`;
  if (value < 1) return `${(value * 1e3).toFixed(value < 0.01 ? 2 : 1)} ms`;
  return `${value.toFixed(2)} s`;
}
