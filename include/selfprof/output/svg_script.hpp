// The style sheet and the script embedded in every interactive flame-graph SVG (zoom, search, URL state).
// Context: any thread (constant text).
#pragma once

namespace selfprof {
namespace detail {

// CSS; the writer appends the font, sizes and colours that depend on options.
constexpr const char* svg_static_css = R"SPCSS(#title{text-anchor:middle}
#subtitle{text-anchor:middle;fill:rgb(90,90,90)}
#search,#ignorecase{opacity:0.1;cursor:pointer}
#search:hover,#search.show,#ignorecase:hover,#ignorecase.show{opacity:1}
#search,#ignorecase,#matched{text-anchor:end}
#unzoom{cursor:pointer}
#footer{fill:rgb(100,100,100)}
#frames>*{cursor:pointer}
#frames rect{rx:2px;ry:2px}
#frames>*:hover>rect{stroke:black;stroke-width:0.5}
#frames>.current>rect{stroke:black;stroke-width:2}
.hide{display:none}
.parent{opacity:0.5}
)SPCSS";

// The script. Configuration (nametype, fontsize, fontwidth, xpad, inverted, searchcolor,
// fluiddrawing, truncate_text_right, frameheight) is emitted before it as `var` statements.
// Everything is found from the DOM: each frame's <rect> carries fg:x and fg:w (sample space) and
// its <title> starts with "name (N countname, P%)".
constexpr const char* svg_static_js = R"SPJS("use strict";
var svg, frames, details, searchbtn, unzoombtn, matchedtxt, icbtn, sbox, sinput;
var fr = [], total = 1, nominalwidth = 1200, fwidth = 1180, charw = 7, monospace = false;
var ignorecase = false, searchterm = "", zoomed = null, matches = [], lit = [], cur = -1;
function el(id) { return document.getElementById(id); }
function init(evt) {
  frames = el("frames");
  if (!frames) return;
  svg = frames.ownerSVGElement || document.documentElement;
  details = el("details"); searchbtn = el("search"); unzoombtn = el("unzoom");
  matchedtxt = el("matched"); icbtn = el("ignorecase");
  nominalwidth = +svg.getAttribute("width") || 1200;
  fwidth = +frames.getAttribute("width") || (nominalwidth - 2 * xpad);
  total = +frames.getAttribute("total_samples") || 1;
  var gs = frames.children, y0 = 0;
  for (var i = 0; i < gs.length; i++) {
    var g = gs[i], r = g.querySelector("rect"), tt = g.querySelector("title");
    if (!r) continue;
    var t = g.querySelector("text");
    if (!t) { t = document.createElementNS("http://www.w3.org/2000/svg", "text"); g.appendChild(t); }
    var title = tt ? tt.textContent : "", nl = title.indexOf("\n");
    var first = nl < 0 ? title : title.substring(0, nl), p = first.lastIndexOf(" (");
    var f = { g: g, r: r, t: t, title: title, name: p < 0 ? first : first.substring(0, p),
      x: +r.getAttribute("fg:x"), w: +r.getAttribute("fg:w"), y: +r.getAttribute("y"),
      fill: r.getAttribute("fill"), ox: r.getAttribute("x"), ow: r.getAttribute("width"),
      tx: t.getAttribute("x"), label: t.textContent, i: fr.length };
    if (fr.length === 0) y0 = f.y;
    f.d = Math.round(Math.abs(f.y - y0) / frameheight);
    g.setAttribute("data-i", f.i);
    fr.push(f);
  }
  measure_font();
  frames.addEventListener("mouseover", function (e) { var f = frame_of(e.target); if (f) show_details(f); });
  frames.addEventListener("mouseout", function (e) { if (frame_of(e.target)) details.textContent = " "; });
  frames.addEventListener("click", function (e) {
    var f = frame_of(e.target);
    if (!f) return;
    e.preventDefault();
    if (f.i === 0) unzoom(); else if (f !== zoomed) zoom(f);
  });
  unzoombtn.addEventListener("click", function () { unzoom(); });
  searchbtn.addEventListener("click", function () { if (searchterm) reset_search(); else open_box(); });
  icbtn.addEventListener("click", toggle_case);
  window.addEventListener("keydown", keydown);
  make_box();
  if (fluiddrawing) {
    svg.removeAttribute("width");
    svg.removeAttribute("viewBox");
    window.addEventListener("resize", relayout);
    relayout();
  }
  var q = params();
  if (q.get("ic")) { ignorecase = true; icbtn.classList.add("show"); }
  var qx = q.get("x"), qy = q.get("y");
  if (qx !== null && qy !== null) { var t0 = find_frame(qx, +qy); if (t0) zoom(t0); }
  var qs = q.get("s");
  if (qs) { sinput.value = qs; search(qs); }
}
function frame_of(n) {
  while (n && n.parentNode !== frames) n = n.parentNode;
  return n ? fr[+n.getAttribute("data-i")] : null;
}
// Completes a tooltip from what the file stores ("name (N unit, P%)" and "self S"): self %, % of parent, depth.
function enrich(f) {
  if (f.rich) return;
  f.rich = true;
  var lines = f.title.split("\n"), m = /\(([\d,]+) (.*), [\d.]+%\)$/.exec(lines[0]);
  if (!m || (lines[1] && lines[1].indexOf("self ") !== 0) || f.name.charAt(0) === "[" && / elided frames\]$/.test(f.name)) return;
  var self = lines[1] ? +lines[1].substring(5).replace(/,/g, "") : 0, i, p = null;
  for (i = 0; i < fr.length; i++) {
    var q = fr[i];
    if (q.d === f.d - 1 && q.x <= f.x && q.x + q.w >= f.x + f.w) { p = q; break; }
  }
  s = "self " + (lines[1] ? lines[1].substring(5) : "0") + " (" + (100 * self / total).toFixed(2) + "%)";
  if (p) s += ", " + (100 * f.w / p.w).toFixed(2) + "% of parent";
  s += ", depth " + f.d;
  f.title = lines[0] + "\n" + s;
  var tt = f.g.querySelector("title");
  if (tt) tt.textContent = f.title;
}
function show_details(f) {
  enrich(f);
  var s = f.title.replace(/\n/g, "; ");
  details.textContent = nametype + " " + s;
}
function params() { try { return new URLSearchParams(location.search); } catch (e) { return new URLSearchParams(""); } }
function set_params(upd) {
  try {
    var p = params();
    for (var k in upd) { if (upd[k] === null) p.delete(k); else p.set(k, upd[k]); }
    var s = p.toString();
    history.replaceState(null, "", location.pathname + (s ? "?" + s : "") + location.hash);
  } catch (e) { }
}
// x is fg:x (sample offset, selfprof and inferno) or flamegraph.pl's pixel x ("123.4").
function find_frame(x, y) {
  var i, f, best = null, bd = Infinity;
  for (i = 0; i < fr.length; i++) { f = fr[i]; if (f.y === y && String(f.x) === x) return f; }
  var px = parseFloat(x);
  if (isNaN(px)) return null;
  var sx = (px - xpad) / (nominalwidth - 2 * xpad) * total, tol = total / (nominalwidth - 2 * xpad);
  for (i = 0; i < fr.length; i++) {
    f = fr[i];
    if (f.y !== y) continue;
    var d = Math.abs(f.x - sx);
    if (d <= tol && d < bd) { bd = d; best = f; }
  }
  return best;
}
function measure_font() {
  var t = document.createElementNS("http://www.w3.org/2000/svg", "text");
  t.setAttribute("x", 0); t.setAttribute("y", -100);
  svg.appendChild(t);
  try {
    t.textContent = "iiiiiiiiii"; var a = t.getComputedTextLength();
    t.textContent = "WWWWWWWWWW"; var b = t.getComputedTextLength();
    if (a > 0 && Math.abs(a - b) < 0.01) { monospace = true; charw = a / 10; }
    else charw = fontsize * fontwidth;
  } catch (e) { charw = fontsize * fontwidth; }
  svg.removeChild(t);
}
function relayout() {
  var W = svg.getBoundingClientRect().width || nominalwidth;
  fwidth = Math.max(W - 2 * xpad, 10);
  frames.setAttribute("width", fwidth);
  searchbtn.setAttribute("x", W - xpad - 24);
  icbtn.setAttribute("x", W - xpad);
  matchedtxt.setAttribute("x", W - xpad);
  var fo = el("searchbox");
  if (fo) fo.setAttribute("x", W - xpad - 24 - 70 - 230);
  var bg = el("background_rect");
  if (bg) bg.setAttribute("width", W);
  for (var i = 0; i < fr.length; i++) {
    var f = fr[i];
    if (f.g.classList.contains("hide")) continue;
    var pct = parseFloat(f.r.getAttribute("x")), wp = parseFloat(f.r.getAttribute("width"));
    place_text(f, pct, wp);
  }
}
// Label for a frame drawn at x% with width w% of the frames area.
function place_text(f, xpct, wpct) {
  var wpx = wpct / 100 * fwidth - 3, t = f.t;
  var txt = f.i === 0 ? "all" : f.name;
  if (wpx < 2 * charw) { if (t.textContent !== "") t.textContent = ""; return; }
  t.setAttribute("x", (xpct + 300 / fwidth).toFixed(4) + "%");
  if (!t.getAttribute("y")) t.setAttribute("y", (f.y + (frameheight - 1) / 2 + 3).toFixed(1));
  var n = Math.floor(wpx / charw), s = txt;
  if (txt.length > n) s = cut(txt, n);
  t.textContent = s;
  if (monospace || s.length < 3) return;
  try {
    while (s.length >= 3 && t.getComputedTextLength() > wpx) {
      n = s === txt ? txt.length - 1 : n - 1;
      s = n >= 3 ? cut(txt, n) : "";
      t.textContent = s;
    }
  } catch (e) { }
}
function cut(txt, n) {
  if (n < 3) return "";
  return truncate_text_right ? txt.substring(0, n - 2) + ".." : ".." + txt.substring(txt.length - (n - 2));
}
function zoom(t) {
  zoomed = t;
  unzoombtn.classList.remove("hide");
  for (var i = 0; i < fr.length; i++) {
    var f = fr[i], g = f.g, cl = g.classList;
    if (f === t || (f.d < t.d && f.x <= t.x && f.x + f.w >= t.x + t.w)) {
      cl.remove("hide");
      if (f === t) cl.remove("parent"); else cl.add("parent");
      set_geom(f, 0, 100);
    } else if (f.d > t.d && f.x >= t.x && f.x + f.w <= t.x + t.w) {
      cl.remove("hide"); cl.remove("parent");
      set_geom(f, (f.x - t.x) / t.w * 100, f.w / t.w * 100);
    } else {
      cl.add("hide"); cl.remove("parent");
    }
  }
  set_params({ x: String(t.x), y: String(t.y) });
  rerun_search();
}
function set_geom(f, xp, wp) {
  f.r.setAttribute("x", xp.toFixed(4) + "%");
  f.r.setAttribute("width", wp.toFixed(4) + "%");
  place_text(f, xp, wp);
}
function unzoom() {
  zoomed = null;
  unzoombtn.classList.add("hide");
  for (var i = 0; i < fr.length; i++) {
    var f = fr[i], cl = f.g.classList;
    cl.remove("hide"); cl.remove("parent");
    f.r.setAttribute("x", f.ox); f.r.setAttribute("width", f.ow);
    if (fluiddrawing) place_text(f, parseFloat(f.ox), parseFloat(f.ow));
    else { if (f.tx !== null) f.t.setAttribute("x", f.tx); f.t.textContent = f.label; }
  }
  set_params({ x: null, y: null });
  rerun_search();
}
function make_box() {
  var ns = "http://www.w3.org/2000/svg", xh = "http://www.w3.org/1999/xhtml";
  sbox = document.createElementNS(ns, "foreignObject");
  sbox.setAttribute("id", "searchbox");
  sbox.setAttribute("class", "hide");
  sbox.setAttribute("x", +searchbtn.getAttribute("x") - 70 - 230);
  sbox.setAttribute("y", +searchbtn.getAttribute("y") - fontsize - 4);
  sbox.setAttribute("width", 230); sbox.setAttribute("height", fontsize + 10);
  sinput = document.createElementNS(xh, "input");
  sinput.setAttribute("type", "text");
  sinput.setAttribute("placeholder", "regex; Enter next, Esc close");
  sinput.setAttribute("style", "width:220px;font-size:" + fontsize + "px;padding:1px 3px;box-sizing:border-box;height:" + (fontsize + 8) + "px");
  sinput.addEventListener("input", function () { search(sinput.value); });
  sbox.appendChild(sinput);
  svg.appendChild(sbox);
}
function open_box() { sbox.classList.remove("hide"); sinput.focus(); sinput.select(); }
function close_box() { sbox.classList.add("hide"); sinput.blur(); }
function toggle_case() {
  ignorecase = !ignorecase;
  if (ignorecase) icbtn.classList.add("show"); else icbtn.classList.remove("show");
  set_params({ ic: ignorecase ? "1" : null });
  rerun_search();
}
function keydown(e) {
  var inbox = document.activeElement === sinput;
  var k = e.key;
  if (((e.ctrlKey || e.metaKey) && (k === "f" || k === "F")) || k === "F3" || (!inbox && k === "/")) {
    e.preventDefault(); open_box(); return;
  }
  if (e.ctrlKey && (k === "i" || k === "I")) { e.preventDefault(); toggle_case(); return; }
  if (k === "Escape") {
    if (inbox || !sbox.classList.contains("hide")) close_box();
    else if (zoomed) unzoom();
    else if (searchterm) reset_search();
    return;
  }
  if (inbox) { if (k === "Enter") { e.preventDefault(); step(e.shiftKey ? -1 : 1); } return; }
  if (k === "n") step(1); else if (k === "N") step(-1);
}
function rerun_search() { if (searchterm) search(searchterm); }
function reset_search() {
  clear_marks();
  searchterm = ""; matches = []; cur = -1;
  sinput.value = "";
  matchedtxt.textContent = " ";
  searchbtn.textContent = "Search";
  searchbtn.classList.remove("show");
  set_params({ s: null });
}
function clear_marks() {
  for (var i = 0; i < lit.length; i++) { lit[i].r.setAttribute("fill", lit[i].fill); lit[i].g.classList.remove("current"); }
  lit = [];
}
// Regex over frame names only. Matched % unites nested matches and counts only what the current zoom shows.
function search(term) {
  clear_marks();
  matches = []; cur = -1;
  if (!term) { reset_search(); return; }
  var re;
  try { re = new RegExp(term, ignorecase ? "i" : ""); }
  catch (e) { searchterm = ""; matchedtxt.textContent = "Bad regex"; return; }
  searchterm = term;
  for (var i = 0; i < fr.length; i++) {
    var f = fr[i], cl = f.g.classList;
    if (cl.contains("hide") || !re.test(f.name)) continue;
    f.r.setAttribute("fill", searchcolor);
    lit.push(f);
    if (!cl.contains("parent")) matches.push(f);
  }
  matches.sort(function (a, b) { return a.x - b.x || a.d - b.d; });
  var end = -1, sum = 0;
  for (i = 0; i < matches.length; i++) {
    var m = matches[i];
    if (m.x >= end) { sum += m.w; end = m.x + m.w; }
  }
  var view = zoomed ? zoomed.w : total;
  var txt = "Matched: " + pct(100 * sum / view);
  if (zoomed) txt += " of view, " + pct(100 * sum / total) + " of all";
  txt += " (" + matches.length + (matches.length === 1 ? " frame)" : " frames)");
  matchedtxt.textContent = txt;
  matchedtxt.setAttribute("data-base", txt);
  searchbtn.textContent = "Reset Search";
  searchbtn.classList.add("show");
  set_params({ s: term });
}
function pct(v) { return v >= 100 ? "100%" : v.toFixed(1) + "%"; }
function step(dir) {
  if (!matches.length) return;
  if (cur >= 0) matches[cur].g.classList.remove("current");
  cur = (cur + dir + matches.length) % matches.length;
  var m = matches[cur];
  m.g.classList.add("current");
  show_details(m);
  matchedtxt.textContent = matchedtxt.getAttribute("data-base") + " [" + (cur + 1) + " of " + matches.length + "]";
}
)SPJS";

}  // namespace detail
}  // namespace selfprof
