// The page of `llmpar ui`: it sends the spec to the server and lays out what comes back.
// Every number is the server's (llmpar's); this script only scales bars to the values
// shown and writes the formatted text it was given.
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const COLORS = {"weights": "#4e79a7", "gradients": "#f28e2b", "optimizer states": "#e15759",
  "KV cache": "#76b7b2", "activations": "#59a14f", "buffers": "#edc948",
  "compute": "#4e79a7", "exposed communication": "#e15759", "pipeline bubble": "#bab0ac",
  "optimizer step": "#f28e2b", "exposed offload": "#b07aa1", "host overhead": "#9c755f"};
const STAGE_COLORS = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#b07aa1", "#76b7b2",
  "#edc948", "#9c755f"];

const state = {fields: [], presets: {}, plan: null, search: null, workload: "training",
  timer: null, pending: 0};

function $(id) { return document.getElementById(id); }

function el(tag, attributes, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attributes || {})) {
    if (value === null || value === undefined) continue;
    if (key === "style") node.setAttribute("style", value);
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, String(value));
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function svg(tag, attributes, ...children) {
  const node = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attributes || {})) node.setAttribute(key, value);
  for (const child of children) {
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

async function api(path, body) {
  const options = body === undefined ? {} : {method: "POST", body: JSON.stringify(body),
    headers: {"Content-Type": "application/json"}};
  try {
    const response = await fetch(path, options);
    return await response.json();
  } catch (error) {
    return {ok: false, problems: [{path: "$", message: `the server did not answer (${error})`}]};
  }
}

// --- the spec in the address: #spec=<base64url of the TOML's UTF-8 bytes> -------------

function encodeSpec(text) {
  const bytes = new TextEncoder().encode(text);
  let binary = "";
  for (const byte of bytes) binary += String.fromCharCode(byte);
  return btoa(binary).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}

function decodeSpec(code) {
  const binary = atob(code.replace(/-/g, "+").replace(/_/g, "/"));
  return new TextDecoder().decode(Uint8Array.from(binary, (c) => c.charCodeAt(0)));
}

function specFromHash() {
  const match = /(?:^#|&)spec=([A-Za-z0-9_-]+)/.exec(location.hash);
  if (!match) return null;
  try { return decodeSpec(match[1]); } catch (error) { return null; }
}

function setHash(text) {
  history.replaceState(null, "", "#spec=" + encodeSpec(text));
}

// --- the form: drawn from the server's nodes (llmpar.ui.form, from the spec schema) ---

function fieldId(key) { return "field-" + key.replace(/\./g, "-"); }

function lastName(key) { return key.split(".").pop(); }

function fieldHelp(field) {
  const parts = [`${field.key} (${field.type}${field.unit ? ", " + field.unit : ""})`];
  if (field.description) parts.push(field.description);
  if (field.hint) parts.push(field.hint + ".");
  if (field.default !== null) parts.push(`Default: ${field.default}.`);
  return parts.join(" ");
}

function problemSlot(key) {
  return el("div", {class: "field-problem", "data-path": "$." + key, "data-key": key});
}

function fieldNode(field) {
  const id = fieldId(field.key);
  let input;
  if (field.choices.length || field.type === "preset") {
    input = el("select", {id, name: field.key}, el("option", {value: ""}, "(not set)"),
      ...field.choices.map((name) => el("option", {value: name}, name)));
  } else {
    input = el("input", {id, name: field.key, type: "text", spellcheck: "false",
      inputmode: field.type === "integer" ? "numeric" : null});
  }
  const help = fieldHelp(field);
  input.title = help;
  // The text as typed: the server reads it as a spec file's value ("80 GB" included).
  input.addEventListener("change", () =>
    evaluate({[field.key]: input.value.trim() === "" ? null : input.value}));
  return el("div", {class: "field" + (field.type === "toml" ? " wide" : ""),
    "data-key": field.key, "data-type": field.type},
  el("label", {for: id, title: help}, lastName(field.key),
    field.unit ? el("span", {class: "unit"}, ` (${field.unit})`) : null),
  input, problemSlot(field.key));
}

function tableNode(table) {
  const body = el("div", {class: "table-fields"});
  drawNodes(table.children, body);
  return el("details", {class: "table", "data-key": table.key},
    el("summary", {title: table.description},
      el("code", {}, `[${table.key}]`),
      table.preset ? " keys over the preset" : "",
      el("span", {class: "table-note"}, ` ${table.description}`)),
    problemSlot(table.key), body);
}

function drawNodes(nodes, parent) {
  for (const node of nodes) {
    if (node.node === "table") {
      parent.append(tableNode(node));
    } else {
      state.fields.push(node);
      parent.append(fieldNode(node));
    }
  }
}

function buildForm(nodes) {
  state.fields = [];
  drawNodes(nodes, $("fields"));
}

function showFields(values, effective) {
  for (const field of state.fields) {
    const input = $(fieldId(field.key));
    const text = values[field.key] === undefined ? "" : values[field.key];
    if (input.tagName === "SELECT" && text && ![...input.options].some((o) => o.value === text)) {
      input.append(el("option", {value: text}, text));
    }
    input.value = text;
    // What the key is without a value: the preset's or the default (llmpar's loaded spec).
    const shown = effective && effective[field.key] !== undefined ? effective[field.key]
      : field.default;
    if (input.tagName === "SELECT") {
      input.options[0].textContent = shown === null ? "(not set)" : `(not set: ${shown})`;
    } else {
      input.placeholder = shown === null ? "" : shown;
    }
  }
  // A table the spec gives opens (none closes: the user may have opened it).
  const keys = Object.keys(values);
  for (const details of document.querySelectorAll("details.table")) {
    if (keys.some((key) => key.startsWith(details.dataset.key + "."))) details.open = true;
  }
}

function showProblems(problems) {
  const list = $("problems");
  list.replaceChildren();
  for (const node of document.querySelectorAll(".field-problem")) node.replaceChildren();
  for (const node of document.querySelectorAll(".bad")) node.classList.remove("bad");
  for (const problem of problems || []) {
    list.append(el("li", {"data-path": problem.path}, el("code", {}, problem.path), " ",
      problem.message));
    const slot = problem.key ? document.querySelector(
      `.field-problem[data-key="${CSS.escape(problem.key)}"]`) : null;
    if (!slot) continue;
    slot.append(el("div", {}, problem.message));
    slot.parentElement.classList.add("bad");
    for (let node = slot.parentElement; node; node = node.parentElement) {
      if (node.tagName === "DETAILS") node.open = true;
    }
  }
}

// --- evaluation -------------------------------------------------------------------------

async function evaluate(changes) {
  const ticket = ++state.pending;
  $("status").textContent = "evaluating...";
  const answer = await api("/api/evaluate", {toml: $("toml").value, changes: changes || null});
  if (ticket !== state.pending) return;  // a later edit has been sent since
  if (answer.toml !== undefined) {
    if (answer.toml !== $("toml").value) $("toml").value = answer.toml;
    setHash(answer.toml);
  }
  if (answer.fields) showFields(answer.fields, answer.effective);
  showProblems(answer.problems);
  if (!answer.ok) {
    $("status").textContent = `${(answer.problems || []).length} problem(s)`;
    document.body.dataset.state = "problems";
    return;
  }
  $("status").textContent = "";
  state.plan = answer.plan;
  state.workload = answer.workload;
  $("download-json").disabled = false;
  showPlan(answer.view);
  document.body.dataset.state = "planned";
}

function scheduleEvaluate() {
  clearTimeout(state.timer);
  state.timer = setTimeout(() => evaluate(null), 600);
}

// --- drawing a plan ---------------------------------------------------------------------

function card(item) {
  return el("div", {class: "card", "data-key": item.key, "data-value": item.value},
    el("div", {class: "card-label"}, item.label), el("div", {class: "card-value"}, item.text));
}

function stackedBar(parts, scale, marker, attributes) {
  const bar = el("div", {class: "bar", ...attributes});
  for (const part of parts) {
    const share = scale > 0 ? (100 * part.value) / scale : 0;
    bar.append(el("div", {class: "segment", title: `${part.label}: ${part.text}`,
      "data-component": part.label, "data-value": part.value,
      style: `width:${share}%;background:${COLORS[part.label] || "#888"}`}));
  }
  if (marker) {
    bar.append(el("div", {class: "marker", title: `${marker.label}: ${marker.text}`,
      style: `left:${scale > 0 ? (100 * marker.value) / scale : 0}%`}));
  }
  return bar;
}

function legend(parts, total) {
  const items = parts.map((part) => el("span", {class: "legend-item"},
    el("i", {style: `background:${COLORS[part.label] || "#888"}`}), `${part.label} `,
    el("b", {}, part.text)));
  if (total) items.push(el("span", {class: "legend-item"}, `${total.label} `,
    el("b", {"data-key": total.key, "data-value": total.value}, total.text)));
  return items;
}

function showMemory(memory) {
  const scale = Math.max(memory.capacity.value, memory.total.value);
  $("memory-bar").replaceChildren(stackedBar(memory.components, scale, memory.capacity,
    {id: "memory-stack", "data-total": memory.total.value,
     "data-capacity": memory.capacity.value}));
  $("memory-legend").replaceChildren(...legend(memory.components,
    {...memory.total, key: "total_bytes"}),
    el("span", {class: "legend-item"}, "capacity ", el("b", {"data-key": "capacity_bytes",
      "data-value": memory.capacity.value}, memory.capacity.text)),
    el("span", {class: memory.fits ? "badge ok" : "badge bad", id: "fits"},
      memory.fits ? "fits" : "does not fit"));
  $("stages-box").hidden = memory.stages.length === 0;
  const stageScale = Math.max(memory.capacity.value, ...memory.stages.map((s) => s.total.value));
  $("stage-bars").replaceChildren(...memory.stages.map((stage) => el("div",
    {class: "stage-row" + (stage.stage === memory.peak_stage ? " peak" : "")},
    el("span", {class: "stage-label"}, `stage ${stage.stage} (${stage.layers} layers)`),
    stackedBar(stage.components, stageScale, memory.capacity,
      {"data-stage": stage.stage, "data-total": stage.total.value}),
    el("span", {class: "stage-total"}, stage.total.text))));
}

function showPeak(peak, capacity) {
  $("peak-box").hidden = !peak;
  if (!peak) return;
  $("peak-numbers").replaceChildren(
    card({...peak.allocated, key: "memory_peak.allocated_bytes"}),
    card({...peak.reserved, key: "memory_peak.reserved_bytes"}),
    card({...peak.device, key: "memory_peak.device_bytes"}),
    card({label: "at", text: `stage ${peak.stage}, ${peak.moment}`, value: peak.stage}));
  const width = 640, height = 220, left = 8, top = 12, bottom = 70;
  const moments = peak.timeline;
  const stages = [...new Set(moments.map((m) => m.stage))];
  const names = peak.moments;
  const scale = Math.max(capacity.value, ...moments.map((m) => m.value));
  const y = (value) => top + (height - top - bottom) * (1 - value / scale);
  const x = (index) => left + ((width - 2 * left) * (index + 0.5)) / Math.max(1, names.length);
  const chart = svg("svg", {viewBox: `0 0 ${width} ${height}`, id: "timeline-svg",
    role: "img", "aria-label": "allocated memory of each stage at each moment of a step"});
  chart.append(svg("line", {x1: left, x2: width - left, y1: y(capacity.value),
    y2: y(capacity.value), class: "capacity-line"}),
  svg("text", {x: width - left, y: y(capacity.value) - 3, "text-anchor": "end",
    class: "axis"}, `capacity ${capacity.text}`));
  stages.forEach((stage, i) => {
    const points = moments.filter((m) => m.stage === stage)
      .map((m) => [x(names.indexOf(m.label)), y(m.value), m]);
    const color = STAGE_COLORS[i % STAGE_COLORS.length];
    chart.append(svg("polyline", {points: points.map((p) => `${p[0]},${p[1]}`).join(" "),
      fill: "none", stroke: color, "stroke-width": 2}));
    for (const [px, py, m] of points) {
      chart.append(svg("circle", {cx: px, cy: py, r: 3.5, fill: color, "data-stage": stage,
        "data-moment": m.label, "data-value": m.value},
      svg("title", {}, `stage ${stage}, ${m.label}: ${m.text}`)));
      if (stage === peak.stage && m.label === peak.moment) {
        // The step's peak (llmpar's memory_peak): ringed and labelled.
        chart.append(svg("circle", {cx: px, cy: py, r: 8, class: "peak-point",
          "data-value": m.value}), svg("text", {x: px, y: py - 12, "text-anchor": "middle",
          class: "axis peak-label"}, `peak ${peak.allocated.text}`));
      }
    }
  });
  names.forEach((name, i) => chart.append(svg("text", {x: x(i), y: height - bottom + 14,
    "text-anchor": "end", transform: `rotate(-30 ${x(i)} ${height - bottom + 14})`,
    class: "axis"}, name)));
  $("timeline").replaceChildren(chart, el("div", {class: "legend"}, ...stages.map((stage, i) =>
    el("span", {class: "legend-item"}, el("i", {style:
      `background:${STAGE_COLORS[i % STAGE_COLORS.length]}`}), `stage ${stage}`))));
}

function showStep(step) {
  $("step-box").hidden = !step;
  if (!step) return;
  const parts = step.parts.filter((part) => part.value > 0);
  $("step-bar").replaceChildren(stackedBar(parts, step.step.value, null,
    {id: "step-stack", "data-total": step.step.value}));
  $("step-legend").replaceChildren(...legend(parts, {...step.step, key: "step_seconds"}));
}

function showCollectives(rows) {
  $("collectives-box").hidden = rows.length === 0;
  const header = el("tr", {}, ...["strategy", "operation", "tier", "buffer", "group",
    "calls/step", "time", "exposed"].map((name) => el("th", {}, name)));
  const body = rows.map((c) => el("tr", {},
    el("td", {}, c.strategy),
    el("td", {}, c.operation + (c.name ? ` (${c.name})` : "")),
    el("td", {}, c.tier),
    el("td", {class: "num"}, c.buffer),
    el("td", {class: "num"}, c.group_size),
    el("td", {class: "num"}, c.calls_per_step),
    el("td", {class: "num", "data-value": c.time.value}, c.time.text),
    el("td", {class: "num", "data-value": c.exposed.value}, c.exposed.text)));
  $("collectives").replaceChildren(el("thead", {}, header), el("tbody", {}, ...body));
}

function showTables(tables) {
  $("tables").replaceChildren(...tables.map((table) => el("div", {class: "report-table"},
    el("h4", {}, table.title),
    el("table", {}, table.columns.some((c) => c) ? el("thead", {}, el("tr", {},
      ...table.columns.map((c) => el("th", {}, c)))) : null,
    el("tbody", {}, ...table.rows.map((row, i) => el("tr",
      {class: table.marked.includes(i) ? "marked" : null},
      ...row.map((cell, j) => el("td", {class: table.text_columns.includes(j) ? null : "num"},
        cell)))))),
    ...table.notes.map((note) => el("p", {class: "note"}, note)))));
}

function showPlan(view) {
  $("plan-title").textContent = view.title;
  $("layout-chips").replaceChildren(...Object.entries(view.layout).map(([name, degree]) =>
    el("span", {class: "chip", "data-axis": name}, `${name} ${degree}`)));
  $("cards").replaceChildren(...(view.workload === "training" ? view.run : []).map(card));
  showMemory(view.memory);
  showPeak(view.peak, view.memory.capacity);
  showStep(view.step);
  $("serving-box").hidden = !view.serving;
  $("serving-cards").replaceChildren(...(view.serving ? view.serving.rows : []).map(card));
  showCollectives(view.collectives);
  $("trust-box").hidden = !view.trust;
  $("trust").textContent = view.trust;
  $("warnings-box").hidden = view.warnings.length === 0;
  $("warnings").replaceChildren(...view.warnings.map((w) => el("li", {}, w)));
  showTables(view.tables);
}

// --- search -----------------------------------------------------------------------------

function layoutText(layout) {
  return Object.entries(layout).map(([name, degree]) => `${name} ${degree}`).join(" x ");
}

async function runSearch() {
  const top = parseInt($("top").value, 10) || 10;
  $("search-problems").replaceChildren();
  $("search-results").replaceChildren();
  $("download-search").disabled = true;
  $("pareto-box").hidden = true;
  $("search-summary").textContent = "";
  $("search-progress").hidden = false;
  document.body.dataset.search = "running";
  const started = await api("/api/search", {toml: $("toml").value,
    objective: $("objective").value || null, top});
  let job = {done: false};
  while (!job.done) {
    await new Promise((resolve) => setTimeout(resolve, 200));
    job = await api(`/api/search/${started.id}`);
    $("search-bar").value = job.layouts_total ? job.layouts_done / job.layouts_total : 0;
    $("search-stage").textContent = job.layouts_total
      ? `${job.stage}: ${job.layouts_done.toLocaleString()} / ${job.layouts_total.toLocaleString()} layouts`
      : job.stage;
  }
  $("search-progress").hidden = true;
  state.search = job.result;
  $("download-search").disabled = !job.result.ok;
  showSearch(job.result);
  document.body.dataset.search = job.result.ok ? "done" : "problems";
}

function showSearch(result) {
  if (!result.ok) {
    $("search-problems").replaceChildren(...result.problems.map((p) =>
      el("li", {}, el("code", {}, p.path), " ", p.message)));
    return;
  }
  const rejected = Object.entries(result.rejected).map(([why, n]) => `${n} ${why}`).join("; ");
  $("search-summary").textContent = `${result.considered.toLocaleString()} layouts considered, ` +
    `${result.ranked.toLocaleString()} fit; ranked by ${result.objective}` +
    (rejected ? `; rejected: ${rejected}` : "");
  const time = result.workload === "inference" ? "TPOT" : "step time";
  const header = el("tr", {}, ...["rank", "layout", "choices", result.objective,
    "memory per GPU", time].map((name) => el("th", {}, name)));
  const body = result.results.map((row) => el("tr", {class: "clickable",
    "data-rank": row.rank, "data-objective": row.objective,
    title: "open this layout as a plan", onclick: () => openLayout(row.toml)},
  el("td", {class: "num"}, row.rank),
  el("td", {class: "nowrap"}, layoutText(row.layout)),
  el("td", {class: "choices", title: row.choices_text || ""}, row.choices_text || ""),
  el("td", {class: "num"}, row.objective_text),
  el("td", {class: "num", "data-value": row.total_bytes}, row.memory_text),
  el("td", {class: "num"}, row.seconds_text)));
  $("search-results").replaceChildren(el("thead", {}, header), el("tbody", {}, ...body));
  showPareto(result.pareto);
}

function showPareto(points) {
  $("pareto-box").hidden = points.length === 0;
  if (!points.length) return;
  const width = 640, height = 260, pad = 48;
  const xs = points.map((p) => p.total_bytes), ys = points.map((p) => p.step_seconds || 0);
  const [x0, x1] = [Math.min(...xs), Math.max(...xs)], [y0, y1] = [Math.min(...ys), Math.max(...ys)];
  const x = (v) => pad + (width - 2 * pad) * (x1 > x0 ? (v - x0) / (x1 - x0) : 0.5);
  const y = (v) => height - pad - (height - 2 * pad) * (y1 > y0 ? (v - y0) / (y1 - y0) : 0.5);
  const chart = svg("svg", {viewBox: `0 0 ${width} ${height}`, id: "pareto-svg", role: "img",
    "aria-label": "Pareto front"});
  chart.append(svg("text", {x: width / 2, y: height - 8, "text-anchor": "middle",
    class: "axis"}, "memory per GPU"), svg("text", {x: 12, y: height / 2,
    transform: `rotate(-90 12 ${height / 2})`, "text-anchor": "middle", class: "axis"},
  "step time"));
  chart.append(svg("polyline", {points: points.map((p) => `${x(p.total_bytes)},` +
    `${y(p.step_seconds || 0)}`).join(" "), fill: "none", stroke: "#bbb"}));
  for (const point of points) {
    const dot = svg("circle", {cx: x(point.total_bytes), cy: y(point.step_seconds || 0), r: 6,
      class: "pareto-point", "data-value": point.total_bytes}, svg("title", {},
      `${layoutText(point.layout)}: ${point.memory_text}, ${point.seconds_text}`));
    dot.addEventListener("click", () => openLayout(point.toml));
    chart.append(dot);
  }
  const ends = [points[0], points[points.length - 1]];
  for (const [point, anchor] of [[ends[0], "start"], [ends[1], "end"]]) {
    chart.append(svg("text", {x: x(point.total_bytes), y: height - pad + 16,
      "text-anchor": anchor, class: "axis"}, point.memory_text));
    chart.append(svg("text", {x: x(point.total_bytes), y: y(point.step_seconds || 0) - 10,
      "text-anchor": anchor, class: "axis"}, point.seconds_text));
  }
  $("pareto").replaceChildren(chart);
}

function openLayout(toml) {
  $("toml").value = toml;
  showView("plan");
  evaluate(null);
}

// --- tabs, downloads, start -------------------------------------------------------------

function showView(name) {
  for (const tab of document.querySelectorAll(".tab")) {
    tab.classList.toggle("active", tab.dataset.view === name);
  }
  $("plan-view").hidden = name !== "plan";
  $("search-view").hidden = name !== "search";
}

function download(name, text, type) {
  const link = el("a", {href: URL.createObjectURL(new Blob([text], {type})), download: name});
  document.body.append(link);
  link.click();
  link.remove();
}

async function loadExample(name) {
  const answer = await api("/api/example", {name});
  if (!answer.ok) { showProblems(answer.problems); return; }
  $("toml").value = answer.toml;
  evaluate(null);
}

async function start() {
  const listing = await api("/api/presets");
  state.presets = listing.presets;
  buildForm(listing.form);
  for (const name of listing.presets.examples) {
    $("example").append(el("option", {value: name}, name));
  }
  for (const objective of listing.objectives) {
    $("objective").append(el("option", {value: objective}, objective));
  }
  $("fields").addEventListener("submit", (event) => event.preventDefault());
  $("example").addEventListener("change", (event) => {
    if (event.target.value) loadExample(event.target.value);
  });
  $("toml").addEventListener("input", scheduleEvaluate);
  $("evaluate").addEventListener("click", () => evaluate(null));
  $("run-search").addEventListener("click", runSearch);
  for (const tab of document.querySelectorAll(".tab")) {
    tab.addEventListener("click", () => showView(tab.dataset.view));
  }
  $("download-toml").addEventListener("click", () =>
    download("spec.toml", $("toml").value, "application/toml"));
  $("download-json").addEventListener("click", () =>
    download("plan.json", JSON.stringify(state.plan, null, 2), "application/json"));
  $("download-search").addEventListener("click", () =>
    download("search.json", JSON.stringify(state.search, null, 2), "application/json"));
  $("copy-link").addEventListener("click", () => navigator.clipboard.writeText(location.href));
  const fromHash = specFromHash();
  if (fromHash !== null) {
    $("toml").value = fromHash;
  } else if (listing.initial && listing.initial.toml) {
    $("toml").value = listing.initial.toml;
  } else {
    const first = listing.presets.examples.includes("llama-3-70b-tp8-pp4-cp2")
      ? "llama-3-70b-tp8-pp4-cp2" : listing.presets.examples[0];
    await loadExample(first);
    return;
  }
  await evaluate(null);
}

start();
