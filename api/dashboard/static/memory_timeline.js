/* microbatch-tuner dashboard: live bytes over the step at M* (the profile page).

   The server puts the timeline in data-chart-data (api/dashboard/timeline.py):
   {unit, x, y, operators, phases: [{label, phase, start, end}], peak: {x, y, operator}}.
   Live bytes are drawn as steps; each phase is a band with its label written in it (F1, B1,
   F2, B2, O: the letter says which phase, not only the shade), and the peak is a ring with
   its value written beside it. The chart takes the keyboard: ← and → move along the points,
   Home and End go to the ends, P to the peak; the readout below says the point's position,
   bytes, operator and phase. The uPlot instance is window.tunerCharts.timeline, so tests can
   read what was drawn. */
(function () {
  "use strict";

  const UNITS = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
  const SHORT = { forward: "F", backward: "B", optimizer: "O" };
  // Phases alternate two shades (and carry their letters), so neighbours stay apart.
  const SHADES = { forward: "rgba(47, 91, 211, 0.10)", backward: "rgba(112, 72, 184, 0.13)", optimizer: "rgba(11, 125, 110, 0.15)" };

  function fmtBytes(value) {
    let size = Math.abs(value);
    let unit = 0;
    while (size >= 1024 && unit < UNITS.length - 1) {
      size /= 1024;
      unit += 1;
    }
    if (unit === 0) return size.toFixed(0) + " B";
    return size.toFixed(size < 10 ? 2 : size < 100 ? 1 : 0) + " " + UNITS[unit];
  }

  function cssVar(name) {
    return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
  }

  function phaseAt(data, x) {
    return data.phases.find((p) => p.start < x && x <= p.end);
  }

  function shortLabel(p) {
    const number = p.label.split(" ")[1];
    return SHORT[p.phase] + (number || "");
  }

  function drawPhases(data) {
    return function (u) {
      const ctx = u.ctx;
      const top = u.bbox.top;
      const height = u.bbox.height;
      ctx.save();
      ctx.font = Math.round(11 * devicePixelRatio) + "px system-ui, sans-serif";
      ctx.textBaseline = "top";
      ctx.textAlign = "left";
      for (const p of data.phases) {
        const left = u.valToPos(p.start, "x", true);
        const right = u.valToPos(p.end, "x", true);
        ctx.fillStyle = SHADES[p.phase];
        ctx.fillRect(left, top, right - left, height);
        ctx.strokeStyle = cssVar("--chart-axis");
        ctx.setLineDash([3, 3]);
        ctx.beginPath();
        ctx.moveTo(Math.round(right) + 0.5, top);
        ctx.lineTo(Math.round(right) + 0.5, top + height);
        ctx.stroke();
        ctx.fillStyle = cssVar("--chart-axis");
        const label = shortLabel(p);
        if (right - left > ctx.measureText(label).width + 4) ctx.fillText(label, left + 3, top + 3);
      }
      ctx.restore();
    };
  }

  function drawPeak(data) {
    return function (u) {
      const x = u.valToPos(data.peak.x, "x", true);
      const y = u.valToPos(data.peak.y, "y", true);
      const ctx = u.ctx;
      ctx.save();
      ctx.strokeStyle = cssVar("--chart-capacity");
      ctx.lineWidth = 2 * devicePixelRatio;
      ctx.beginPath();
      ctx.arc(x, y, 6 * devicePixelRatio, 0, 2 * Math.PI);
      ctx.stroke();
      ctx.font = "bold " + Math.round(11 * devicePixelRatio) + "px system-ui, sans-serif";
      ctx.textAlign = "left"; // uPlot leaves its axes' alignment on the context
      const text = "peak " + fmtBytes(data.peak.y);
      const width = ctx.measureText(text).width;
      const right = u.bbox.left + u.bbox.width;
      const left = x + width + 12 > right ? x - 10 - width : x + 10;
      const baseline = Math.max(u.bbox.top + 14 * devicePixelRatio, y - 4);
      // On the panel's colour, so that the line under it does not cross the words.
      ctx.fillStyle = cssVar("--panel");
      ctx.fillRect(left - 2, baseline - 12 * devicePixelRatio, width + 4, 15 * devicePixelRatio);
      ctx.fillStyle = cssVar("--chart-capacity");
      ctx.fillText(text, left, baseline);
      ctx.restore();
    };
  }

  function describe(data, i) {
    const phase = phaseAt(data, data.x[i]);
    const peak = data.x[i] === data.peak.x && data.y[i] === data.peak.y ? " · the peak" : "";
    return data.unit + " " + data.x[i].toLocaleString("en-US") + " · " + fmtBytes(data.y[i]) + " · " + data.operators[i] + " · " + (phase ? phase.label : "start") + peak;
  }

  function draw(el) {
    const data = JSON.parse(el.dataset.chartData);
    const readout = document.getElementById(el.getAttribute("aria-describedby"));
    const size = () => {
      const width = Math.max(280, el.clientWidth);
      return { width, height: width < 560 ? 220 : 300 };
    };
    const grid = cssVar("--chart-grid");
    const axis = (label, extra) => Object.assign({ label, stroke: cssVar("--chart-axis"), grid: { stroke: grid, width: 1 }, ticks: { stroke: grid, width: 1 } }, extra || {});
    const config = Object.assign(size(), {
      scales: { x: { time: false }, y: { range: (_u, _min, max) => [0, (max || 1) * 1.12] } },
      axes: [axis(data.unit), axis("live bytes", { size: 70, values: (_u, ticks) => ticks.map(fmtBytes) })],
      series: [
        { label: data.unit },
        { label: "live", stroke: cssVar("--chart-allocated"), width: 2, paths: uPlot.paths.stepped({ align: 1 }), points: { show: false }, value: (_u, v) => (v === null ? "—" : fmtBytes(v)) },
      ],
      hooks: { drawClear: [drawPhases(data)], draw: [drawPeak(data)] },
      legend: { live: true },
    });
    el.replaceChildren();
    const u = new uPlot(config, [data.x, data.y], el);
    window.tunerCharts.timeline = u;
    el.dataset.drawn = "true";
    el.dataset.points = String(data.x.length);
    el.dataset.phases = data.phases.map(shortLabel).join(" ");

    let at = data.y.indexOf(data.peak.y);
    function show(i) {
      at = Math.max(0, Math.min(data.x.length - 1, i));
      u.setCursor({ left: u.valToPos(data.x[at], "x"), top: u.valToPos(data.y[at], "y") });
      if (readout) readout.textContent = describe(data, at);
      el.dataset.cursor = String(at);
    }
    el.addEventListener("keydown", (event) => {
      const step = event.shiftKey ? 10 : 1;
      const moves = { ArrowRight: at + step, ArrowLeft: at - step, Home: 0, End: data.x.length - 1, p: data.y.indexOf(data.peak.y), P: data.y.indexOf(data.peak.y) };
      if (!(event.key in moves)) return;
      event.preventDefault();
      show(moves[event.key]);
    });
    el.addEventListener("focus", () => show(at));
    window.tunerFollowWidth(el, u, size);
  }

  window.tunerDrawCharts("[data-timeline-chart]", draw);
})();
