/* bertology attention viewer: head view, model view and base / tuned / diff modes.
 * Vanilla JS, no eval, no network: it runs from file://, under the report's CSP
 * (script-src 'unsafe-inline') and in notebooks. Defined once per page (window.BertologyViewer);
 * every fragment calls mount(id) on its own container, whose data is the JSON island "<id>-data".
 * Conventions: layers 1..N, heads 0-based, labels L{layer}H{head}; diff = second model - first. */
(function () {
  "use strict";
  if (window.BertologyViewer) { return; }

  var ROW = 20;              // px per token row in the head view
  var GAP = 150;             // px between the query and key columns
  var MIN_ALPHA = 0.01;      // fainter lines are invisible anyway; skipping them keeps the DOM small
  var MAX_CHARS = 18;        // longer tokens are shortened on screen (full text in the tooltip)
  var LO = [255, 255, 255], HI = [16, 58, 120];           // weight ramp of the thumbnails
  var POS = [190, 40, 45], NEG = [30, 100, 175];          // diff: tuned attends more / less
  var FILTERS = [["all", "all pairs"], ["AA", "A \u2192 A"], ["AB", "A \u2192 B"], ["BA", "B \u2192 A"], ["BB", "B \u2192 B"]];

  // The SVG namespace, read from a parsed element (so the page carries no URL string).
  var probe = document.createElement("div");
  probe.innerHTML = "<svg></svg>";
  var SVGNS = probe.firstChild.namespaceURI;

  function h(tag, attrs, text) {
    var e = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) { e.setAttribute(k, attrs[k]); });
    if (text !== undefined) { e.textContent = text; }
    return e;
  }
  function s(tag, attrs) {
    var e = document.createElementNS(SVGNS, tag);
    Object.keys(attrs || {}).forEach(function (k) { e.setAttribute(k, attrs[k]); });
    return e;
  }
  function range(n) { var a = []; for (var i = 0; i < n; i++) { a.push(i); } return a; }
  function rgb(c) { return "rgb(" + c[0] + "," + c[1] + "," + c[2] + ")"; }
  function mix(a, b, t) { return [0, 1, 2].map(function (i) { return Math.round(a[i] + (b[i] - a[i]) * t); }); }
  function headColour(head) { return "hsl(" + Math.round((head * 137.508) % 360) + ",68%,42%)"; }
  function shown(tok) {
    var t = tok.replace(/^[\u0120\u2581]/, "") || tok;  // RoBERTa/SentencePiece word-start marks
    return t.length > MAX_CHARS ? t.slice(0, MAX_CHARS - 1) + "\u2026" : t;
  }
  function fmt(x) { return (x > 0 ? "+" : "") + x.toFixed(3); }

  function Viewer(root, data) {
    this.root = root;
    this.d = data;
    this.n = data.tokens.length;
    this.L = data.n_layers;
    this.H = data.n_heads;
    this.names = data.models.map(function (m) { return m.name; });
    this.compare = this.names.length === 2;
    this.pair = data.segments.indexOf(1) >= 0;
    this.cache = {};
    this.scale = 1;
    this.identical = false;
    var start = { layer: 1, heads: range(this.H) };
    if (this.compare) {
      var best = this.diffSummary();
      if (best.max > 0) { this.scale = best.max; start = { layer: best.layer, heads: [best.head] }; } else { this.identical = true; }
    }
    this.st = {
      mode: this.compare ? "diff" : this.names[0],
      layer: start.layer, heads: start.heads, filter: "all", hover: null
    };
    this.build();
    this.drawThumbs();
    this.update();
  }

  Viewer.prototype = {
    // [query][key] matrix of layer l (1-based), head hd, in a mode (a model name or "diff").
    matrix: function (mode, l, hd) {
      var att = this.d.attention;
      if (mode !== "diff") { return att[mode][l - 1][hd]; }
      var key = l + ":" + hd;
      if (!this.cache[key]) {
        var a = att[this.names[0]][l - 1][hd], b = att[this.names[1]][l - 1][hd];
        this.cache[key] = b.map(function (row, i) { return row.map(function (x, j) { return x - a[i][j]; }); });
      }
      return this.cache[key];
    },
    // Largest |diff| anywhere (the colour scale) and the head whose map changed most (the start view).
    diffSummary: function () {
      var best = { max: 0, total: -1, layer: 1, head: 0 };
      for (var l = 1; l <= this.L; l++) {
        for (var hd = 0; hd < this.H; hd++) {
          var m = this.matrix("diff", l, hd), total = 0;
          m.forEach(function (row) { row.forEach(function (x) { var a = Math.abs(x); total += a; if (a > best.max) { best.max = a; } }); });
          if (total > best.total) { best.total = total; best.layer = l; best.head = hd; }
        }
      }
      return best;
    },

    build: function () {
      var self = this, root = this.root, st = this.st;
      root.textContent = "";
      var meta = this.d.models.map(function (m) { return m.name + ": " + m.model; }).join("   \u00b7   ");
      root.appendChild(h("div", { "class": "bv-meta" }, this.compare ? meta : "model: " + this.d.models[0].model));

      var bar = root.appendChild(h("div", { "class": "bv-bar" }));
      if (this.compare) {
        var modes = bar.appendChild(h("div", { "class": "bv-field bv-modes", role: "group", "aria-label": "Mode" }));
        this.names.concat(["diff"]).forEach(function (m) {
          var label = m === "diff" ? "diff (" + self.names[1] + " \u2212 " + self.names[0] + ")" : m;
          var b = modes.appendChild(h("button", { type: "button", "class": "bv-mode", "data-role": "mode", "data-mode": m }, label));
          b.addEventListener("click", function () { st.mode = m; self.drawThumbs(); self.update(); });
        });
      }
      var lf = bar.appendChild(h("label", { "class": "bv-field" }));
      lf.appendChild(h("span", { "class": "bv-label" }, "Layer"));
      this.layerSelect = lf.appendChild(h("select", { "data-role": "layer" }));
      range(this.L).forEach(function (i) {
        self.layerSelect.appendChild(h("option", { value: String(i + 1) }, String(i + 1)));
      });
      this.layerSelect.addEventListener("change", function () { st.layer = +self.layerSelect.value; self.update(); });
      if (this.pair) {
        var ff = bar.appendChild(h("label", { "class": "bv-field" }));
        ff.appendChild(h("span", { "class": "bv-label" }, "Sentences"));
        this.filterSelect = ff.appendChild(h("select", { "data-role": "pair-filter" }));
        FILTERS.forEach(function (f) { self.filterSelect.appendChild(h("option", { value: f[0] }, f[1])); });
        this.filterSelect.addEventListener("change", function () { st.filter = self.filterSelect.value; self.update(); });
      }
      var hf = bar.appendChild(h("div", { "class": "bv-field bv-heads", role: "group", "aria-label": "Heads" }));
      hf.appendChild(h("span", { "class": "bv-label" }, "Heads"));
      this.chips = range(this.H).map(function (hd) {
        var c = hf.appendChild(h("button", { type: "button", "class": "bv-chip", "data-role": "chip", "data-head": String(hd), title: "head " + hd }, String(hd)));
        c.style.setProperty("--c", headColour(hd));
        c.addEventListener("click", function () {
          var i = st.heads.indexOf(hd);
          if (i >= 0) { st.heads.splice(i, 1); } else { st.heads.push(hd); st.heads.sort(function (a, b) { return a - b; }); }
          self.update();
        });
        return c;
      });
      [["all-heads", "all", function () { return range(self.H); }], ["no-heads", "none", function () { return []; }]].forEach(function (x) {
        var b = hf.appendChild(h("button", { type: "button", "class": "bv-small", "data-role": x[0] }, x[1]));
        b.addEventListener("click", function () { st.heads = x[2](); self.update(); });
      });

      var body = root.appendChild(h("div", { "class": "bv-body" }));
      var hp = body.appendChild(h("div", { "class": "bv-panel" }));
      hp.appendChild(h("div", { "class": "bv-title" }, "Head view"));
      hp.appendChild(h("div", { "class": "bv-hint" }, "queries (from) \u2192 keys (to); hover a token"));
      this.buildHeadView(hp.appendChild(h("div", { "class": "bv-scroll" })));
      this.readout = hp.appendChild(h("div", { "class": "bv-readout", "data-role": "readout" }, "\u00a0"));
      this.readout.style.maxWidth = Math.max(240, 2 * this.x1 + GAP) + "px";  // wrap rather than widen the panel
      var mp = body.appendChild(h("div", { "class": "bv-panel" }));
      mp.appendChild(h("div", { "class": "bv-title" }, "Model view"));
      mp.appendChild(h("div", { "class": "bv-hint" }, "rows: layers, columns: heads; click one to select it"));
      this.buildModelView(mp.appendChild(h("div", { "class": "bv-scroll" })));
      this.legend = root.appendChild(h("div", { "class": "bv-legend", "data-role": "legend" }));
      root.setAttribute("data-mounted", "1");
    },

    buildHeadView: function (box) {
      var self = this, d = this.d;
      var longest = d.tokens.reduce(function (m, t) { return Math.max(m, shown(t).length); }, 3);
      var colW = Math.min(150, 16 + 7.6 * longest);
      this.x1 = colW;
      this.x2 = colW + GAP;
      var svg = box.appendChild(s("svg", {
        "class": "bv-svg", width: 2 * colW + GAP, height: this.n * ROW + 8, "data-role": "head-view"
      }));
      this.lines = s("g", { "class": "bv-lines" });
      this.tokens = { from: [], to: [] };
      [["from", 0, "end", colW - 6], ["to", this.x2, "start", this.x2 + 6]].forEach(function (side) {
        d.tokens.forEach(function (tok, i) {
          var cls = "bv-tok" + (d.segments[i] === 1 ? " seg-b" : "") + (d.special[i] ? " special" : "");
          var g = svg.appendChild(s("g", { "class": cls, "data-role": "token", "data-side": side[0], "data-index": String(i) }));
          g.appendChild(s("rect", { x: side[1], y: 4 + i * ROW, width: colW, height: ROW - 2, rx: 3 }));
          var t = g.appendChild(s("text", { x: side[3], y: 4 + i * ROW + ROW / 2 + 1, "text-anchor": side[2], "dominant-baseline": "middle" }));
          t.textContent = shown(tok);
          g.appendChild(s("title", {})).textContent = tok + " (" + (d.segments[i] ? "B" : "A") + ", position " + i + ")";
          g.addEventListener("mouseenter", function () { self.st.hover = { side: side[0], index: i }; self.update(); });
          g.addEventListener("mouseleave", function () { self.st.hover = null; self.update(); });
          self.tokens[side[0]].push(g);
        });
      });
      svg.insertBefore(this.lines, svg.firstChild);
    },

    buildModelView: function (box) {
      var self = this;
      // Long texts get larger, smoothed thumbnails (nearest-neighbour shrinking would drop rows).
      var grid = box.appendChild(h("div", { "class": "bv-grid" + (this.n > 40 ? " bv-dense" : ""), "data-role": "model-view" }));
      grid.style.gridTemplateColumns = "max-content repeat(" + this.H + ", max-content)";
      grid.appendChild(h("span"));
      range(this.H).forEach(function (hd) { grid.appendChild(h("span", { "class": "bv-axis" }, "H" + hd)); });
      this.thumbs = [];
      this.rowLabels = [];
      range(this.L).forEach(function (li) {
        var l = li + 1;
        self.rowLabels.push(grid.appendChild(h("span", { "class": "bv-axis bv-row" }, "L" + l)));
        range(self.H).forEach(function (hd) {
          var c = grid.appendChild(h("canvas", {
            "class": "bv-thumb", width: self.n, height: self.n, tabindex: "0", role: "button",
            "data-role": "thumb", "data-layer": String(l), "data-head": String(hd), "aria-label": "L" + l + "H" + hd
          }));
          var pick = function () { self.st.layer = l; self.st.heads = [hd]; self.st.hover = null; self.update(); };
          c.addEventListener("click", pick);
          c.addEventListener("keydown", function (ev) { if (ev.key === "Enter" || ev.key === " ") { ev.preventDefault(); pick(); } });
          self.thumbs.push(c);
        });
      });
    },

    drawThumbs: function () {
      var self = this, mode = this.st.mode, n = this.n, diff = mode === "diff";
      this.thumbs.forEach(function (c) {
        var l = +c.getAttribute("data-layer"), hd = +c.getAttribute("data-head");
        var m = self.matrix(mode, l, hd), ctx = c.getContext("2d"), img = ctx.createImageData(n, n), peak = 0;
        for (var i = 0; i < n; i++) {
          for (var j = 0; j < n; j++) {
            var x = m[i][j], col;
            if (diff) {
              peak = Math.max(peak, Math.abs(x));
              col = mix(LO, x >= 0 ? POS : NEG, Math.min(1, Math.abs(x) / self.scale));
            } else {
              col = mix(LO, HI, Math.min(1, Math.max(0, x)));
            }
            var p = 4 * (i * n + j);
            img.data[p] = col[0]; img.data[p + 1] = col[1]; img.data[p + 2] = col[2]; img.data[p + 3] = 255;
          }
        }
        ctx.putImageData(img, 0, 0);
        c.title = "L" + l + "H" + hd + (diff ? "  max |\u0394| = " + peak.toFixed(3) : "") + "  (click to show)";
      });
    },

    drawLines: function () {
      var st = this.st, d = this.d, n = this.n, diff = st.mode === "diff", scale = this.scale;
      var x1 = this.x1, x2 = this.x2, frag = document.createDocumentFragment(), count = 0;
      var want = st.filter === "all" ? null : [st.filter.charAt(0) === "B" ? 1 : 0, st.filter.charAt(1) === "B" ? 1 : 0];
      var self = this;
      st.heads.forEach(function (hd) {
        var m = self.matrix(st.mode, st.layer, hd), colour = headColour(hd);
        for (var i = 0; i < n; i++) {
          if (st.hover && st.hover.side === "from" && st.hover.index !== i) { continue; }
          if (want && d.segments[i] !== want[0]) { continue; }
          for (var j = 0; j < n; j++) {
            if (st.hover && st.hover.side === "to" && st.hover.index !== j) { continue; }
            if (want && d.segments[j] !== want[1]) { continue; }
            var w = m[i][j], alpha = diff ? Math.abs(w) / scale : w;
            if (alpha < MIN_ALPHA) { continue; }
            frag.appendChild(s("line", {
              x1: x1, y1: 4 + i * ROW + ROW / 2, x2: x2, y2: 4 + j * ROW + ROW / 2,
              stroke: diff ? rgb(w > 0 ? POS : NEG) : colour, "stroke-opacity": Math.min(1, alpha).toFixed(3),
              "data-role": "line", "data-head": hd, "data-from": i, "data-to": j
            }));
            count++;
          }
        }
      });
      this.lines.textContent = "";
      this.lines.appendChild(frag);
      return count;
    },

    // The strongest links of the hovered token for the first selected head, as text.
    readoutText: function () {
      var st = this.st, d = this.d;
      if (!st.hover || !st.heads.length) { return "\u00a0"; }
      var hd = st.heads[0], m = this.matrix(st.mode, st.layer, hd), k = st.hover.index, from = st.hover.side === "from";
      var pairs = range(this.n).map(function (o) { return [o, from ? m[k][o] : m[o][k]]; });
      pairs.sort(function (a, b) { return Math.abs(b[1]) - Math.abs(a[1]); });
      var diff = st.mode === "diff";
      var top = pairs.slice(0, 4).map(function (p) { return shown(d.tokens[p[0]]) + " " + (diff ? fmt(p[1]) : p[1].toFixed(3)); });
      return "L" + st.layer + "H" + hd + " \u00b7 " + shown(d.tokens[k]) + (from ? " attends to: " : " is attended by: ") + top.join(", ");
    },

    update: function () {
      var st = this.st, root = this.root, self = this;
      this.layerSelect.value = String(st.layer);
      if (this.filterSelect) { this.filterSelect.value = st.filter; }
      this.chips.forEach(function (c, hd) { c.setAttribute("aria-pressed", st.heads.indexOf(hd) >= 0 ? "true" : "false"); });
      root.querySelectorAll("[data-role=mode]").forEach(function (b) {
        b.setAttribute("aria-pressed", b.getAttribute("data-mode") === st.mode ? "true" : "false");
      });
      this.thumbs.forEach(function (c) {
        var on = +c.getAttribute("data-layer") === st.layer && st.heads.indexOf(+c.getAttribute("data-head")) >= 0;
        c.classList.toggle("sel", on);
      });
      this.rowLabels.forEach(function (r, i) { r.classList.toggle("cur", i + 1 === st.layer); });
      ["from", "to"].forEach(function (side) {
        self.tokens[side].forEach(function (g, i) { g.classList.toggle("hover", !!st.hover && st.hover.side === side && st.hover.index === i); });
      });
      var count = this.drawLines();
      var labels = st.heads.map(function (hd) { return "L" + st.layer + "H" + hd; });
      root.setAttribute("data-selected", labels.length ? labels.join(" ") : "L" + st.layer);
      root.setAttribute("data-layer", String(st.layer));
      root.setAttribute("data-heads", st.heads.join(","));
      root.setAttribute("data-mode", st.mode);
      root.setAttribute("data-filter", st.filter);
      root.setAttribute("data-hover", st.hover ? st.hover.side + ":" + st.hover.index : "");
      root.setAttribute("data-lines", String(count));
      this.readout.textContent = this.readoutText();
      this.legend.textContent = this.legendText();
    },

    legendText: function () {
      var st = this.st;
      var seg = this.pair ? " Sentence B tokens have a tinted background." : "";
      if (st.mode !== "diff") {
        return "Showing " + st.mode + ". Line opacity = attention weight (each query row sums to 1); one colour per head." + seg;
      }
      if (this.identical) {
        return "Diff: the two models' attention weights are identical on this text." + seg;
      }
      return "Diff " + this.names[1] + " \u2212 " + this.names[0] + ": red = " + this.names[1] + " attends more, blue = less; " +
        "full colour = \u00b1" + this.scale.toFixed(3) + " (the largest change anywhere in the model)." + seg;
    }
  };

  function mount(id, tries) {
    var root = document.getElementById(id), island = document.getElementById(id + "-data");
    if (!root || !island) {  // notebooks may insert the output after running its script
      if ((tries || 0) < 50) { window.requestAnimationFrame(function () { mount(id, (tries || 0) + 1); }); }
      return null;
    }
    if (root.getAttribute("data-mounted")) { return null; }
    return new Viewer(root, JSON.parse(island.textContent));
  }

  window.BertologyViewer = { mount: mount, version: 1 };
})();
