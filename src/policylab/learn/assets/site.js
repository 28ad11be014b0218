// policylab method explorer: language switch, details opened from the URL hash, and the
// search over the embedded JSON index (index page only). No network, works from file://.
(function () {
  "use strict";
  var KEY = "policylab-lang";
  var root = document.documentElement;

  function initialLang() {
    var m = /[?&]lang=(en|zh)\b/.exec(location.search);
    if (m) return m[1];
    try { var s = localStorage.getItem(KEY); if (s === "en" || s === "zh") return s; } catch (e) {}
    return root.getAttribute("data-lang") || "en";
  }

  function lang() { return root.getAttribute("data-lang"); }

  function setLang(l) {
    root.setAttribute("data-lang", l);
    root.setAttribute("lang", l === "zh" ? "zh-CN" : "en");
    try { localStorage.setItem(KEY, l); } catch (e) {}
    // carry the language to the other pages (localStorage may be off for file://)
    document.querySelectorAll("a[data-href]").forEach(function (a) {
      var h = a.getAttribute("data-href"), i = h.indexOf("#");
      var base = i < 0 ? h : h.slice(0, i), hash = i < 0 ? "" : h.slice(i);
      a.setAttribute("href", base + "?lang=" + l + hash);
    });
    document.querySelectorAll("[data-set-lang]").forEach(function (b) {
      b.setAttribute("aria-pressed", b.getAttribute("data-set-lang") === l ? "true" : "false");
    });
    var sel = document.getElementById("f-lang");
    if (sel) sel.value = l;
    // text that CSS cannot switch: <title>, <option> labels, input placeholders
    document.querySelectorAll("[data-t-en]").forEach(function (el) { el.textContent = el.getAttribute("data-t-" + l); });
    document.querySelectorAll("[data-ph-en]").forEach(function (el) { el.placeholder = el.getAttribute("data-ph-" + l); });
    if (window.policylabSearch) window.policylabSearch();
  }

  function openFromHash() {
    if (!location.hash) return;
    var el = document.getElementById(decodeURIComponent(location.hash.slice(1)));
    if (el && el.tagName === "DETAILS") { el.open = true; el.scrollIntoView(); }
  }

  document.querySelectorAll("[data-set-lang]").forEach(function (b) {
    b.addEventListener("click", function () { setLang(b.getAttribute("data-set-lang")); });
  });

  var dataEl = document.getElementById("index-data");
  if (dataEl) {
    var data = JSON.parse(dataEl.textContent);
    var input = document.getElementById("q"), list = document.getElementById("results");
    var count = document.getElementById("count");
    var fm = document.getElementById("f-method"), ff = document.getElementById("f-family");
    var fc = document.getElementById("f-category"), fl = document.getElementById("f-lang");
    var item = function (it, l) {
      var li = document.createElement("li");
      li.setAttribute("data-id", it.id);
      it.methods.forEach(function (m) {
        var b = document.createElement("span"); b.className = "badge"; b.textContent = m; li.appendChild(b);
      });
      var c = document.createElement("span"); c.className = "badge"; c.textContent = data.categories[it.category][l];
      li.appendChild(c);
      var a = document.createElement("a");
      a.setAttribute("data-href", it.url); a.setAttribute("href", it.url.replace("#", "?lang=" + l + "#"));
      a.textContent = it.q[l];
      li.appendChild(a);
      return li;
    };
    window.policylabSearch = function () {
      var l = lang();
      var terms = input.value.toLowerCase().split(/\s+/).filter(Boolean);
      list.textContent = "";
      var n = 0;
      data.items.forEach(function (it) {
        if (fm.value && it.methods.indexOf(fm.value) < 0) return;
        if (ff.value && it.families.indexOf(ff.value) < 0) return;
        if (fc.value && it.category !== fc.value) return;
        var hay = [it.q[l], it.a[l], it.ex[l], it.methods.join(" "), it.id].join(" ").toLowerCase();
        for (var i = 0; i < terms.length; i++) if (hay.indexOf(terms[i]) < 0) return;
        list.appendChild(item(it, l)); n++;
      });
      count.textContent = data.ui.count[l].replace("{n}", n);
    };
    [input, fm, ff, fc].forEach(function (el) {
      el.addEventListener("input", window.policylabSearch);
      el.addEventListener("change", window.policylabSearch);
    });
    fl.addEventListener("change", function () { setLang(fl.value); });
  }

  setLang(initialLang());
  openFromHash();
  window.addEventListener("hashchange", openFromHash);
})();
