(function () {
  "use strict";
  var root = document.documentElement;
  var framed = window.top !== window;
  var topDoc = null;
  if (framed) {
    try { topDoc = window.top.document; } catch (e) { topDoc = null; }
  }

  // The theme: Airflow's UI (next-themes) puts "dark" or "light" on its <html> class and keeps the
  // choice in localStorage["theme"] ("dark", "light" or "system"); inside its frame the page takes
  // the same, and follows when the user switches. Without either, the CSS follows
  // prefers-color-scheme. A ?theme= query parameter (class set by the server) wins.
  function uiTheme() {
    if (topDoc) {
      var cls = topDoc.documentElement.classList;
      if (cls.contains("dark")) return "dark";
      if (cls.contains("light")) return "light";
    }
    try {
      var stored = window.localStorage.getItem("theme");
      if (stored === "dark" || stored === "light") return stored;
    } catch (e) { /* storage refused */ }
    return null;
  }
  function applyTheme() {
    if (root.hasAttribute("data-theme-fixed")) return;
    var mode = uiTheme();
    root.classList.toggle("hg-dark", mode === "dark");
    root.classList.toggle("hg-light", mode === "light");
  }
  applyTheme();
  if (topDoc && window.MutationObserver) {
    new MutationObserver(applyTheme).observe(topDoc.documentElement, { attributes: true, attributeFilter: ["class"] });
  }
  window.addEventListener("storage", function (ev) { if (ev.key === "theme") applyTheme(); });

  // Links. Airflow shows the page in a sandboxed frame that may neither navigate the top window
  // nor open a new one, so a link to a UI page (data-ui-link) or one meant for a new tab
  // (target=_blank) is followed through a link in the parent document, which is the same origin.
  // Opened on its own, or framed by another origin, links behave as written.
  if (!topDoc) return;
  document.addEventListener("click", function (ev) {
    var a = ev.target && ev.target.closest ? ev.target.closest("a[data-ui-link], a[target=_blank]") : null;
    if (!a || ev.defaultPrevented || ev.button !== 0 || ev.metaKey || ev.ctrlKey || ev.shiftKey || ev.altKey) return;
    ev.preventDefault();
    var link = topDoc.createElement("a");
    link.href = a.href;
    if (a.target === "_blank") { link.target = "_blank"; link.rel = "noopener"; }
    link.style.display = "none";
    topDoc.body.appendChild(link);
    link.click();
    link.remove();
  });
})();
