/* microbatch-tuner dashboard: the profile page's charts, and error reporting for htmx
   requests. Loaded with `defer` on every page. (The calculator is rendered by the server,
   from the recommendation route's own answer.)

   The charts read GET /api/v1/profiles/{id}: the same JSON API, and the same token (the
   dashboard's cookie), as the Python client.
   Each chart keeps its uPlot instance in window.tunerCharts and on its element, so tests
   (and curious people in the console) can read exactly what was drawn. */
(function () {
  "use strict";

  const UNITS = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];

  /* The same rules as api/dashboard/format.py: three significant digits, binary units. */
  function fmtBytes(value) {
    if (value === null || value === undefined || Number.isNaN(value)) return "—";
    const sign = value < 0 ? "−" : "";
    let size = Math.abs(value);
    let unit = 0;
    while (size >= 1024 && unit < UNITS.length - 1) {
      size /= 1024;
      unit += 1;
    }
    if (unit === 0) return sign + size.toFixed(0) + " B";
    const digits = size < 10 ? 2 : size < 100 ? 1 : 0;
    return sign + size.toFixed(digits) + " " + UNITS[unit];
  }

  /* Axis ticks: no trailing zeros ("512 MiB", "1.5 GiB"). */
  function fmtBytesTick(value) {
    if (value === 0) return "0";
    let size = Math.abs(value);
    let unit = 0;
    while (size >= 1024 && unit < UNITS.length - 1) {
      size /= 1024;
      unit += 1;
    }
    return (value < 0 ? "−" : "") + String(Number(size.toFixed(2))) + " " + UNITS[unit];
  }

  function fmtRate(value) {
    if (value === null || value === undefined) return "—";
    if (value >= 100) return Math.round(value).toLocaleString("en-US") + "/s";
    if (value >= 10) return value.toFixed(1) + "/s";
    return value.toFixed(2) + "/s";
  }

  function fmtInt(value) {
    return value === null || value === undefined ? "—" : value.toLocaleString("en-US");
  }

  /* Runs of equal sizes: [12, 12, 12, 4] reads "3×12 + 4" and [29, 29, 28] "2×29 + 28",
     as tuner.plan.format_split writes them. */
  /* Tick increments in binary units, so gridlines fall on 256 MiB, 1 GiB, ... */
  const BYTE_INCRS = (function () {
    const out = [];
    for (let unit = 0; unit <= 4; unit++) {
      for (const m of [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]) {
        out.push(m * Math.pow(1024, unit));
      }
    }
    return out.filter((v, i, all) => all.indexOf(v) === i).sort((a, b) => a - b);
  })();

  /* Micro batch sizes are whole numbers: so are the x axis' ticks. */
  const SIZE_INCRS = [1, 2, 4, 5, 8, 10, 16, 20, 25, 32, 50, 64, 100, 128, 200, 250, 256, 500, 512, 1000, 1024, 2000, 2048, 4096, 5000, 8192, 10000, 16384, 32768, 65536];

  class ApiError extends Error {
    constructor(status, code, message) {
      super(message);
      this.status = status;
      this.code = code;
    }
  }

  /* GET a JSON API path; a non-2xx answer becomes an ApiError with the API's message. */
  async function getJson(path) {
    let response;
    try {
      response = await fetch(path, {
        credentials: "same-origin",
        headers: { Accept: "application/json" },
      });
    } catch (err) {
      throw new ApiError(0, "network", "the service did not answer (" + err.message + ")");
    }
    let body = null;
    try {
      body = await response.json();
    } catch (_err) {
      body = null;
    }
    if (!response.ok) {
      const error = body && body.error ? body.error : {};
      let message = error.message || response.status + " " + response.statusText;
      if (response.status === 401) message += " (sign in again)";
      throw new ApiError(response.status, error.code || "http_error", message);
    }
    return body;
  }

  function cssVar(name) {
    return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
  }

  function showChartError(el, message) {
    el.replaceChildren();
    const box = document.createElement("p");
    box.className = "error-box";
    box.setAttribute("role", "alert");
    box.textContent = "Could not draw the chart: " + message;
    el.appendChild(box);
    el.dataset.error = message;
  }

  function showChartEmpty(el, message) {
    el.replaceChildren();
    const p = document.createElement("p");
    p.className = "chart-status";
    p.textContent = message;
    el.appendChild(p);
    el.dataset.empty = "true";
  }

  /* The last probe at each size (as tuner.results.Profile.probe_at reads them), by size. */
  function lastBySize(probes) {
    const bySize = new Map();
    for (const p of probes) bySize.set(p.micro_batch_size, p);
    return bySize;
  }

  function footprint(p) {
    return p.peak_reserved_bytes === null ? null : p.peak_reserved_bytes + p.non_torch_bytes;
  }

  /* Series of the memory chart: x = 0, every probed size, and the size training reported
     running out of memory at (oomLimit, the limit answers stay below), if any. */
  function memoryData(profile, oomLimit) {
    const bySize = lastBySize(profile.probes);
    const probed = Array.from(bySize.keys());
    if (oomLimit > 0 && !bySize.has(oomLimit)) probed.push(oomLimit);
    const sizes = probed.sort((a, b) => a - b);
    const xs = [0].concat(sizes.filter((s) => s !== 0));
    const capacity = profile.device.capacity_bytes;
    const budget = profile.budget_bytes;
    const fit = profile.fit;
    const outside = profile.probes.some((p) => p.non_torch_bytes !== 0);
    const at = (x) => bySize.get(x) || null;
    const series = [
      { key: "allocated", label: "peak allocated", values: xs.map((x) => (at(x) ? at(x).peak_allocated_bytes : null)) },
      { key: "reserved", label: "peak reserved", values: xs.map((x) => (at(x) ? at(x).peak_reserved_bytes : null)) },
    ];
    if (outside) {
      series.push({ key: "footprint", label: "reserved + outside torch", values: xs.map((x) => (at(x) ? footprint(at(x)) : null)) });
    }
    if (fit) {
      series.push({ key: "fit", label: "affine fit", values: xs.map((x) => fit.fixed_bytes + fit.bytes_per_sample * x) });
    }
    series.push({ key: "budget", label: "budget", values: xs.map(() => budget) });
    series.push({ key: "capacity", label: "capacity", values: xs.map(() => capacity) });
    // A probe that ran out of memory before its step finished has no peak: it is marked
    // on the capacity line, where it hit the wall.
    series.push({
      key: "failed",
      label: "does not fit",
      values: xs.map((x) => {
        const p = at(x);
        if (!p || p.fits) return null;
        const y = footprint(p);
        return y === null ? capacity : y;
      }),
    });
    if (oomLimit > 0) {
      // Drawn on the capacity line, where training hit the wall, as a failed probe is.
      series.push({
        key: "oom",
        label: "OOM in training: at most " + (oomLimit - 1),
        values: xs.map((x) => (x === oomLimit ? capacity : null)),
      });
    }
    const mstar = profile.max_micro_batch_size;
    series.push({
      key: "max",
      label: "M* = " + mstar,
      values: xs.map((x) => (x === mstar && at(x) && at(x).fits ? footprint(at(x)) : null)),
    });
    return { xs, series };
  }

  function throughputData(profile) {
    const bySize = lastBySize(profile.probes.filter((p) => p.fits && p.samples_per_second !== null));
    const xs = Array.from(bySize.keys()).sort((a, b) => a - b);
    const mstar = profile.max_micro_batch_size;
    return {
      xs,
      series: [
        { key: "speed", label: "samples/s", values: xs.map((x) => bySize.get(x).samples_per_second) },
        { key: "max", label: "M* = " + mstar, values: xs.map((x) => (x === mstar ? bySize.get(x).samples_per_second : null)) },
      ],
    };
  }

  function chartSize(el, tall) {
    const width = Math.max(280, el.clientWidth);
    const narrow = width < 560;
    return { width, height: tall ? (narrow ? 260 : 340) : narrow ? 200 : 240 };
  }

  function styleFor(key) {
    const failed = cssVar("--chart-failed");
    const max = cssVar("--chart-max");
    const styles = {
      allocated: { stroke: cssVar("--chart-allocated"), width: 2, points: { show: true, size: 7 }, spanGaps: true },
      reserved: { stroke: cssVar("--chart-reserved"), width: 2, points: { show: true, size: 7 }, spanGaps: true },
      footprint: { stroke: cssVar("--chart-footprint"), width: 1.5, dash: [2, 3], points: { show: true, size: 5 }, spanGaps: true },
      fit: { stroke: cssVar("--chart-fit"), width: 1.5, dash: [8, 5], points: { show: false } },
      budget: { stroke: cssVar("--chart-capacity"), width: 1, dash: [3, 3], points: { show: false } },
      capacity: { stroke: cssVar("--chart-capacity"), width: 2, points: { show: false } },
      failed: { stroke: failed, width: 0, paths: () => null, points: { show: true, size: 13, width: 2.5, stroke: failed, fill: cssVar("--panel") } },
      oom: { stroke: cssVar("--chart-oom"), width: 0, paths: () => null, points: { show: true, size: 15, width: 3, stroke: cssVar("--chart-oom"), fill: cssVar("--chart-oom") } },
      max: { stroke: max, width: 0, paths: () => null, points: { show: true, size: 14, width: 2.5, stroke: max, fill: max } },
      speed: { stroke: cssVar("--chart-speed"), width: 2, points: { show: true, size: 7 }, spanGaps: true },
    };
    return styles[key];
  }

  /* A dashed vertical line at a size (M*, the OOM reported in training), under the series. */
  function markSize(size, colour) {
    return function (u) {
      if (!(size > 0)) return;
      const x = Math.round(u.valToPos(size, "x", true));
      const ctx = u.ctx;
      ctx.save();
      ctx.strokeStyle = cssVar(colour);
      ctx.setLineDash([4, 4]);
      ctx.lineWidth = 1;
      ctx.beginPath();
      ctx.moveTo(x, u.bbox.top);
      ctx.lineTo(x, u.bbox.top + u.bbox.height);
      ctx.stroke();
      ctx.restore();
    };
  }

  function axis(label, extra) {
    const grid = cssVar("--chart-grid");
    return Object.assign(
      { label, stroke: cssVar("--chart-axis"), grid: { stroke: grid, width: 1 }, ticks: { stroke: grid, width: 1 } },
      extra || {},
    );
  }

  function drawChart(el, name, built, opts) {
    const { xs, series } = built;
    const size = chartSize(el, opts.tall);
    const uSeries = [{ label: "micro batch", value: (_u, v) => (v === null ? "—" : fmtInt(v)) }].concat(
      series.map((s) => Object.assign({ label: s.label, value: (_u, v) => (v === null || v === undefined ? "—" : opts.format(v)) }, styleFor(s.key))),
    );
    const maxX = xs.length ? xs[xs.length - 1] : 1;
    const config = {
      width: size.width,
      height: size.height,
      scales: {
        x: { time: false, range: (_u, min, max) => [opts.tall ? 0 : Math.max(0, min - Math.max(1, maxX * 0.04)), max + Math.max(1, maxX * 0.04)] },
        y: { range: (_u, _min, max) => [0, (max || 1) * 1.08] },
      },
      axes: [axis("micro batch size", { incrs: SIZE_INCRS, values: (_u, ticks) => ticks.map((t) => fmtInt(t)) }), axis(opts.yLabel, opts.yAxis)],
      series: uSeries,
      legend: { live: true },
      cursor: { points: { size: 8 } },
      hooks: { drawClear: [markSize(opts.mstar, "--chart-max"), markSize(opts.oomLimit, "--chart-oom")] },
    };
    if (opts.bands) config.bands = opts.bands(series);
    el.replaceChildren();
    const u = new uPlot(config, [xs].concat(series.map((s) => s.values)), el);
    el.tunerChart = u;
    el.dataset.series = JSON.stringify(series.map((s) => s.key));
    el.dataset.drawn = "true";
    window.tunerCharts[name] = u;
    if (typeof ResizeObserver === "function") {
      let last = size.width;
      new ResizeObserver(() => {
        const next = chartSize(el, opts.tall);
        if (Math.abs(next.width - last) > 2) {
          last = next.width;
          u.setSize(next);
        }
      }).observe(el);
    }
    return u;
  }

  async function initCharts() {
    const memoryEl = document.getElementById("memory-chart");
    if (!memoryEl) return;
    const throughputEl = document.getElementById("throughput-chart");
    window.tunerCharts = window.tunerCharts || {};
    let profile;
    try {
      if (typeof uPlot !== "function") throw new Error("the chart library did not load");
      profile = await getJson(memoryEl.dataset.profileUrl);
    } catch (err) {
      showChartError(memoryEl, err.message);
      if (throughputEl) showChartError(throughputEl, err.message);
      return;
    }
    const mstar = profile.max_micro_batch_size;
    if (!profile.probes.length) {
      showChartEmpty(memoryEl, "This profile has no probes to draw.");
    } else {
      const oomLimit = Number(memoryEl.dataset.oomLimit || 0);
      const memory = memoryData(profile, oomLimit);
      drawChart(memoryEl, "memory", memory, {
        tall: true,
        mstar,
        oomLimit,
        format: fmtBytes,
        yLabel: "peak memory",
        yAxis: { values: (_u, ticks) => ticks.map(fmtBytesTick), incrs: BYTE_INCRS, size: 78 },
        bands: (series) => {
          const index = (key) => 1 + series.findIndex((s) => s.key === key);
          return [{ series: [index("capacity"), index("budget")], fill: cssVar("--chart-band") }];
        },
      });
    }
    if (throughputEl) {
      const speed = throughputData(profile);
      if (!speed.xs.length) {
        showChartEmpty(throughputEl, "No throughput was measured: no probe that fits recorded its samples per second.");
      } else {
        drawChart(throughputEl, "throughput", speed, {
          tall: false,
          mstar,
          format: fmtRate,
          yLabel: "samples per second",
          yAxis: { values: (_u, ticks) => ticks.map((t) => fmtInt(t)), size: 64 },
        });
      }
    }
  }

  /* An htmx request that fails is said so on the page, never dropped silently. */
  function reportHtmxErrors() {
    function banner(message) {
      let box = document.getElementById("request-error");
      if (!box) {
        box = document.createElement("p");
        box.id = "request-error";
        box.className = "error-box";
        box.setAttribute("role", "alert");
        const main = document.getElementById("main");
        main.insertBefore(box, main.firstChild);
      }
      box.textContent = message;
    }
    document.body.addEventListener("htmx:responseError", (event) => {
      const xhr = event.detail.xhr;
      let message = xhr.status + " " + xhr.statusText;
      const page = new DOMParser().parseFromString(xhr.responseText || "", "text/html");
      const explained = page.querySelector(".error-box");
      if (explained) message += ": " + explained.textContent.trim();
      banner("The page could not be updated: " + message);
    });
    document.body.addEventListener("htmx:sendError", () => {
      banner("The page could not be updated: the service did not answer. Is it still running?");
    });
  }

  /* A table wider than the screen scrolls sideways; a line above it says so, while it
     does (re-checked when the window changes size, and after htmx swaps a part). */
  function hintWideTables() {
    for (const wrap of document.querySelectorAll(".table-wrap")) {
      const wide = wrap.scrollWidth > wrap.clientWidth + 1;
      let hint = wrap.previousElementSibling;
      if (!(hint && hint.classList.contains("scroll-hint"))) hint = null;
      if (wide && !hint) {
        hint = document.createElement("p");
        hint.className = "scroll-hint";
        hint.textContent = "Scroll sideways for more columns →";
        wrap.parentNode.insertBefore(hint, wrap);
      } else if (!wide && hint) {
        hint.remove();
      }
      if (wide) wrap.dataset.scrolls = "true";
      else delete wrap.dataset.scrolls;
    }
  }

  /* The landing page's calculator sends only the fields the reader set (in the page's URL,
     data-given, or in the form since): the service fills the others in from the run of the
     workload asked, so choosing another workload asks at its own world size and parallel
     mode; the URL keeps only what the reader chose. After each answer, the fields the
     reader did not set show the question the service answered. */
  function followTheWorkload() {
    const form = document.getElementById("calc-form");
    if (!form || form.dataset.given === undefined) return;
    const set = new Set(form.dataset.given.split(" ").filter(Boolean));
    const mark = (event) => {
      if (event.target.name) set.add(event.target.name);
    };
    form.addEventListener("input", mark);
    form.addEventListener("change", mark);
    form.addEventListener("htmx:configRequest", (event) => {
      // htmx 2's parameters: a proxy over the form's data that lists and deletes as an object.
      const parameters = event.detail.parameters;
      for (const name of Object.keys(parameters)) {
        if (!set.has(name)) delete parameters[name];
      }
    });
    document.body.addEventListener("htmx:afterSwap", () => {
      const answer = document.getElementById("calc-answer");
      if (!answer || !answer.dataset.question) return;
      const question = JSON.parse(answer.dataset.question);
      for (const field of form.elements) {
        if (field.name && !set.has(field.name) && field.name in question) {
          field.value = question[field.name];
        }
      }
    });
  }

  /* After Compute, the answer is brought into view below the sticky bar when it is not
     already (on a phone the form fills the screen and the answer is under it). Only a
     submit moves the page: an answer that follows a changed field leaves the reader
     where they are typing. */
  function answerInView() {
    const form = document.getElementById("calc-form");
    if (!form) return;
    let pending = false;
    // Until the reader edits the form again: the answer to a change made just before
    // Compute may settle first, and Compute's own replaces it.
    form.addEventListener("submit", () => {
      pending = true;
    });
    form.addEventListener("input", () => {
      pending = false;
    });
    document.body.addEventListener("htmx:afterSettle", () => {
      const answer = document.getElementById("calc-answer");
      if (!pending || !answer) return;
      const bar = document.querySelector(".topbar");
      const top = bar ? bar.getBoundingClientRect().bottom : 0;
      const line = answer.querySelector(".answer-line") || answer;
      const box = answer.getBoundingClientRect();
      if (box.top < top || line.getBoundingClientRect().bottom > window.innerHeight) {
        window.scrollBy({ top: box.top - top - 8, behavior: "instant" });
      }
      answer.dataset.inView = "true";
    });
  }

  /* A number field of the calculator is selected whole when it is entered, so typing
     replaces the number asked first (a question is asked by overwriting, not by editing).
     The click that entered it must not collapse the selection on its way up. */
  function selectOnEntry() {
    const form = document.getElementById("calc-form");
    if (!form) return;
    for (const field of form.querySelectorAll("input[type=number]")) {
      let entered = false;
      field.addEventListener("focus", () => {
        entered = true;
        field.select();
      });
      field.addEventListener("mouseup", (event) => {
        if (entered) event.preventDefault();
        entered = false;
      });
      field.addEventListener("blur", () => {
        entered = false;
      });
    }
  }

  /* A button with data-copy="ID" copies the text of element ID exactly (a command to
     paste in a shell); the line beside it says whether it did. Delegated from the body, so
     a part htmx swaps in works too. */
  function copyButtons() {
    document.body.addEventListener("click", async (event) => {
      const button = event.target.closest("[data-copy]");
      if (!button) return;
      const source = document.getElementById(button.dataset.copy);
      const status = document.getElementById(button.getAttribute("aria-describedby"));
      if (!source) return;
      const text = source.textContent;
      try {
        await navigator.clipboard.writeText(text);
        button.dataset.copied = text;
        if (status) status.textContent = "Copied.";
      } catch (_err) {
        // No clipboard (a page over plain HTTP, a refused permission): select the text,
        // so that the reader's own copy takes it.
        const range = document.createRange();
        range.selectNodeContents(source);
        const selection = window.getSelection();
        selection.removeAllRanges();
        selection.addRange(range);
        if (status) status.textContent = "Selected: copy it with Ctrl+C (⌘C).";
      }
    });
  }

  /* A filter form marked data-drop-empty leaves its unset fields (the "all" choices) out
     of the URL it asks and pushes, so a shared link names only the filters set. */
  function dropEmptyFields() {
    document.body.addEventListener("htmx:configRequest", (event) => {
      const form = event.detail.elt.closest && event.detail.elt.closest("form[data-drop-empty]");
      if (!form) return;
      const parameters = event.detail.parameters;
      for (const name of Object.keys(parameters)) {
        if (parameters[name] === "") delete parameters[name];
      }
    });
  }

  window.tunerFormat = { fmtBytes, fmtBytesTick, fmtRate, BYTE_INCRS };

  function start() {
    hintWideTables();
    window.addEventListener("resize", hintWideTables);
    document.body.addEventListener("htmx:afterSettle", hintWideTables);
    reportHtmxErrors();
    followTheWorkload();
    answerInView();
    selectOnEntry();
    copyButtons();
    dropEmptyFields();
    initCharts();
  }

  // Tests read this mark as the moment the page became usable: deferred scripts run before
  // DOMContentLoaded, so by then htmx has processed the page and the handlers are wired.
  function markReady() {
    document.documentElement.dataset.ready = String(Math.round(performance.now()));
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
    document.addEventListener("DOMContentLoaded", markReady);
  } else {
    start();
    markReady();
  }
})();
