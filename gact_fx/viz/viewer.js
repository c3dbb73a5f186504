// gact-fx viewer: renders the JSON in #gact-data; no network, no dependencies.
(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("gact-data").textContent);
  const SVG = "http://www.w3.org/2000/svg";
  const NODE_W = 150, NODE_H = 20;
  let graph = null, nodesById = {}, elementsById = {}, view = null, matches = [], matchIndex = -1;

  function bytes(n) {
    if (n === null || n === undefined) return "-";
    const units = ["B", "KiB", "MiB", "GiB"];
    let i = 0;
    while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
    return i === 0 ? n + " B" : n.toFixed(1) + " " + units[i];
  }
  function make(tag, attributes, parent, ns) {
    const element = ns ? document.createElementNS(SVG, tag) : document.createElement(tag);
    for (const [key, value] of Object.entries(attributes || {})) {
      if (key === "text") element.textContent = value; else element.setAttribute(key, value);
    }
    if (parent) parent.appendChild(element);
    return element;
  }
  function clear(element) { while (element.firstChild) element.removeChild(element.firstChild); }

  function renderHeader() {
    document.getElementById("title").textContent = data.title;
    const ratio = data.after ? (data.before / data.after).toFixed(1) + "x smaller" : "n/a";
    document.getElementById("totals").textContent =
      data.graphs.length + " compiled graph(s); activations held for backward " + bytes(data.before) + " -> " + bytes(data.after) + " (" + ratio + ")";
    const nav = document.getElementById("tabs");
    data.graphs.forEach((g, i) => {
      const button = make("button", { text: "graph " + g.index + " (" + g.compiler + ")", "data-graph": i }, nav);
      button.addEventListener("click", () => select(i));
    });
  }

  function renderTimeline(g) {
    const svg = document.querySelector("#timeline svg");
    clear(svg);
    const width = svg.clientWidth || 900, height = 220, pad = 50;
    const series = [["baseline", g.timeline.baseline, "#9aa4b5"], ["gact", g.timeline.gact, "#e0245e"]];
    const count = Math.max(g.timeline.baseline.length, g.timeline.gact.length, 2);
    const peak = Math.max(1, ...g.timeline.baseline, ...g.timeline.gact);
    const x = (i) => pad + (i / (count - 1)) * (width - pad - 10);
    const y = (v) => height - 25 - (v / peak) * (height - 45);
    make("line", { x1: pad, y1: height - 25, x2: width - 10, y2: height - 25, class: "axis" }, svg, true);
    make("line", { x1: pad, y1: 10, x2: pad, y2: height - 25, class: "axis" }, svg, true);
    const boundary = x(g.timeline.forwardNodes);
    make("line", { x1: boundary, y1: 10, x2: boundary, y2: height - 25, stroke: "#c5cbd6", "stroke-dasharray": "4 3" }, svg, true);
    make("text", { x: pad + 4, y: height - 8, text: "forward", "font-size": 11, fill: "#6b7486" }, svg, true);
    make("text", { x: boundary + 4, y: height - 8, text: "backward", "font-size": 11, fill: "#6b7486" }, svg, true);
    make("text", { x: 4, y: 18, text: bytes(peak), "font-size": 11, fill: "#6b7486" }, svg, true);
    for (const [, values, colour] of series) {
      const points = values.map((v, i) => x(i).toFixed(1) + "," + y(v).toFixed(1)).join(" ");
      make("polyline", { points: points, fill: "none", stroke: colour, "stroke-width": 2 }, svg, true);
    }
    document.getElementById("peaks").textContent =
      "peak held for backward: baseline " + bytes(Math.max(...g.timeline.baseline, 0)) + ", gact " + bytes(Math.max(...g.timeline.gact, 0));
  }

  const PARAMETER_KINDS = ["parameter", "view of parameter"];

  function renderTable(g) {
    const columns = [["label", "tensor"], ["name", "FX node"], ["kind", "kind"], ["producer", "producer"], ["shape", "shape"], ["dtype", "dtype"],
      ["bits", "bits"], ["use", "backward use"], ["why", "why these bits"], ["sensitivity", "sensitivity"],
      ["before", "bytes before"], ["after", "bytes after"], ["stored", "stored"]];
    const table = document.getElementById("saved-table");
    clear(table);
    const head = make("tr", {}, make("thead", {}, table));
    const body = make("tbody", {}, table);
    // Rows come sorted by the bytes they hold; parameters (held by the model anyway) are folded.
    let rows = g.rows.slice();
    const folded = rows.filter((r) => PARAMETER_KINDS.includes(r.kind)).length;
    let showParameters = false;
    const toggle = document.getElementById("parameters-toggle");
    toggle.textContent = folded ? "show the " + folded + " parameters (held by the model anyway)" : "";
    toggle.style.display = folded ? "" : "none";
    toggle.onclick = () => {
      showParameters = !showParameters;
      toggle.textContent = (showParameters ? "fold the " : "show the ") + folded + " parameters (held by the model anyway)";
      fill();
    };
    function fill() {
      clear(body);
      for (const row of rows) {
        if (!showParameters && PARAMETER_KINDS.includes(row.kind)) continue;
        const tr = make("tr", { class: "selectable", "data-source": row.source }, body);
        for (const [key] of columns) {
          let value = row[key];
          if (key === "before" || key === "after") value = bytes(value);
          else if (key === "shape") value = "[" + value.join(", ") + "]";
          else if (key === "sensitivity") value = value === null ? "-" : Number(value).toPrecision(3);
          else if (value === null) value = "-";
          make("td", { text: String(value), class: key === "stored" && value === "compressed" ? "compressed" : "" }, tr);
        }
        tr.addEventListener("click", () => selectNode("forward:" + row.source, true));
      }
    }
    for (const [key, label] of columns) {
      const th = make("th", { text: label }, head);
      th.addEventListener("click", () => {
        rows.sort((a, b) => (a[key] === b[key] ? 0 : a[key] === null ? 1 : b[key] === null ? -1 : a[key] < b[key] ? 1 : -1));
        fill();
      });
    }
    fill();
  }

  function setView(box) {
    view = box;
    document.querySelector("#canvas svg").setAttribute("viewBox", box.join(" "));
  }

  function renderGraph(g) {
    const svg = document.querySelector("#canvas svg");
    clear(svg);
    nodesById = {}; elementsById = {};
    for (const node of g.nodes) nodesById[node.id] = node;
    const edges = make("g", {}, svg, true), saved = make("g", {}, svg, true), nodes = make("g", {}, svg, true);
    for (const node of g.nodes) {
      for (const source of node.inputs) {
        const from = nodesById[source];
        if (!from) continue;
        make("path", { class: "edge", d: "M" + (from.x + NODE_W) + "," + (from.y + NODE_H / 2) + " L" + node.x + "," + (node.y + NODE_H / 2) }, edges, true);
      }
    }
    for (const edge of g.savedEdges) {
      const from = nodesById[edge.from], to = nodesById[edge.to];
      if (!from || !to) continue;
      const x1 = from.x + NODE_W / 2, y1 = from.y + NODE_H, x2 = to.x + NODE_W / 2, y2 = to.y;
      make("path", { class: "saved-edge", d: "M" + x1 + "," + y1 + " C" + x1 + "," + (y1 + 120) + " " + x2 + "," + (y2 - 120) + " " + x2 + "," + y2 }, saved, true);
    }
    let maxX = 0, maxY = 0;
    for (const node of g.nodes) {
      const group = make("g", { class: "node " + (node.role || ""), transform: "translate(" + node.x + "," + node.y + ")", "data-node": node.id }, nodes, true);
      make("rect", { width: NODE_W, height: NODE_H }, group, true);
      const label = node.op === "placeholder" ? "in: " + node.name : node.target.replace(/^aten::|^aten\./, "").replace(/\.default$/, "");
      make("text", { x: 4, y: 14, text: label.length > 24 ? label.slice(0, 23) + "…" : label }, group, true);
      make("title", { text: node.name }, group, true);
      group.addEventListener("click", (event) => { event.stopPropagation(); selectNode(node.id, false); });
      elementsById[node.id] = group;
      maxX = Math.max(maxX, node.x + NODE_W); maxY = Math.max(maxY, node.y + NODE_H);
    }
    graph = { width: maxX + 20, height: maxY + 20 };
    setView([-10, -10, Math.min(graph.width, 1400), Math.min(graph.height, 900)]);
  }

  function renderModules(g) {
    const list = document.getElementById("modules");
    clear(list);
    const counts = {};
    for (const node of g.nodes) {
      if (!node.module) continue;
      const parts = node.module.split(".");
      for (let i = 1; i <= parts.length; i += 1) {
        const path = parts.slice(0, i).join(".");
        counts[path] = (counts[path] || 0) + 1;
      }
    }
    const paths = Object.keys(counts).sort();
    make("div", { text: "(all)", class: "muted" }, list).addEventListener("click", () => highlightModule(""));
    for (const path of paths) {
      const depth = path.split(".").length - 1;
      const item = make("div", { text: path.split(".").pop() + " (" + counts[path] + ")", title: path, style: "padding-left:" + depth * 10 + "px" }, list);
      item.addEventListener("click", () => highlightModule(path));
    }
  }

  function zoomTo(ids) {
    const members = ids.map((id) => nodesById[id]).filter(Boolean);
    if (!members.length) return;
    const x0 = Math.min(...members.map((n) => n.x)) - 40, y0 = Math.min(...members.map((n) => n.y)) - 40;
    const x1 = Math.max(...members.map((n) => n.x + NODE_W)) + 40, y1 = Math.max(...members.map((n) => n.y + NODE_H)) + 40;
    setView([x0, y0, Math.max(x1 - x0, 300), Math.max(y1 - y0, 200)]);
  }

  function highlightModule(path) {
    const ids = [];
    for (const [id, element] of Object.entries(elementsById)) {
      const inside = path === "" || nodesById[id].module === path || nodesById[id].module.startsWith(path + ".");
      element.classList.toggle("dim", !inside);
      if (inside) ids.push(id);
    }
    if (path) zoomTo(ids);
  }

  function selectNode(id, center) {
    for (const element of document.querySelectorAll(".node.selected")) element.classList.remove("selected");
    const node = nodesById[id];
    const details = document.getElementById("details");
    clear(details);
    if (!node) { make("p", { text: "not in this graph: " + id, class: "muted" }, details); return; }
    elementsById[id].classList.add("selected");
    const fields = [["name", node.name], ["graph", node.side], ["op", node.op], ["target", node.target], ["module", node.module || "-"],
      ["shape", node.shape ? "[" + node.shape.join(", ") + "]" : "-"], ["dtype", node.dtype || "-"], ["bytes", bytes(node.bytes)], ["gact role", node.role || "-"]];
    const row = graph && currentGraph().rows.find((r) => r.source === node.name || r.name === node.name);
    if (row) fields.push(["saved as", row.stored], ["bits", row.bits === null ? "-" : row.bits],
      ["backward use", row.use || "-"], ["why these bits", row.why || "-"], ["groups", row.groups || "-"],
      ["sensitivity", row.sensitivity === null ? "-" : Number(row.sensitivity).toPrecision(3)],
      ["bytes before / after", bytes(row.before) + " / " + bytes(row.after)]);
    const list = make("dl", { id: "node-details" }, details);
    for (const [key, value] of fields) { make("dt", { text: key }, list); make("dd", { text: String(value) }, list); }
    if (center) zoomTo([id]);
  }

  function search(text) {
    matches = [];
    const query = text.trim().toLowerCase();
    for (const [id, element] of Object.entries(elementsById)) {
      const node = nodesById[id];
      const hit = query !== "" && (node.name + " " + node.target + " " + node.module).toLowerCase().includes(query);
      element.classList.toggle("match", hit);
      if (hit) matches.push(id);
    }
    matchIndex = -1;
    document.getElementById("match-count").textContent = query ? matches.length + " match(es)" : "";
  }

  function nextMatch() {
    if (!matches.length) return;
    matchIndex = (matchIndex + 1) % matches.length;
    selectNode(matches[matchIndex], true);
  }

  function enablePanZoom() {
    const svg = document.querySelector("#canvas svg");
    let dragging = null;
    svg.addEventListener("wheel", (event) => {
      event.preventDefault();
      const rect = svg.getBoundingClientRect();
      const fx = (event.clientX - rect.left) / rect.width, fy = (event.clientY - rect.top) / rect.height;
      const scale = event.deltaY > 0 ? 1.2 : 1 / 1.2;
      const [x, y, w, h] = view;
      setView([x + fx * w * (1 - scale), y + fy * h * (1 - scale), w * scale, h * scale]);
    }, { passive: false });
    svg.addEventListener("mousedown", (event) => { dragging = { x: event.clientX, y: event.clientY, view: view.slice() }; });
    window.addEventListener("mouseup", () => { dragging = null; });
    window.addEventListener("mousemove", (event) => {
      if (!dragging) return;
      const rect = svg.getBoundingClientRect();
      const [x, y, w, h] = dragging.view;
      setView([x - (event.clientX - dragging.x) * w / rect.width, y - (event.clientY - dragging.y) * h / rect.height, w, h]);
    });
    document.getElementById("zoom-in").addEventListener("click", () => { const [x, y, w, h] = view; setView([x + w * 0.1, y + h * 0.1, w * 0.8, h * 0.8]); });
    document.getElementById("zoom-out").addEventListener("click", () => { const [x, y, w, h] = view; setView([x - w * 0.125, y - h * 0.125, w * 1.25, h * 1.25]); });
    document.getElementById("zoom-fit").addEventListener("click", () => setView([-10, -10, graph.width, graph.height]));
    const input = document.getElementById("search");
    input.addEventListener("input", () => search(input.value));
    input.addEventListener("keydown", (event) => { if (event.key === "Enter") nextMatch(); });
  }

  let selected = 0;
  function currentGraph() { return data.graphs[selected]; }
  function select(index) {
    selected = index;
    for (const button of document.querySelectorAll("#tabs button")) button.classList.toggle("active", Number(button.dataset.graph) === index);
    const g = currentGraph();
    document.getElementById("graph-summary").textContent = g.summary;
    document.getElementById("graph-passes").textContent = g.passes.length ? "Passes: " + g.passes.join("; ") : "";
    renderTimeline(g); renderTable(g); renderGraph(g); renderModules(g);
    search(document.getElementById("search").value);
  }

  renderHeader();
  enablePanZoom();
  if (data.graphs.length) select(0);
  else document.getElementById("graph-summary").textContent = "No training graph was compiled.";
  document.body.dataset.ready = "true";
})();
