// The HTML report's inline stylesheet and script (src/report/report_html.cpp). The script reads the
// per-token data from <script type="application/json" id="ds4r-data">, shows the hover tooltip
// (built with textContent only: record text is never parsed as HTML), sorts the sequence table, and
// finally sets data-ds4r-ok="1" on <html> (scripts/check_report_browser.sh looks for it; an
// uncaught error sets data-ds4r-error instead). Opened as report.html#ds4r-check it also hovers the
// first scored token and sets data-ds4r-tip="ok" when the tooltip filled.
#pragma once

namespace ds4r::report_assets {

inline constexpr const char* kCss = R"CSS(
:root{--fg:#1d2330;--muted:#667085;--line:#e4e7ec;--bg:#f6f7f9;--card:#fff;--accent:#3559c7;--up:#2e9e5b;--down:#d0453a}
*{box-sizing:border-box}
body{margin:0;background:var(--bg);color:var(--fg);font:14px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,"Noto Sans",sans-serif}
main{max-width:1100px;margin:0 auto;padding:24px 28px 40px}
h1{font-size:24px;margin:0 0 2px}
h2{font-size:17px;margin:28px 0 10px;padding-bottom:4px;border-bottom:1px solid var(--line)}
h3{font-size:14px;margin:0 0 8px;display:flex;gap:12px;align-items:baseline;flex-wrap:wrap}
a{color:var(--accent);text-decoration:none}a:hover{text-decoration:underline}
code{font-family:ui-monospace,"DejaVu Sans Mono",Menlo,monospace;font-size:12.5px;background:#eef0f4;padding:1px 4px;border-radius:3px}
.sub{color:var(--muted);margin:0}
.note{color:var(--muted);margin:4px 0 10px}
.warn{color:#8a5a00;background:#fff6e0;border:1px solid #f3dfae;padding:6px 10px;border-radius:6px}
.cards{display:grid;grid-template-columns:repeat(auto-fit,minmax(170px,1fr));gap:12px;margin-top:18px}
.card{background:var(--card);border:1px solid var(--line);border-radius:10px;padding:12px 14px;box-shadow:0 1px 2px rgba(16,24,40,.04)}
.cv{font-size:22px;font-weight:650;font-variant-numeric:tabular-nums}
.cl{font-weight:600;margin-top:2px}
.ch{color:var(--muted);font-size:12px}
.tw{overflow-x:auto;background:var(--card);border:1px solid var(--line);border-radius:10px}
table{border-collapse:collapse;width:100%;font-variant-numeric:tabular-nums}
th,td{padding:6px 10px;text-align:right;white-space:nowrap;border-bottom:1px solid var(--line)}
th:first-child,td:first-child{text-align:left;max-width:320px;overflow:hidden;text-overflow:ellipsis}
thead th{background:#f0f2f6;font-weight:600;cursor:pointer;user-select:none;position:sticky;top:0}
thead th:hover{background:#e5e9f2}
th.asc::after{content:" \25B2";font-size:10px}th.desc::after{content:" \25BC";font-size:10px}
tbody tr:hover{background:#f7f9fc}
tfoot td{font-weight:650;background:#f8f9fb;border-bottom:none}
svg{display:block;width:100%;height:auto;background:var(--card);border:1px solid var(--line);border-radius:10px}
svg .grid{stroke:#eef0f4}svg .axis,svg .tick{stroke:#98a2b3}
svg .ax{font-size:11px;fill:var(--muted)}
svg .bar{stroke:rgba(0,0,0,.15);stroke-width:.5}
svg .up{fill:var(--up)}svg .down{fill:var(--down)}svg .changed{fill:#fff1cc}
.pairbox{background:var(--card);border:1px solid var(--line);border-radius:10px;padding:12px 14px;margin-bottom:14px}
.pairbox svg{border:none}
.parts{margin:6px 0 10px;width:auto}.parts th,.parts td{text-align:left;cursor:default;background:none}
b.pos{color:var(--up)}b.neg{color:var(--down)}
.legend{display:flex;flex-wrap:wrap;gap:6px;align-items:center;margin:6px 0 14px;font-size:12px;color:var(--muted)}
.legend .sw{padding:1px 8px;border-radius:3px;color:var(--fg);border:1px solid rgba(0,0,0,.08)}
.legend .hint{margin-left:8px}
.seq{background:var(--card);border:1px solid var(--line);border-radius:10px;padding:12px 14px;margin-bottom:14px}
.seq:target{outline:2px solid var(--accent)}
.meta{color:var(--muted);font-weight:400;font-size:12px}
.toks{font-family:ui-monospace,"DejaVu Sans Mono",Menlo,monospace;font-size:13px;line-height:1.9;white-space:pre-wrap;word-break:break-word}
.t{border-radius:3px;padding:1px 0;cursor:default;box-shadow:inset 0 0 0 .5px rgba(0,0,0,.07)}
.t:hover{outline:2px solid var(--fg);outline-offset:0}
.t.first,.legend .first{background:#e9ecf2}
.t.sp{font-weight:600;color:#5b3fb3}
.toks.pos .t{margin-right:2px;padding:1px 3px;font-size:11px}
.tip{position:fixed;z-index:10;pointer-events:none;background:#1d2330;color:#fff;border-radius:8px;padding:8px 10px;font-size:12px;line-height:1.45;max-width:360px;box-shadow:0 6px 24px rgba(0,0,0,.25)}
.tip .tt{font-family:ui-monospace,"DejaVu Sans Mono",monospace;font-size:13px;background:rgba(255,255,255,.12);padding:0 4px;border-radius:3px;white-space:pre}
.tip table{width:auto;margin-top:4px}.tip td{border:none;padding:0 6px 0 0;text-align:left;font-family:ui-monospace,"DejaVu Sans Mono",monospace}
.tip td.n{text-align:right;color:#c7d2fe}.tip tr.hit td{color:#86efac}
footer{margin-top:30px;color:var(--muted);font-size:12px}
)CSS";

inline constexpr const char* kScript = R"JS(
(function(){
"use strict";
window.addEventListener("error",function(e){document.documentElement.setAttribute("data-ds4r-error",String(e.message||e));});
var data=JSON.parse(document.getElementById("ds4r-data").textContent);
var tip=document.getElementById("tip");
function fmt(x,d){return (typeof x==="number"&&isFinite(x))?x.toFixed(d):"\u2013";}
function show(s){return s.replace(/\n/g,"\u21b5").replace(/\t/g,"\u21e5").replace(/ /g,"\u00b7");}
function el(tag,cls,text){var e=document.createElement(tag);if(cls)e.className=cls;if(text!==undefined)e.textContent=text;return e;}
function fill(seq,p,label){
  var d=data[seq];tip.textContent="";
  var head=el("div");head.appendChild(el("span","tt",show(label)));
  if(d.tok&&d.tok.length>p)head.appendChild(document.createTextNode("  id "+d.tok[p]));
  head.appendChild(document.createTextNode("  position "+p));tip.appendChild(head);
  if(p===0){tip.appendChild(el("div",null,"first token: not scored"));return;}
  var t=p-1;var line="logprob "+fmt(d.lp[t],3);
  if(d.rank.length>t)line+="  \u00b7  rank "+d.rank[t];
  if(d.ent.length>t)line+="  \u00b7  entropy "+fmt(d.ent[t],2);
  tip.appendChild(el("div",null,line));
  var alt=d.alt[t];
  if(alt&&alt.length){
    tip.appendChild(el("div",null,"top "+alt.length+" alternatives:"));
    var tb=el("table");var actual=(d.tok&&d.tok.length>p)?d.tok[p]:-1;
    for(var i=0;i<alt.length;i++){
      var tr=el("tr",alt[i][0]===actual?"hit":null);
      tr.appendChild(el("td","n",fmt(alt[i][2],3)));
      tr.appendChild(el("td",null,alt[i][1]!==""?show(alt[i][1]):"id "+alt[i][0]));
      if(alt[i][1]!=="")tr.appendChild(el("td","n","#"+alt[i][0]));
      tb.appendChild(tr);
    }
    tip.appendChild(tb);
  }
}
function place(ev){
  var w=tip.offsetWidth,h=tip.offsetHeight,x=ev.clientX+14,y=ev.clientY+16;
  if(x+w>window.innerWidth-8)x=Math.max(8,ev.clientX-w-14);
  if(y+h>window.innerHeight-8)y=Math.max(8,ev.clientY-h-16);
  tip.style.left=x+"px";tip.style.top=y+"px";
}
document.querySelectorAll(".toks").forEach(function(box){
  var seq=+box.getAttribute("data-s");
  box.addEventListener("mouseover",function(ev){
    var t=ev.target.closest(".t");if(!t)return;
    fill(seq,+t.getAttribute("data-p"),t.textContent);tip.hidden=false;place(ev);
  });
  box.addEventListener("mousemove",function(ev){if(!tip.hidden)place(ev);});
  box.addEventListener("mouseleave",function(){tip.hidden=true;});
});
var table=document.getElementById("seqtable");
if(table){
  var ths=table.tHead.rows[0].cells;
  Array.prototype.forEach.call(ths,function(th,col){
    th.addEventListener("click",function(){
      var asc=!th.classList.contains("asc");
      Array.prototype.forEach.call(ths,function(o){o.classList.remove("asc","desc");});
      th.classList.add(asc?"asc":"desc");
      var body=table.tBodies[0],rows=Array.prototype.slice.call(body.rows);
      rows.sort(function(a,b){
        var x=parseFloat(a.cells[col].getAttribute("data-v")),y=parseFloat(b.cells[col].getAttribute("data-v"));
        if(isNaN(x))x=-Infinity;if(isNaN(y))y=-Infinity;
        return asc?x-y:y-x;
      });
      rows.forEach(function(r){body.appendChild(r);});
    });
  });
}
// scripts/check_report_browser.sh opens the page as report.html#ds4r-check: hover the first scored
// token programmatically and record whether the tooltip filled.
if(location.hash==="#ds4r-check"){
  var first=document.querySelector('.t[data-p="1"]');
  if(first){
    var r=first.getBoundingClientRect();
    first.dispatchEvent(new MouseEvent("mouseover",{bubbles:true,clientX:r.left+4,clientY:r.bottom}));
    document.documentElement.setAttribute("data-ds4r-tip",(!tip.hidden&&tip.textContent.indexOf("logprob")>=0)?"ok":"empty");
  }
}
document.documentElement.setAttribute("data-ds4r-ok","1");
})();
)JS";

}  // namespace ds4r::report_assets
