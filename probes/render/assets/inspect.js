(function () {
  "use strict";
  var doc = document, body = doc.body, root = doc.getElementById("dp-inspect");
  var data = JSON.parse(doc.getElementById("dp-inspect-data").textContent);
  function el(tag, cls, text) {
    var e = doc.createElement(tag);
    if (cls) { e.className = cls; }
    if (text !== undefined) { e.textContent = text; }
    return e;
  }
  function decode(p) {  // {shape, dtype, scale, data} -> {shape, a: Float64Array}
    var bin = atob(p.data), raw = new Uint8Array(bin.length);
    for (var i = 0; i < bin.length; i++) { raw[i] = bin.charCodeAt(i); }
    var stream = new Blob([raw]).stream().pipeThrough(new DecompressionStream("deflate"));
    return new Response(stream).arrayBuffer().then(function (buf) {
      var ints = p.dtype === "u2" ? new Uint16Array(buf) : new Int32Array(buf), a = new Float64Array(ints.length);
      for (var j = 0; j < ints.length; j++) { a[j] = ints[j] / p.scale; }
      return { shape: p.shape, a: a };
    });
  }
  function shade(x, top) {  // white 0 to dark top (square-root scale); negative values orange
    var t = top > 0 ? Math.sqrt(Math.min(1, Math.abs(x) / top)) : 0;
    return x >= 0 ? [255 - t * 187, 255 - t * 235, 255 - t * 35] : [255 - t * 0, 255 - t * 128, 255 - t * 241];
  }
  function signed(x, top) {  // blue positive, orange negative, linear
    var t = top > 0 ? Math.min(1, Math.abs(x) / top) : 0;
    return x >= 0 ? [255 - t * 224, 255 - t * 136, 255 - t * 75] : [255, 255 - t * 128, 255 - t * 241];
  }
  function rgb(c) { return "rgb(" + c.map(Math.round).join(",") + ")"; }
  function heat(canvas, m, off, T, causal) {  // one head's [T, T] block of m from offset off
    var ctx = canvas.getContext("2d"), img = ctx.createImageData(T, T), d = img.data, top = 0, q, k;
    canvas.width = T; canvas.height = T;
    for (q = 0; q < T; q++) { for (k = 0; k < T; k++) { top = Math.max(top, Math.abs(m[off + q * T + k])); } }
    for (q = 0; q < T; q++) {
      for (k = 0; k < T; k++) {
        var o = 4 * (q * T + k), c = causal && k > q ? [215, 215, 215] : shade(m[off + q * T + k], top);
        d[o] = c[0]; d[o + 1] = c[1]; d[o + 2] = c[2]; d[o + 3] = 255;
      }
    }
    ctx.putImageData(img, 0, 0);
    return top;
  }
  function cellAt(canvas, e, T) {
    var r = canvas.getBoundingClientRect();
    return [Math.min(T - 1, Math.floor((e.clientY - r.top) / r.height * T)),
            Math.min(T - 1, Math.floor((e.clientX - r.left) / r.width * T))];
  }

  // ---- the model view: a grid of every layer x head ------------------------------------------
  function modelView(p) {
    var T = data.tokens.length, H = data.heads.length, size = T * T;
    var grid = el("table", "grid"), zoom = el("div", "zoom"), tip = el("p", "meta tip", "hover a thumbnail");
    var head = el("tr");
    head.appendChild(el("th"));
    data.heads.forEach(function (h) { head.appendChild(el("th", "", "head " + h)); });
    grid.appendChild(head);
    function enlarge(l, h) {
      var off = (l * H + h) * size, big = el("canvas", "big"), name = data.layers[l] + "-" + data.heads[h];
      var top = heat(big, p.a, off, T, data.causal), line = el("p", "meta tip");
      big.setAttribute("role", "img");
      big.setAttribute("aria-label", "head " + name + ", " + T + " tokens");
      line.textContent = "head " + name + ": white 0 to dark " + top.toFixed(4) + "; hover a cell";
      big.addEventListener("mousemove", function (e) {
        var c = cellAt(big, e, T), masked = data.causal && c[1] > c[0];
        line.textContent = "head " + name + ": " + data.tokens[c[0]] + " (" + c[0] + ") attends to " +
          data.tokens[c[1]] + " (" + c[1] + "): " + (masked ? "masked" : p.a[off + c[0] * T + c[1]].toFixed(4));
      });
      zoom.replaceChildren(el("h3", "", "head " + name), line, big);
      Array.prototype.forEach.call(grid.querySelectorAll("canvas"), function (c) {
        c.classList.toggle("chosen", c.dataset.head === name);
      });
    }
    data.layers.forEach(function (layer, l) {
      var row = el("tr");
      row.appendChild(el("th", "", "layer " + layer));
      data.heads.forEach(function (hd, h) {
        var cell = el("td"), c = el("canvas", "thumb"), name = layer + "-" + hd;
        heat(c, p.a, (l * H + h) * size, T, data.causal);
        c.dataset.head = name;
        c.title = "head " + name;
        c.addEventListener("mouseenter", function () { row.classList.add("hot"); tip.textContent = "head " + name; });
        c.addEventListener("mouseleave", function () { row.classList.remove("hot"); });
        c.addEventListener("click", function () { enlarge(l, h); });
        cell.appendChild(c);
        row.appendChild(cell);
      });
      grid.appendChild(row);
    });
    root.replaceChildren(tip, el("div", "gridwrap"), zoom);
    root.children[1].appendChild(grid);
    enlarge(0, 0);
  }

  // ---- the neuron view: q, k and q*k behind one query ---------------------------------------
  function strip(values, top, title) {  // one vector as a row of coloured cells
    var c = el("canvas", "strip"), ctx = c.getContext("2d"), w = 6;
    c.width = values.length * w; c.height = 14;
    values.forEach(function (v, i) { ctx.fillStyle = rgb(signed(v, top)); ctx.fillRect(i * w, 0, w - 1, 14); });
    c.addEventListener("mousemove", function (e) {
      var r = c.getBoundingClientRect(), i = Math.min(values.length - 1, Math.floor((e.clientX - r.left) / r.width * values.length));
      c.title = title + "[" + i + "] = " + values[i].toFixed(4);
    });
    return c;
  }
  function neuronView(q, k, scores, pattern, masked) {
    var T = data.tokens.length, D = q.shape[3], H = data.heads.length, state = { l: 0, h: 0, i: data.query };
    var r0 = data.rows[0], R = data.rows[1] - data.rows[0];  // the query rows this page holds
    var controls = el("div", "controls"), table = el("table", "data neuron"), queries = el("div", "queries");
    function pick(label, names, key) {
      var s = el("select");
      s.setAttribute("aria-label", label);
      names.forEach(function (n, i) { var o = el("option", "", label + " " + n); o.value = i; s.appendChild(o); });
      s.addEventListener("change", function () { state[key] = Number(s.value); draw(); });
      controls.appendChild(s);
      return s;
    }
    function vec(arr, l, h, pos, n) { var o = ((l * H + h) * n + pos) * D; return Array.prototype.slice.call(arr.a, o, o + D); }
    function at(arr, l, h, i, j) { return arr.a[((l * H + h) * R + i - r0) * T + j]; }
    function draw() {
      var l = state.l, h = state.h, i = state.i, qi = vec(q, l, h, i - r0, R), rows = [], top = 0, ptop = 0;
      for (var j = 0; j < T; j++) {
        var kj = vec(k, l, h, j, T), prod = kj.map(function (x, d) { return x * qi[d]; });
        rows.push([kj, prod]);
        top = Math.max(top, Math.max.apply(null, kj.map(Math.abs)));
        ptop = Math.max(ptop, Math.max.apply(null, prod.map(Math.abs)));
      }
      top = Math.max(top, Math.max.apply(null, qi.map(Math.abs)));
      var name = data.layers[l] + "-" + data.heads[h];
      table.replaceChildren();
      var hr = el("tr");
      ["key", "k", "q * k", "score", "weight"].forEach(function (t) { hr.appendChild(el("th", "", t)); });
      var qr = el("tr", "query");
      qr.appendChild(el("td", "", "q: " + data.tokens[i] + " (" + i + ")"));
      var qc = el("td"); qc.appendChild(strip(qi, top, "q")); qr.appendChild(qc);
      qr.appendChild(el("td")); qr.appendChild(el("td")); qr.appendChild(el("td"));
      table.appendChild(hr); table.appendChild(qr);
      rows.forEach(function (r, j) {
        var tr = el("tr"), off = at(masked, l, h, i, j) > 0, w = at(pattern, l, h, i, j);
        tr.dataset.key = j;
        tr.appendChild(el("td", "", data.tokens[j] + " (" + j + ")"));
        var a = el("td"); a.appendChild(strip(r[0], top, "k")); tr.appendChild(a);
        var b = el("td"); b.appendChild(strip(r[1], ptop, "q*k")); tr.appendChild(b);
        tr.appendChild(el("td", "num score", off ? "masked" : at(scores, l, h, i, j).toFixed(4)));
        var wc = el("td", "num weight"), bar = el("span", "bar");
        bar.style.width = Math.round(100 * Math.max(0, Math.min(1, w))) + "px";
        wc.appendChild(bar); wc.appendChild(doc.createTextNode(" " + (off ? "0" : w.toFixed(4))));
        tr.appendChild(wc);
        if (off) { tr.className = "off"; }
        table.appendChild(tr);
      });
      Array.prototype.forEach.call(queries.children, function (b, n) { b.setAttribute("aria-pressed", String(n === i)); });
      root.dataset.head = name; root.dataset.query = i;
    }
    data.tokens.forEach(function (t, n) {
      var b = el("button", "", t + " (" + n + ")");
      b.type = "button";
      if (n < r0 || n >= r0 + R) { b.disabled = true; b.title = "not on this page: view it with query=" + n; }
      b.addEventListener("click", function () { state.i = n; draw(); });
      queries.appendChild(b);
    });
    pick("layer", data.layers, "l");
    pick("head", data.heads, "h");
    var wrap = el("div", "neuronwrap"), side = el("div"), main = el("div", "tablewrap");
    side.appendChild(el("p", "meta", "query:")); side.appendChild(queries); main.appendChild(table);
    wrap.appendChild(side); wrap.appendChild(main);
    root.replaceChildren(controls, wrap);
    draw();
  }

  function done() { root.setAttribute("data-state", "drawn"); body.setAttribute("data-inspect-done", "1"); }
  function failed(err) {
    root.setAttribute("data-state", "error");
    root.className = "inspect error";
    root.textContent = "could not draw this view: " + (err && err.message ? err.message : String(err));
  }
  if (typeof DecompressionStream === "undefined") { failed(new Error("this browser lacks DecompressionStream; use a current browser")); return; }
  var work = data.kind === "model"
    ? decode(data.pattern).then(modelView)
    : Promise.all([data.q, data.k, data.scores, data.pattern, data.masked].map(decode)).then(function (a) {
      neuronView(a[0], a[1], a[2], a[3], a[4]);
    });
  work.then(done).catch(failed);
})();
