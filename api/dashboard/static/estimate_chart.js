/* microbatch-tuner dashboard: measured points and the estimate line through them, against
   world size on the workload page and against sequence length on a length family's page.

   The server computes the points and the estimates (api/dashboard/worlds.py and
   api/dashboard/lengths.py, with the fits the recommendation endpoint answers with) and puts
   them in data-chart-data: {xs, series: [{key, label, values, mode?, colour?}]}. A series
   whose key ends in "-estimated" is a dashed line; the others are points. The element names
   its axes (data-x-label, data-y-label; data-x-steps, a JSON list of tick steps, optional).
   Each chart's uPlot instance is kept in window.tunerCharts[<data-estimate-chart>], so tests
   can read exactly what was drawn. */
(function () {
  "use strict";

  const COLOURS = { none: "--chart-footprint", ddp: "--chart-allocated", fsdp: "--chart-reserved" };

  function cssVar(name) {
    return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
  }

  function style(series) {
    const colour = cssVar(series.colour || COLOURS[series.mode] || "--chart-fit");
    if (series.key.endsWith("-estimated")) {
      return { stroke: colour, width: 1.5, dash: [6, 4], points: { show: false }, spanGaps: true };
    }
    return { stroke: colour, width: 0, paths: () => null, points: { show: true, size: 10, width: 2, stroke: colour, fill: colour } };
  }

  function draw(el) {
    const data = JSON.parse(el.dataset.chartData);
    const grid = cssVar("--chart-grid");
    const axis = (label, extra) =>
      Object.assign({ label, stroke: cssVar("--chart-axis"), grid: { stroke: grid, width: 1 }, ticks: { stroke: grid, width: 1 } }, extra || {});
    const size = () => {
      const width = Math.max(280, el.clientWidth);
      return { width, height: width < 560 ? 200 : 260 };
    };
    const xAxis = el.dataset.xSteps ? { incrs: JSON.parse(el.dataset.xSteps) } : {};
    // A little room either side, so that the first and last points are not cut in half.
    const pad = (min, max) => Math.max(0.5, (max - min) * 0.02);
    const config = Object.assign(size(), {
      scales: { x: { time: false, range: (_u, min, max) => [min - pad(min, max), max + pad(min, max)] }, y: { range: (_u, _min, max) => [0, (max || 1) * 1.1] } },
      axes: [axis(el.dataset.xLabel, xAxis), axis(el.dataset.yLabel, { values: (_u, ticks) => ticks.map((t) => (Number.isInteger(t) ? t.toLocaleString("en") : "")) })],
      series: [{ label: el.dataset.xLabel }].concat(data.series.map((s) => Object.assign({ label: s.label }, style(s)))),
      legend: { live: true },
    });
    el.replaceChildren();
    const u = new uPlot(config, [data.xs].concat(data.series.map((s) => s.values)), el);
    el.dataset.series = JSON.stringify(data.series.map((s) => s.key));
    el.dataset.drawn = "true";
    window.tunerCharts[el.dataset.estimateChart] = u;
    window.tunerFollowWidth(el, u, size);
  }

  window.tunerDrawCharts("[data-estimate-chart]", draw);
})();
