(function () {
  "use strict";
  var doc = document, body = doc.body;
  var dataEl = doc.getElementById("dp-views-data");
  var views = dataEl ? JSON.parse(dataEl.textContent) : [];
  var queue = [], busy = false, drawn = 0, failed = 0;
  function attr(name, value) { body.setAttribute("data-views-" + name, String(value)); }
  function status() {
    var s = doc.getElementById("dp-status-text");
    var left = views.length - drawn - failed;
    if (s) { s.textContent = drawn + " of " + views.length + " attention views drawn" +
             (failed ? ", " + failed + " failed" : "") + (left ? " (the others draw when scrolled to)" : ""); }
    attr("drawn", drawn); attr("failed", failed);
    if (!left) { attr("done", 1); var b = doc.getElementById("dp-draw-all"); if (b) { b.hidden = true; } }
  }
  function bytes(b64) {
    var bin = atob(b64), out = new Uint8Array(bin.length);
    for (var i = 0; i < bin.length; i++) { out[i] = bin.charCodeAt(i); }
    return out;
  }
  var raw = [];  // each view's values, inflated once (typed arrays: 2 or 4 bytes a cell)
  function inflate(i) {
    if (!raw[i]) {
      var p = views[i].pattern;
      var stream = new Blob([bytes(p.data)]).stream().pipeThrough(new DecompressionStream("deflate"));
      raw[i] = new Response(stream).arrayBuffer().then(function (buf) {
        var a = p.dtype === "u2" ? new Uint16Array(buf) : new Int32Array(buf);
        raw[i].ready = a;
        return a;
      });
    }
    return raw[i];
  }
  function nest(p, a) {  // [head][query][key] arrays, as circuitsvis takes them
    var H = p.shape[0], Q = p.shape[1], K = p.shape[2], k = 0, heads = [];
    for (var h = 0; h < H; h++) {
      var rows = [];
      for (var q = 0; q < Q; q++) {
        var row = new Array(K);
        for (var j = 0; j < K; j++) { row[j] = a[k++] / p.scale; }
        rows.push(row);
      }
      heads.push(rows);
    }
    return heads;
  }
  function fail(el, err) {
    el.setAttribute("data-state", "error");
    el.className = "view error";
    el.textContent = "could not draw this view: " + (err && err.message ? err.message : String(err));
    failed++;
  }
  function headButtons(v, show) {
    var bar = doc.createElement("div");
    bar.className = "heads";
    v.heads.forEach(function (name, h) {
      var b = doc.createElement("button");
      b.type = "button";
      b.textContent = name;
      b.addEventListener("click", function () { show(h); });
      bar.appendChild(b);
    });
    bar.press = function (h) {
      Array.prototype.forEach.call(bar.children, function (b, i) { b.setAttribute("aria-pressed", String(i === h)); });
    };
    return bar;
  }
  function pattern(el, v, attention) {
    // longer inputs: one head at a time with circuitsvis's AttentionPattern
    var target = doc.createElement("div");
    var bar = headButtons(v, function (h) {
      var fresh = doc.createElement("div");
      fresh.id = el.id + "-head";
      target.replaceChildren(fresh);
      bar.press(h);
      CircuitsVis.render(fresh.id, CircuitsVis.AttentionPattern,
                         { attention: attention[h], tokens: v.tokens, maskUpperTri: !!v.causal });
    });
    el.replaceChildren(bar, target);
    bar.firstChild.click();
  }
  function paint(d, T, at, masked) {
    // one head on T x T pixels: white 0 to dark (the head's largest |value|; square-root scale; negative
    // values of a given map orange), masked grey
    var top = 0, q, k;
    for (q = 0; q < T; q++) {
      for (k = 0; k < T; k++) { if (!masked(q, k) && Math.abs(at(q, k)) > top) { top = Math.abs(at(q, k)); } }
    }
    for (q = 0; q < T; q++) {
      for (k = 0; k < T; k++) {
        var v = at(q, k), o = 4 * (q * T + k), x = top > 0 ? Math.sqrt(Math.abs(v) / top) : 0;
        if (masked(q, k)) { d[o] = d[o + 1] = d[o + 2] = 215; }
        else if (v < 0) { d[o] = 255; d[o + 1] = 255 - x * 128; d[o + 2] = 255 - x * 241; }
        else { d[o] = 255 - x * 187; d[o + 1] = 255 - x * 235; d[o + 2] = 255 - x * 35; }
        d[o + 3] = 255;
      }
    }
    return top;
  }
  function thumbs(el, v, a) {
    // every head as a small heatmap on a plain canvas, drawn at once: for print and full-page captures
    var p = v.pattern, H = p.shape[0], T = p.shape[1], box = doc.createElement("div");
    var masked = function (q, k) { return v.causal && k > q; };
    box.className = "thumbs";
    for (var h = 0; h < H; h++) {
      var fig = doc.createElement("figure"), c = doc.createElement("canvas"), cap = doc.createElement("figcaption");
      var ctx = c.getContext("2d"), img = ctx.createImageData(T, T), off = h * T * T;
      c.width = T; c.height = T;
      paint(img.data, T, function (q, k) { return a[off + q * T + k] / p.scale; }, masked);
      ctx.putImageData(img, 0, 0);
      cap.textContent = v.heads[h];
      fig.appendChild(c); fig.appendChild(cap); box.appendChild(fig);
    }
    el.replaceChildren(box);
  }
  function printAll() {
    // print (beforeprint, or print media) and full-page captures: draw every view not drawn yet
    // now, synchronously, from its inflated values (a view still inflating is queued instead)
    views.forEach(function (v, i) {
      var el = doc.getElementById("dp-view-" + i), st = el && el.getAttribute("data-state");
      if (!el || st === "drawn" || st === "error") { return; }
      var a = raw[i] && raw[i].ready;
      if (!a) { want(i); return; }
      thumbs(el, v, a);
      el.setAttribute("data-state", "drawn");
      el.setAttribute("data-drawn-for", "print");
      drawn++;
    });
    status();
  }
  function raster(el, v, attention) {
    // long inputs: one pixel per cell on a plain canvas (circuitsvis needs seconds per head here)
    var T = v.tokens.length, canvas = doc.createElement("canvas"), tip = doc.createElement("p");
    var ctx = canvas.getContext("2d"), img = ctx.createImageData(T, T), head = 0, top = 0;
    canvas.width = T; canvas.height = T;
    canvas.className = "raster";
    canvas.setAttribute("role", "img");
    tip.className = "meta tip";
    var masked = function (q, k) { return v.causal && k > q; };
    var bar = headButtons(v, function (h) {
      var m = attention[h];
      head = h;
      top = paint(img.data, T, function (q, k) { return m[q][k]; }, masked);
      ctx.putImageData(img, 0, 0);
      bar.press(h);
      canvas.setAttribute("aria-label", v.heads[h] + ": attention pattern, " + T + " tokens");
      tip.textContent = v.heads[h] + ": white 0 to dark " + top.toFixed(4) + " (this head's largest value; " +
        "square-root scale); " +
        "hover a pixel for its tokens and value";
    });
    canvas.addEventListener("mousemove", function (e) {
      var r = canvas.getBoundingClientRect();
      var k = Math.min(T - 1, Math.floor((e.clientX - r.left) / r.width * T));
      var q = Math.min(T - 1, Math.floor((e.clientY - r.top) / r.height * T));
      if (q < 0 || k < 0) { return; }
      tip.textContent = v.heads[head] + ": " + v.tokens[q] + " (" + q + ") attends to " + v.tokens[k] + " (" + k +
        "): " + (masked(q, k) ? "masked" : attention[head][q][k].toFixed(4));
    });
    el.replaceChildren(bar, tip, canvas);
    bar.firstChild.click();
  }
  function drawOne(i) {
    var v = views[i], el = doc.getElementById("dp-view-" + i);
    if (el.getAttribute("data-state") === "drawn") { return Promise.resolve(); }  // drawn for print meanwhile
    el.setAttribute("data-state", "drawing");
    return inflate(i).then(function (a) {
      var attention = nest(v.pattern, a);
      el.textContent = "";
      if (v.mode === "raster") { raster(el, v, attention); }
      else if (v.mode === "pattern") { pattern(el, v, attention); }
      else {
        CircuitsVis.render(el.id, CircuitsVis.AttentionHeads, {
          attention: attention, tokens: v.tokens, attentionHeadNames: v.heads, maskUpperTri: !!v.causal
        });
      }
      el.setAttribute("data-state", "drawn");
      drawn++;
    }).catch(function (err) { fail(el, err); });
  }
  function pump() {
    if (busy || !queue.length) { return; }
    busy = true;
    drawOne(queue.shift()).then(function () {
      status();
      busy = false;
      setTimeout(pump, 0);
    });
  }
  function want(i) {
    var el = doc.getElementById("dp-view-" + i);
    if (el && el.getAttribute("data-state") === "waiting") {
      el.setAttribute("data-state", "queued"); queue.push(i); pump();
    }
  }
  function all() { views.forEach(function (v, i) { want(i); }); }
  function host() { try { return window.parent !== window ? window.parent : null; } catch (e) { return null; } }
  function borrow(then, tries) {
    // a notebook output after the first carries no bundle: run the one an earlier output left on
    // the host page (same text, so the hash this page's policy pins matches)
    var h = host(), code = null;
    try { code = h && h.__depthprobeBundle; } catch (e) { code = null; }
    if (code) {
      var s = doc.createElement("script");
      s.textContent = code;
      body.appendChild(s);
      return then();
    }
    if (!h || tries > 80) { return then(); }
    setTimeout(function () { borrow(then, tries + 1); }, 100);
  }
  var own = doc.getElementById("dp-bundle");
  if (own && host()) { try { host().__depthprobeBundle = host().__depthprobeBundle || own.textContent; } catch (e) {} }
  function start() {
    attr("total", views.length);
    if (typeof CircuitsVis === "undefined" || typeof DecompressionStream === "undefined") {
      var why = typeof CircuitsVis === "undefined"
        ? (own ? "the circuitsvis bundle did not load"
               : "the circuitsvis bundle is in an earlier output that is not on this page; display again with probes.view(..., bundle=True)")
        : "this browser lacks DecompressionStream; use a current browser";
      views.forEach(function (v, i) { fail(doc.getElementById("dp-view-" + i), new Error(why)); });
      status();
      return;
    }
    Promise.all(views.map(function (v, i) { return inflate(i); }))  // ready for a print at any moment
      .then(function () { attr("ready", 1); }, function () {});
    window.addEventListener("beforeprint", printAll);
    if (window.matchMedia) {
      var media = window.matchMedia("print");
      var onPrint = function (e) { if (e.matches) { printAll(); } };
      if (media.addEventListener) { media.addEventListener("change", onPrint); } else { media.addListener(onPrint); }
    }
    window.addEventListener("resize", function () {  // a full-page capture: the viewport holds the whole page
      if (window.innerHeight >= doc.documentElement.scrollHeight - 1) { printAll(); }
    });
    var button = doc.getElementById("dp-draw-all");
    if (button) { button.hidden = false; button.addEventListener("click", all); }
    status();
    if (typeof IntersectionObserver === "undefined" || /[#&]all\b/.test(location.hash)) { all(); return; }
    var seen = new IntersectionObserver(function (entries) {
      entries.forEach(function (e) {
        if (e.isIntersecting) { seen.unobserve(e.target); want(Number(e.target.getAttribute("data-index"))); }
      });
    }, { rootMargin: "300px 0px" });
    views.forEach(function (v, i) { seen.observe(doc.getElementById("dp-view-" + i)); });
  }
  if (typeof CircuitsVis === "undefined" && !own) { borrow(start, 0); } else { start(); }
})();
