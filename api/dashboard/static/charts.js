/* microbatch-tuner dashboard: what the server-fed charts share (estimate_chart.js and
   memory_timeline.js). window.tunerDrawCharts(selector, draw) draws each element the
   selector finds once the page is read, or says in the element why it cannot;
   window.tunerFollowWidth(el, u, size) keeps a uPlot chart as wide as its container (a
   phone turned, a window resized). Loaded before the scripts that use it. */
(function () {
  "use strict";

  window.tunerFollowWidth = function (el, u, size) {
    if (typeof ResizeObserver !== "function") return;
    let last = u.width;
    new ResizeObserver(() => {
      const next = size();
      if (Math.abs(next.width - last) > 2) {
        last = next.width;
        u.setSize(next);
      }
    }).observe(el);
  };

  window.tunerDrawCharts = function (selector, draw) {
    function start() {
      window.tunerCharts = window.tunerCharts || {};
      for (const el of document.querySelectorAll(selector)) {
        try {
          if (typeof uPlot !== "function") throw new Error("the chart library did not load");
          draw(el);
        } catch (err) {
          el.dataset.error = "true";
          el.replaceChildren(Object.assign(document.createElement("p"), { className: "chart-status error", textContent: "Cannot draw this chart: " + err.message }));
        }
      }
    }
    // On DOMContentLoaded, which follows every deferred script: dashboard.js, loaded after
    // the charts, has set window.tunerFormat by then.
    if (document.readyState === "complete") start();
    else document.addEventListener("DOMContentLoaded", start);
  };
})();
