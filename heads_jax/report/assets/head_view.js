(function () {
  "use strict";
  var holder = document.getElementById("hv-data");
  if (!holder) { return; }
  var data = JSON.parse(holder.textContent);
  var Q = data.quantization || 255;
  var heads = {};
  data.heads.forEach(function (h) { heads[h.layer + ":" + h.head] = h; });
  var state = { key: null, ex: 0, mode: "lines" };
  var SVGNS = "http://www.w3.org/2000/svg";

  function el(name, attrs, text) {
    var e = document.createElementNS(SVGNS, name);
    for (var k in attrs) { e.setAttribute(k, attrs[k]); }
    if (text !== undefined) { e.textContent = text; }
    return e;
  }
  function decode(b64, n) {
    var s = atob(b64), a = new Float32Array(n * n);
    for (var i = 0; i < n * n; i++) { a[i] = s.charCodeAt(i) / Q; }
    return a;
  }
  function fmt(v) { return v.toFixed(3); }
  function status(text) { document.getElementById("hv-status").textContent = text; }

  function select(key) {
    if (!heads[key]) { return; }
    state.key = key; state.ex = 0;
    document.querySelectorAll(".hv-pick [data-head]").forEach(function (e) {
      e.classList.toggle("hv-sel", e.getAttribute("data-head") === key);
    });
    render();
  }

  function button(label, on, handler) {
    var b = document.createElement("button");
    b.textContent = label;
    if (on) { b.className = "on"; }
    b.addEventListener("click", handler);
    return b;
  }

  function render() {
    var h = heads[state.key];
    var title = document.getElementById("hv-title");
    var controls = document.getElementById("hv-controls");
    var view = document.getElementById("hv-view");
    controls.innerHTML = ""; view.innerHTML = ""; status("");
    title.textContent = "Layer " + h.layer + ", head " + h.head + ": " +
      (h.roles.length ? (h.assigned ? "roles " : "no role; strongest ") + h.roles.join(", ") : "no role");
    if (!h.examples.length) {
      view.textContent = "No sequence has a score for this head's roles.";
      return;
    }
    h.examples.forEach(function (x, i) {
      controls.appendChild(button("example " + (i + 1) + ": " + x.role + " " + x.score.toFixed(2),
        i === state.ex, function () { state.ex = i; render(); }));
    });
    controls.appendChild(document.createElement("br"));
    ["lines", "heatmap"].forEach(function (m) {
      controls.appendChild(button(m, state.mode === m, function () { state.mode = m; render(); }));
    });
    var x = h.examples[state.ex];
    var seq = data.sequences[x.sequence];
    var n = seq.tokens.length;
    var a = decode(x.map, n);
    view.appendChild(state.mode === "lines" ? lines(seq.tokens, a, n) : heatmap(seq.tokens, a, n));
  }

  function lines(tokens, a, n) {
    var row = 17, top = 36, left = 150, right = 330, w = 480;
    var svg = el("svg", { width: w, height: top + n * row + 8, "class": "hv-lines" });
    svg.appendChild(el("text", { x: left, y: 12, "text-anchor": "end" }, "query"));
    svg.appendChild(el("text", { x: right, y: 12 }, "key"));
    var g = el("g", {});
    svg.appendChild(g);
    var qs = [], ks = [], vals = [];
    for (var t = 0; t < n; t++) {
      for (var s = 0; s < n; s++) {
        var v = a[t * n + s];
        if (v < 0.01) { continue; }
        var ln = el("line", { x1: left + 6, y1: top + t * row - 4, x2: right - 6, y2: top + s * row - 4,
          stroke: "#2166ac", "stroke-width": 2, "stroke-opacity": Math.min(1, v) });
        ln.setAttribute("data-q", t); ln.setAttribute("data-k", s);
        g.appendChild(ln);
      }
    }
    function show(side, i) {
      g.querySelectorAll("line").forEach(function (ln) {
        ln.classList.toggle("dim", ln.getAttribute(side) !== String(i));
      });
    }
    function clear() {
      g.querySelectorAll("line").forEach(function (ln) { ln.classList.remove("dim"); });
      qs.concat(ks).forEach(function (e) { e.classList.remove("hl"); });
      vals.forEach(function (e) { e.textContent = ""; });
      status("");
    }
    for (var i = 0; i < n; i++) {
      var q = el("text", { x: left, y: top + i * row, "text-anchor": "end" }, tokens[i]);
      var k = el("text", { x: right, y: top + i * row }, tokens[i]);
      var val = el("text", { x: w - 6, y: top + i * row, "text-anchor": "end", fill: "#555" }, "");
      q.setAttribute("data-i", i); k.setAttribute("data-i", i);
      qs.push(q); ks.push(k); vals.push(val);
      svg.appendChild(q); svg.appendChild(k); svg.appendChild(val);
      q.addEventListener("mouseenter", function (ev) {
        var t = +ev.target.getAttribute("data-i");
        show("data-q", t); ev.target.classList.add("hl");
        for (var s = 0; s < n; s++) { vals[s].textContent = fmt(a[t * n + s]); }
        status("attention from query " + t + " '" + tokens[t] + "' to each key (right)");
      });
      k.addEventListener("mouseenter", function (ev) {
        var s = +ev.target.getAttribute("data-i");
        show("data-k", s); ev.target.classList.add("hl");
        status("attention to key " + s + " '" + tokens[s] + "' from each query");
      });
      q.addEventListener("mouseleave", clear); k.addEventListener("mouseleave", clear);
    }
    return svg;
  }

  function heatmap(tokens, a, n) {
    var c = Math.max(6, Math.min(16, Math.floor(520 / n))), lab = 110;
    var svg = el("svg", { width: lab + n * c + 10, height: lab + n * c + 10, "class": "hv-heatmap" });
    var rows = [], cols = [];
    for (var i = 0; i < n; i++) {
      var r = el("text", { x: lab - 4, y: lab + i * c + c * 0.75, "text-anchor": "end" }, tokens[i]);
      var x = lab + i * c + c * 0.7;
      var k = el("text", { x: x, y: lab - 4, transform: "rotate(-60 " + x + " " + (lab - 4) + ")" }, tokens[i]);
      rows.push(r); cols.push(k); svg.appendChild(r); svg.appendChild(k);
    }
    var g = el("g", {});
    svg.appendChild(g);
    for (var t = 0; t < n; t++) {
      for (var s = 0; s < n; s++) {
        var v = a[t * n + s];
        var cell = el("rect", { x: lab + s * c, y: lab + t * c, width: c, height: c,
          fill: "rgb(" + Math.round(255 - 222 * v) + "," + Math.round(255 - 153 * v) + "," + Math.round(255 - 83 * v) + ")" });
        cell.setAttribute("data-q", t); cell.setAttribute("data-k", s);
        g.appendChild(cell);
      }
    }
    g.addEventListener("mouseover", function (ev) {
      var q = ev.target.getAttribute("data-q"), k = ev.target.getAttribute("data-k");
      if (q === null) { return; }
      rows.forEach(function (e, i) { e.classList.toggle("hl", String(i) === q); });
      cols.forEach(function (e, i) { e.classList.toggle("hl", String(i) === k); });
      status("query " + q + " '" + tokens[+q] + "' -> key " + k + " '" + tokens[+k] + "': " + fmt(a[+q * n + +k]));
    });
    g.addEventListener("mouseleave", function () {
      rows.concat(cols).forEach(function (e) { e.classList.remove("hl"); });
      status("");
    });
    return svg;
  }

  document.querySelectorAll(".hv-pick [data-head]").forEach(function (e) {
    e.addEventListener("click", function () { select(e.getAttribute("data-head")); });
  });
  var m = /head=(\d+:\d+)/.exec(window.location.hash || "");
  if (m) { select(m[1]); }
})();
