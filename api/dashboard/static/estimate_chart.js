/* microbatch-tuner dashboard: measured points and the estimate line through them, against
   world size on the workload page and against sequence length on a length family's page.

   The server computes the points and the estimates (api/dashboard/worlds.py and
   api/dashboard/lengths.py, with the fits the recommendation endpoint answers with) and puts
   them in data-chart-data: {xs, series: [{key, label, values, colour, shape, dash}]}. A
   series whose key ends in "-estimated" is a line in its dash; the others are points in
   their shape. A series with `line` ("solid" or "dashed") is a line through markers
   (`marker`: "circle" or "square"). The element names its axes (data-x-label,
   data-y-label; data-x-steps, a JSON list of tick steps, optional; data-y-unit="bytes"
   for memory).
   Each chart's uPlot instance is kept in window.tunerCharts[<data-estimate-chart>], so tests
   can read exactly what was drawn. */
(function () {
  "use strict";

  function cssVar(name) {
    return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
  }

  /* A marker's outline at (x, y), in canvas pixels, r its half-size. */
  function shapePath(shape, x, y, r) {
    const path = new Path2D();
    if (shape === "square") path.rect(x - r, y - r, 2 * r, 2 * r);
    else if (shape === "triangle") {
      path.moveTo(x, y - 1.15 * r);
      path.lineTo(x + 1.1 * r, y + 0.85 * r);
      path.lineTo(x - 1.1 * r, y + 0.85 * r);
      path.closePath();
    } else if (shape === "diamond") {
      path.moveTo(x, y - 1.3 * r);
      path.lineTo(x + 1.3 * r, y);
      path.lineTo(x, y + 1.3 * r);
      path.lineTo(x - 1.3 * r, y);
      path.closePath();
    } else if (shape === "cross") {
      const t = 0.4 * r;
      path.rect(x - r, y - t, 2 * r, 2 * t);
      path.rect(x - t, y - r, 2 * t, 2 * r);
    } else path.arc(x, y, r, 0, 2 * Math.PI);
    return path;
  }

  /* Series are told apart by more than colour: each measured series' points are drawn in
     its own shape (circle, square, triangle, ...), each estimate line in its own dash, and
     every label starts with the shape's sign. uPlot draws the lines; this hook the points. */
  function drawMarkers(data) {
    return function (u) {
      const ctx = u.ctx;
      const r = 5 * (window.devicePixelRatio || 1);
      data.series.forEach((s, i) => {
        if (s.key.endsWith("-estimated") || s.line) return;
        ctx.save();
        ctx.fillStyle = cssVar(s.colour);
        ctx.strokeStyle = cssVar("--panel") || "#fff";
        ctx.lineWidth = 1;
        s.values.forEach((v, j) => {
          if (v === null || v === undefined) return;
          const path = shapePath(s.shape, u.valToPos(data.xs[j], "x", true), u.valToPos(v, "y", true), r);
          ctx.fill(path);
          ctx.stroke(path);
        });
        ctx.restore();
      });
    };
  }

  /* Square markers: with a dashed line, what tells a series apart without its colour. */
  function squares(u, seriesIdx, idx0, idx1) {
    const s = u.series[seriesIdx];
    const side = s.points.size * uPlot.pxRatio;
    const xs = u.data[0];
    const ys = u.data[seriesIdx];
    const path = new Path2D();
    for (let i = idx0; i <= idx1; i++) {
      if (ys[i] === null || ys[i] === undefined) continue;
      const x = u.valToPos(xs[i], "x", true);
      const y = u.valToPos(ys[i], s.scale, true);
      path.rect(x - side / 2, y - side / 2, side, side);
    }
    return { stroke: path, fill: path };
  }

  function style(series) {
    const colour = cssVar(series.colour || "--chart-fit");
    if (series.line) {
      // A series that says how it is drawn: a line (solid or dashed) through markers
      // (circles or squares), so that two series differ in more than colour.
      const points = { show: true, size: 9, width: 2, stroke: colour, fill: colour };
      if (series.marker === "square") points.paths = squares;
      return { stroke: colour, width: 2, dash: series.line === "dashed" ? [7, 5] : undefined, points, spanGaps: true };
    }
    if (series.key.endsWith("-estimated")) {
      return { stroke: colour, width: 1.5, dash: series.dash || [6, 4], points: { show: false }, spanGaps: true };
    }
    // Drawn by drawMarkers; uPlot keeps the series for its legend and cursor.
    return { stroke: colour, width: 0, paths: () => null, points: { show: false } };
  }

  /* The points by keyboard: the chart takes focus, the arrow keys (Home, End) move the
     cursor from one world size drawn to the next, and a line under the chart reads every
     series' value there, as the legend does on hover. */
  function byKeyboard(el, u, data) {
    const readout = document.createElement("p");
    readout.className = "chart-readout";
    readout.setAttribute("aria-live", "polite");
    el.appendChild(readout);
    el.tabIndex = 0;
    el.setAttribute("aria-keyshortcuts", "ArrowLeft ArrowRight Home End");
    const shown = data.xs.map((_x, i) => i).filter((i) => data.series.some((s) => s.values[i] !== null && s.values[i] !== undefined));
    let at = -1;
    el.addEventListener("keydown", (event) => {
      const moves = { ArrowRight: at + 1, ArrowLeft: at - 1, Home: 0, End: shown.length - 1 };
      if (!(event.key in moves) || !shown.length) return;
      event.preventDefault();
      at = Math.max(0, Math.min(shown.length - 1, moves[event.key]));
      const i = shown[at];
      const first = data.series.find((s) => s.values[i] !== null && s.values[i] !== undefined);
      u.setCursor({ left: u.valToPos(data.xs[i], "x"), top: u.valToPos(first.values[i], "y") });
      const values = data.series
        .filter((s) => s.values[i] !== null && s.values[i] !== undefined)
        .map((s) => s.label + " " + s.values[i].toLocaleString("en"));
      readout.textContent = el.dataset.xLabel + " " + data.xs[i].toLocaleString("en") + ": " + values.join(", ");
    });
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
    // data-y-unit="bytes": memory, in binary units (dashboard.js's format).
    const bytes = el.dataset.yUnit === "bytes" && window.tunerFormat;
    const count = (t) => (Number.isInteger(t) ? t.toLocaleString("en") : "");
    const yAxis = bytes ? { values: (_u, ticks) => ticks.map(window.tunerFormat.fmtBytesTick), incrs: window.tunerFormat.BYTE_INCRS, size: 78 } : { values: (_u, ticks) => ticks.map(count) };
    // A little room either side, so that the first and last points are not cut in half.
    const pad = (min, max) => Math.max(0.5, (max - min) * 0.02);
    const config = Object.assign(size(), {
      scales: { x: { time: false, range: (_u, min, max) => [min - pad(min, max), max + pad(min, max)] }, y: { range: (_u, _min, max) => [0, (max || 1) * 1.1] } },
      axes: [axis(el.dataset.xLabel, xAxis), axis(el.dataset.yLabel, yAxis)],
      series: [{ label: el.dataset.xLabel }].concat(data.series.map((s) => Object.assign({ label: s.label }, bytes ? { value: (_u, v) => (v === null || v === undefined ? "—" : window.tunerFormat.fmtBytes(v)) } : {}, style(s)))),
      legend: { live: true },
      hooks: { draw: [drawMarkers(data)] },
    });
    el.replaceChildren();
    const u = new uPlot(config, [data.xs].concat(data.series.map((s) => s.values)), el);
    el.dataset.series = JSON.stringify(data.series.map((s) => s.key));
    el.dataset.drawn = "true";
    // When, in ms since the page's navigation started: what a reader waits for the chart.
    el.dataset.drawnAt = String(Math.round(performance.now()));
    window.tunerCharts[el.dataset.estimateChart] = u;
    byKeyboard(el, u, data);
    window.tunerFollowWidth(el, u, size);
  }

  window.tunerDrawCharts("[data-estimate-chart]", draw);
})();
