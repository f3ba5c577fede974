
(function () {
  "use strict";

  function make(tag, cls, text) {
    var node = document.createElement(tag);
    if (cls) { node.className = cls; }
    if (text !== undefined && text !== null) { node.textContent = String(text); }
    return node;
  }

  var num = attnlabWeights.num;

  var fmt = attnlabWeights.fmt;

  // the full value, only for the data-weight attributes (not shown)
  function exact(v) { v = num(v); return isNaN(v) ? "n/a" : String(v); }

  var maxOf = attnlabWeights.scale;

  function Viewer(root, data) {
    this.root = root;
    this.data = data;
    this.heat = data.heat || [204, 17, 102];
    this.state = { mech: 0, seed: 0, ex: 0, row: 0, cmp: -1 };
    this.readoutText = "";
    this.build();
    this.render();
  }

  Viewer.prototype.colour = function (t) {
    t = num(t);
    if (isNaN(t)) { t = 0; }
    t = Math.max(0, Math.min(1, t));
    var h = this.heat;
    return "rgb(" + Math.round(255 + (h[0] - 255) * t) + "," +
      Math.round(255 + (h[1] - 255) * t) + "," + Math.round(255 + (h[2] - 255) * t) + ")";
  };

  Viewer.prototype.shade = function (node, t) {
    node.style.background = this.colour(t);
    node.style.color = t > 0.6 ? "#ffffff" : "#1e1e1e";
  };

  Viewer.prototype.build = function () {
    var self = this;
    var root = this.root;
    root.textContent = "";
    var bar = make("div", "viewer-bar");
    function labelled(text, control) {
      var lab = make("label", "", text + " ");
      lab.appendChild(control);
      bar.appendChild(lab);
      return control;
    }
    this.mechSelect = labelled("mechanism", make("select"));
    this.mechSelect.id = "viewer-mechanism";
    this.data.mechanisms.forEach(function (m, i) {
      var opt = make("option", "", m.label);
      opt.value = String(i);
      self.mechSelect.appendChild(opt);
    });
    this.seedSelect = labelled("seed", make("select"));
    this.seedSelect.id = "viewer-seed";
    this.prevButton = make("button", "", "\u25c0");
    this.prevButton.id = "viewer-prev";
    this.prevButton.type = "button";
    this.prevButton.title = "previous example";
    this.pos = make("span", "pos");
    this.pos.id = "viewer-pos";
    this.nextButton = make("button", "", "\u25b6");
    this.nextButton.id = "viewer-next";
    this.nextButton.type = "button";
    this.nextButton.title = "next example";
    var nav = make("span");
    nav.appendChild(make("span", "", "example "));
    nav.appendChild(this.prevButton);
    nav.appendChild(this.pos);
    nav.appendChild(this.nextButton);
    bar.appendChild(nav);
    this.cmpSelect = labelled("compare with", make("select"));
    this.cmpSelect.id = "viewer-compare";
    var none = make("option", "", "(none)");
    none.value = "-1";
    this.cmpSelect.appendChild(none);
    this.data.mechanisms.forEach(function (m, i) {
      var opt = make("option", "", m.label);
      opt.value = String(i);
      self.cmpSelect.appendChild(opt);
    });
    root.appendChild(bar);
    this.readout = make("div", "viewer-readout", "hover or click a token or cell for its weight");
    this.readout.id = "viewer-readout";
    root.appendChild(this.readout);
    this.panels = make("div", "viewer-panels");
    root.appendChild(this.panels);

    this.mechSelect.addEventListener("change", function () {
      self.state.mech = parseInt(self.mechSelect.value, 10) || 0;
      self.state.seed = 0;
      self.state.row = 0;
      self.render();
    });
    this.seedSelect.addEventListener("change", function () {
      self.state.seed = parseInt(self.seedSelect.value, 10) || 0;
      self.state.row = 0;
      self.render();
    });
    this.cmpSelect.addEventListener("change", function () {
      self.state.cmp = parseInt(self.cmpSelect.value, 10);
      if (isNaN(self.state.cmp)) { self.state.cmp = -1; }
      self.render();
    });
    this.prevButton.addEventListener("click", function () { self.step(-1); });
    this.nextButton.addEventListener("click", function () { self.step(1); });
  };

  Viewer.prototype.run = function () {
    var m = this.data.mechanisms[this.state.mech];
    return m.runs[Math.min(this.state.seed, m.runs.length - 1)];
  };

  Viewer.prototype.step = function (delta) {
    var n = this.run().examples.length;
    this.state.ex = ((this.state.ex + delta) % n + n) % n;
    this.state.row = 0;
    this.render();
  };

  Viewer.prototype.show = function (text) {
    this.readoutText = text;
    this.readout.textContent = text;
    this.root.setAttribute("data-readout", text);
  };

  Viewer.prototype.tell = function (what, weight) {
    this.show(what + ": " + fmt(weight));
  };

  // The example of mechanism ``mi`` that matches the main one (same seed, same title, or
  // the same index).
  Viewer.prototype.counterpart = function (mi, example) {
    var m = this.data.mechanisms[mi];
    var seed = this.run().seed;
    var run = m.runs[0];
    for (var i = 0; i < m.runs.length; i++) {
      if (m.runs[i].seed === seed) { run = m.runs[i]; break; }
    }
    for (var j = 0; j < run.examples.length; j++) {
      if (run.examples[j].title === example.title) { return { run: run, ex: run.examples[j] }; }
    }
    var k = Math.min(this.state.ex, run.examples.length - 1);
    return { run: run, ex: run.examples[k] };
  };

  Viewer.prototype.render = function () {
    var self = this;
    var st = this.state;
    var mech = this.data.mechanisms[st.mech];
    this.mechSelect.value = String(st.mech);
    this.seedSelect.textContent = "";
    mech.runs.forEach(function (r, i) {
      var opt = make("option", "", r.seed === null || r.seed === undefined ? r.run_id : r.seed);
      opt.value = String(i);
      self.seedSelect.appendChild(opt);
    });
    st.seed = Math.min(st.seed, mech.runs.length - 1);
    this.seedSelect.value = String(st.seed);
    var run = this.run();
    if (st.ex >= run.examples.length) { st.ex = 0; }
    var example = run.examples[st.ex];
    this.pos.textContent = (st.ex + 1) + " / " + run.examples.length;
    this.panels.textContent = "";
    this.panels.appendChild(this.panel(mech.label, run, example, true));
    if (st.cmp >= 0 && st.cmp !== st.mech && st.cmp < this.data.mechanisms.length) {
      var other = this.counterpart(st.cmp, example);
      this.panels.appendChild(
        this.panel(this.data.mechanisms[st.cmp].label, other.run, other.ex, false));
    }
    var root = this.root;
    root.setAttribute("data-mechanism", mech.label);
    root.setAttribute("data-seed", String(run.seed));
    root.setAttribute("data-example", String(st.ex));
    root.setAttribute("data-row", String(st.row));
    root.setAttribute("data-compare", st.cmp >= 0 ? this.data.mechanisms[st.cmp].label : "");
    root.setAttribute("data-title", example.title || "");
  };

  Viewer.prototype.panel = function (label, run, example, main) {
    var box = make("div", "viewer-panel");
    box.setAttribute("data-role", main ? "main" : "compare");
    box.setAttribute("data-kind", example.kind);
    var seed = run.seed === null || run.seed === undefined ? "" : " \u00b7 seed " + run.seed;
    box.appendChild(make("h4", "", label + seed + " \u00b7 " + (example.title || "")));
    var meta = [];
    if (example.label !== null && example.label !== undefined) { meta.push("gold: " + example.label); }
    if (example.prediction !== null && example.prediction !== undefined) {
      meta.push("predicted: " + example.prediction);
    }
    if (meta.length) { box.appendChild(make("div", "meta", meta.join(" \u00b7 "))); }
    var body = make("div", "vbody");
    try {
      if (example.kind === "image") {
        this.drawImage(body, example);
      } else if (example.kind === "matrix") {
        this.drawMatrix(body, example);
      } else {
        this.drawTokens(body, example);
      }
      this.drawViews(body, example.views || {});
    } catch (err) {
      body.appendChild(make("p", "muted", "cannot draw this example: " + err));
    }
    box.appendChild(body);
    var extra = example.extra || {};
    var keys = Object.keys(extra);
    if (keys.length) {
      box.appendChild(make("div", "meta", keys.map(function (k) {
        var v = extra[k];
        return k + ": " + (typeof v === "string" ? v : JSON.stringify(v));
      }).join(", ")));
    }
    return box;
  };

  // A line of shaded tokens (relative to the line's largest weight); hover or click one
  // for its weight.
  Viewer.prototype.tokenLine = function (tokens, weights, what) {
    var self = this;
    var p = make("p", "vtokens");
    var scale = maxOf(weights);
    tokens.forEach(function (tok, i) {
      var w = weights[i];
      var span = make("span", "vtok", tok);
      self.shade(span, num(w) / scale);
      span.title = fmt(w);
      span.setAttribute("data-weight", exact(w));
      var name = (what ? what + " \u00b7 " : "") + "\u201c" + tok + "\u201d";
      span.addEventListener("mouseenter", function () { self.tell(name, w); });
      span.addEventListener("click", function () {
        var picked = self.root.querySelectorAll(".vtok.picked");
        Array.prototype.forEach.call(picked, function (n) { n.classList.remove("picked"); });
        span.classList.add("picked");
        self.tell(name, w);
      });
      p.appendChild(span);
      p.appendChild(document.createTextNode(" "));
    });
    if (attnlabWeights.uniform(weights)) {
      p.appendChild(make("small", "vuniform", "uniform: every weight " + fmt(weights[0])));
    }
    return p;
  };

  // A token line (named ``label`` in its tooltips) with ``label`` in front of it.
  Viewer.prototype.labelledLine = function (tokens, weights, label) {
    var line = this.tokenLine(tokens, weights, label);
    line.insertBefore(make("span", "rowlabel", label), line.firstChild);
    return line;
  };

  Viewer.prototype.drawTokens = function (body, example) {
    var self = this;
    var many = example.weights.length > 1;
    example.weights.forEach(function (row, i) {
      var label = example.rows[i] || "";
      if (many || (label && label !== "attention")) {
        body.appendChild(self.labelledLine(example.cols, row, label));
      } else {
        body.appendChild(self.tokenLine(example.cols, row, label !== "attention" ? label : ""));
      }
    });
  };

  Viewer.prototype.selectRow = function (i) {
    this.state.row = i;
    this.render();
  };

  Viewer.prototype.drawMatrix = function (body, example) {
    var self = this;
    var weights = example.weights;
    var scale = maxOf([].concat.apply([], weights));
    var row = Math.min(this.state.row, weights.length - 1);
    var table = make("table", "vmatrix");
    var head = make("tr");
    head.appendChild(make("th"));
    example.cols.forEach(function (c) { head.appendChild(make("th", "vcol", c)); });
    var thead = make("thead");
    thead.appendChild(head);
    table.appendChild(thead);
    var tbody = make("tbody");
    weights.forEach(function (r, i) {
      var tr = make("tr", i === row ? "selected" : "");
      var th = make("th", "vrow", example.rows[i] || String(i));
      th.title = "click: this row's weights over the columns";
      th.setAttribute("data-row", String(i));
      th.addEventListener("click", function () { self.selectRow(i); });
      tr.appendChild(th);
      r.forEach(function (w, j) {
        var td = make("td", "vcell");
        self.shade(td, num(w) / scale);
        var name = (example.rows[i] || i) + " \u2192 " + (example.cols[j] || j);
        td.title = name + ": " + fmt(w);
        td.setAttribute("data-weight", exact(w));
        td.addEventListener("mouseenter", function () { self.tell(name, w); });
        td.addEventListener("click", function () {
          self.selectRow(i);
          self.tell(name, w);
        });
        tr.appendChild(td);
      });
      tbody.appendChild(tr);
    });
    table.appendChild(tbody);
    body.appendChild(table);
    if (row >= 0 && weights[row]) {
      var view = make("div", "vrowview");
      view.appendChild(make("div", "meta",
        "row \u201c" + (example.rows[row] || row) + "\u201d over the columns:"));
      var line = make("p", "vtokens");
      var rs = maxOf(weights[row]);
      example.cols.forEach(function (c, j) {
        var w = weights[row][j];
        var span = make("span", "vtok", c);
        span.appendChild(make("small", "", fmt(w)));
        self.shade(span, num(w) / rs);
        span.setAttribute("data-weight", exact(w));
        var name = (example.rows[row] || row) + " \u2192 " + c;
        span.addEventListener("mouseenter", function () { self.tell(name, w); });
        span.addEventListener("click", function () { self.tell(name, w); });
        line.appendChild(span);
        line.appendChild(document.createTextNode(" "));
      });
      view.appendChild(line);
      body.appendChild(view);
    }
  };

  Viewer.prototype.drawImage = function (body, example) {
    var self = this;
    var weights = example.weights;
    var grid = example.grid || [1, example.cols.length];
    var gh = grid[0], gw = grid[1];
    if (!(gh > 0 && gw > 0) || gh * gw !== example.cols.length) {
      this.drawMatrix(body, example);
      return;
    }
    var row = Math.min(this.state.row, weights.length - 1);
    if (weights.length > 1) {
      var btns = make("div", "vrowbtns");
      weights.forEach(function (r, i) {
        var b = make("button", i === row ? "on" : "", example.rows[i] || String(i));
        b.type = "button";
        b.setAttribute("data-row", String(i));
        b.addEventListener("click", function () { self.selectRow(i); });
        btns.appendChild(b);
      });
      body.appendChild(btns);
    } else if (example.rows[0] && example.rows[0] !== "attention") {
      body.appendChild(make("div", "meta", example.rows[0]));
    }
    var size = 256;
    var canvas = make("canvas");
    canvas.width = size;
    canvas.height = size;
    body.appendChild(canvas);
    var values = weights[row] || [];
    var scale = maxOf(values);
    var heat = this.heat;
    function paint(img) {
      var ctx = canvas.getContext("2d");
      if (!ctx) { return; }
      if (img) {
        canvas.height = Math.round(size * img.height / Math.max(img.width, 1));
        ctx.imageSmoothingEnabled = false;
        ctx.drawImage(img, 0, 0, canvas.width, canvas.height);
      } else {
        ctx.clearRect(0, 0, canvas.width, canvas.height);
      }
      var cw = canvas.width / gw, ch = canvas.height / gh;
      for (var k = 0; k < values.length; k++) {
        var t = num(values[k]) / scale;
        if (isNaN(t)) { t = 0; }
        var r = Math.floor(k / gw), c = k % gw;
        ctx.fillStyle = img
          ? "rgba(" + heat[0] + "," + heat[1] + "," + heat[2] + "," + (0.75 * t).toFixed(3) + ")"
          : self.colour(t);
        ctx.fillRect(c * cw, r * ch, cw, ch);
      }
    }
    function cellAt(event) {
      var box = canvas.getBoundingClientRect();
      var x = (event.clientX - box.left) / Math.max(box.width, 1);
      var y = (event.clientY - box.top) / Math.max(box.height, 1);
      var c = Math.min(gw - 1, Math.max(0, Math.floor(x * gw)));
      var r = Math.min(gh - 1, Math.max(0, Math.floor(y * gh)));
      return r * gw + c;
    }
    function report(event) {
      var k = cellAt(event);
      self.tell((example.rows[row] || "") + " \u2192 " + (example.cols[k] || k), values[k]);
    }
    canvas.addEventListener("mousemove", report);
    canvas.addEventListener("click", report);
    if (example.image) {
      var img = new Image();
      img.onload = function () { paint(img); };
      img.src = example.image;
    } else {
      paint(null);
    }
  };

  Viewer.prototype.drawViews = function (body, views) {
    var self = this;
    if (views.words) {
      var w = make("div", "view");
      w.appendChild(this.labelledLine(views.words.words, views.words.weights, views.words.name));
      body.appendChild(w);
    }
    if (views.hierarchy) {
      var h = views.hierarchy;
      var hv = make("div", "view vhierarchy");
      hv.appendChild(make("div", "meta", "sentence weights (bars) and word weights"));
      var ss = maxOf(h.sentence_weights);
      var table = make("table", "hier");
      h.sentences.forEach(function (sent, j) {
        var tr = make("tr", "sentence");
        var td = make("td", "sw");
        var bar = make("span", "wbar");
        bar.style.width = "80px";
        var fill = make("span");
        var t = num(h.sentence_weights[j]) / ss;
        fill.style.width = (80 * (isNaN(t) ? 0 : Math.max(0, Math.min(1, t)))).toFixed(1) + "px";
        fill.style.background = self.colour(1);
        bar.appendChild(fill);
        td.appendChild(bar);
        td.appendChild(make("span", "num", " " + fmt(h.sentence_weights[j])));
        td.addEventListener("mouseenter", function () {
          self.tell("sentence " + (j + 1), h.sentence_weights[j]);
        });
        tr.appendChild(td);
        var words = make("td", "words");
        words.appendChild(self.tokenLine(sent, h.word_weights[j], "sentence " + (j + 1)));
        tr.appendChild(words);
        table.appendChild(tr);
      });
      hv.appendChild(table);
      body.appendChild(hv);
    }
    if (views.coattention) {
      var co = views.coattention;
      var cv = make("div", "view vcoattention");
      cv.appendChild(make("div", "meta", "co-attention"));
      [["a", co.name_a], ["b", co.name_b]].forEach(function (side) {
        var tokens = co["tokens_" + side[0]];
        cv.appendChild(self.labelledLine(tokens, co["weights_" + side[0]], side[1]));
      });
      if (co.affinity) {
        cv.appendChild(make("div", "meta", "affinity (rows: " + co.name_a + ", columns: " +
          co.name_b + ")"));
        cv.appendChild(this.mini(co.affinity, co.tokens_a, co.tokens_b, "affinity", true));
      }
      body.appendChild(cv);
    }
    if (views.heads) {
      var hd = views.heads;
      var grid = make("div", "view headgrid vheads");
      hd.heads.forEach(function (m, k) {
        var cell = make("div", "head");
        cell.appendChild(make("div", "meta", hd.names[k]));
        cell.appendChild(self.mini(m, hd.rows, hd.cols, hd.names[k], false));
        grid.appendChild(cell);
      });
      body.appendChild(grid);
    }
  };

  // A small heatmap without labels (hover a cell for its weight); ``span`` shades from the
  // smallest to the largest entry (affinities may be negative), else from 0.
  Viewer.prototype.mini = function (matrix, rows, cols, what, span) {
    var self = this;
    var lo = 0, hi = 0;
    matrix.forEach(function (r) {
      r.forEach(function (v) {
        v = num(v);
        if (!isNaN(v)) { hi = Math.max(hi, v); if (span) { lo = Math.min(lo, v); } }
      });
    });
    var width = hi > lo ? hi - lo : 1;
    var table = make("table", "vmini");
    matrix.forEach(function (r, i) {
      var tr = make("tr");
      r.forEach(function (w, j) {
        var td = make("td");
        self.shade(td, (num(w) - lo) / width);
        var name = what + ": " + (rows[i] || i) + " \u2192 " + (cols[j] || j);
        td.title = name + ": " + fmt(w);
        td.addEventListener("mouseenter", function () { self.tell(name, w); });
        td.addEventListener("click", function () { self.tell(name, w); });
        tr.appendChild(td);
      });
      table.appendChild(tr);
    });
    return table;
  };

  Viewer.prototype.snapshot = function () {
    var r = this.root;
    var main = r.querySelector('.viewer-panel[data-role="main"]');
    var selected = main ? main.querySelector("tr.selected th.vrow") : null;
    return {
      mechanism: r.getAttribute("data-mechanism"),
      seed: r.getAttribute("data-seed"),
      example: parseInt(r.getAttribute("data-example"), 10),
      title: r.getAttribute("data-title"),
      kind: main ? main.getAttribute("data-kind") : null,
      row: parseInt(r.getAttribute("data-row"), 10),
      selected_row: selected ? selected.textContent : null,
      readout: this.readoutText,
      panels: r.querySelectorAll(".viewer-panel").length
    };
  };

  function click(node) {
    node.dispatchEvent(new MouseEvent("click", { bubbles: true, cancelable: true, view: window }));
  }

  // Real click events on the controls; the states go into #viewer-selftest as JSON.
  Viewer.prototype.selfTest = function () {
    var out = document.getElementById("viewer-selftest");
    var result = { before: this.snapshot(), steps: [] };
    click(this.nextButton);
    result.steps.push({ action: "next", state: this.snapshot() });
    var rows = null;
    var n = this.run().examples.length;
    for (var k = 0; k < n; k++) {
      rows = this.root.querySelectorAll('.viewer-panel[data-role="main"] th.vrow');
      if (rows.length > 1) { break; }
      click(this.nextButton);
    }
    if (rows && rows.length > 1) {
      result.steps.push({ action: "matrix", state: this.snapshot() });
      click(this.root.querySelectorAll('.viewer-panel[data-role="main"] th.vrow')[1]);
      result.steps.push({ action: "row", state: this.snapshot() });
    }
    var tok = this.root.querySelector('.viewer-panel[data-role="main"] .vtok');
    if (tok) {
      click(tok);
      result.steps.push({ action: "token", weight: tok.getAttribute("data-weight"),
        state: this.snapshot() });
    }
    if (this.data.mechanisms.length > 1) {
      this.cmpSelect.value = "1";
      this.cmpSelect.dispatchEvent(new Event("change", { bubbles: true }));
      result.steps.push({ action: "compare", state: this.snapshot() });
    }
    if (out) {
      out.setAttribute("data-status", "done");
      out.textContent = JSON.stringify(result);
    }
  };

  attnlabReport.onReady(function (doc) {
    var root = doc.getElementById("attention-viewer");
    var source = doc.getElementById("viewer-data");
    if (!root || !source) { return; }
    var data = JSON.parse(source.textContent);
    if (!data.mechanisms || !data.mechanisms.length) { return; }
    var viewer = new Viewer(root, data);
    window.attnlabViewer = viewer;
    if (window.location.hash === "#viewer-selftest") { viewer.selfTest(); }
  });
})();
