// gradguard report: draws the run embedded in #report-data (written by
// src/apps/html_report.cpp) with uPlot. Every step chart shares one cursor and one
// zoom; the time charts share another. The page records what it drew in #report-status
// (charts drawn, pixels inked inside each plot area, script errors) so a headless
// browser can check it without a screenshot diff.
(function () {
  "use strict";
  const status = { charts: {}, errors: [] };
  window.addEventListener("error", (e) => status.errors.push(String(e.message || e)));

  const D = JSON.parse(document.getElementById("report-data").textContent);
  const $ = (id) => document.getElementById(id);
  const css = (name) => getComputedStyle(document.documentElement).getPropertyValue(name).trim();
  // Series colours; red, orange and purple are kept for the markers (skipped, anomaly, rollback).
  const palette = ["#1f77b4", "#2ca02c", "#17becf", "#8c564b", "#e377c2", "#bcbd22", "#7f7f7f", "#393b79",
                   "#637939", "#0b6e4f"];
  const fmt = (v, digits) => {
    if (v === null || v === undefined || !isFinite(v)) return "–";
    const a = Math.abs(v);
    if (a !== 0 && (a < 1e-3 || a >= 1e6)) return v.toExponential(digits === undefined ? 3 : digits);
    return (+v.toPrecision(digits === undefined ? 5 : digits)).toString();
  };
  const esc = (s) => String(s).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
  const positive = (arr) => arr.map((v) => (v !== null && v > 0 ? v : null));
  const hasData = (arr) => Array.isArray(arr) && arr.some((v) => v !== null && isFinite(v));
  const width = (el) => Math.max(320, Math.floor(el.clientWidth || document.body.clientWidth || 900));

  // ---- header --------------------------------------------------------------------------
  $("title").textContent = "gradguard report: " + D.run.name;
  document.title = "gradguard: " + D.run.name;
  $("subtitle").textContent = D.run.dir + " · written " + D.run.generated + " by gradguard " + D.run.version;
  const S = D.summary;
  const cards = [
    ["steps", S.steps_logged === 0 ? "0" : S.first_step + "–" + S.last_step],
    ["final train loss", fmt(S.final_loss, 4)],
    ["best val loss", fmt(S.best_val_loss, 4)],
    ["median tokens/s", fmt(S.median_tokens_per_s, 4)],
    ["wall time", S.wall_s === null ? "–" : (S.wall_s / 60).toFixed(1) + " min"],
    ["skipped steps", S.skipped],
    ["anomalies", S.anomalies],
    ["rollbacks", S.rollbacks],
  ];
  $("summary").innerHTML = cards.map(([k, v]) => `<div class="card"><b>${esc(v)}</b><span>${esc(k)}</span></div>`).join("");
  if (D.problems.length) {
    const p = $("problems");
    p.hidden = false;
    p.innerHTML = "<b>While reading the run:</b><br>" + D.problems.map(esc).join("<br>");
  }
  $("config").textContent = D.config || "(no config.yaml in the run directory)";
  if (D.appendix) {  // e.g. the table of `gradguard bench seed` this run belongs to
    $("appendix-section").hidden = false;
    $("appendix-title").textContent = D.appendix.title;
    $("appendix").textContent = D.appendix.text;
    $("appendix-links").innerHTML = D.appendix.links.map((l) => `<a href="${esc(l.href)}">${esc(l.label)}</a>`).join(" · ");
  }
  $("footer").textContent = "Charts: uPlot " + D.run.uplot_version + " (MIT), inlined. This file needs no network.";

  // ---- markers: skipped steps, anomalies, rollbacks as vertical lines ------------------
  const markerKinds = [["skipped", "--skip"], ["anomaly", "--anomaly"], ["rollback", "--rollback"]];
  const markersAt = new Map();  // step -> [text]
  for (const a of D.anomalies) {
    if (!markersAt.has(a.step)) markersAt.set(a.step, []);
    markersAt.get(a.step).push(a.kind + " (" + a.severity + ")" + (a.action ? " → " + a.action : ""));
  }
  for (const s of D.markers.skipped) {
    if (!markersAt.has(s)) markersAt.set(s, []);
    markersAt.get(s).push("skipped");
  }
  for (const s of D.markers.rollback) {
    if (!markersAt.has(s)) markersAt.set(s, []);
    markersAt.get(s).push("rollback");
  }
  function markersPlugin(note) {
    return {
      hooks: {
        draw: [(u) => {
          const ctx = u.ctx;
          const { left, top, width: w, height: h } = u.bbox;
          ctx.save();
          ctx.beginPath();
          ctx.rect(left, top, w, h);
          ctx.clip();
          ctx.lineWidth = Math.max(1, devicePixelRatio);
          for (const [kind, colour] of markerKinds) {
            ctx.strokeStyle = css(colour);
            ctx.setLineDash(kind === "skipped" ? [] : [4 * devicePixelRatio, 3 * devicePixelRatio]);
            for (const step of D.markers[kind]) {
              const x = Math.round(u.valToPos(step, "x", true)) + 0.5;
              if (x < left || x > left + w) continue;
              ctx.beginPath();
              ctx.moveTo(x, top);
              ctx.lineTo(x, top + h);
              ctx.stroke();
            }
          }
          ctx.restore();
        }],
        setCursor: [(u) => {
          if (!note) return;
          const i = u.cursor.idx;
          const step = i === null || i === undefined ? null : u.data[0][i];
          const texts = step === null ? null : markersAt.get(step);
          note.textContent = texts ? "step " + step + ": " + texts.join(", ") : "";
        }],
      },
    };
  }

  // ---- chart construction -------------------------------------------------------------
  const stepCharts = [];
  let syncingZoom = false;
  let ready = false;  // zooms follow each other only once every chart exists
  let heatmap = { setRange() {} };
  function zoomFollower(group) {
    return (u, key) => {
      if (!ready || key !== "x" || syncingZoom) return;
      syncingZoom = true;
      const { min, max } = u.scales.x;
      for (const other of group) if (other !== u) other.setScale("x", { min, max });
      if (group === stepCharts) heatmap.setRange(min, max);
      syncingZoom = false;
    };
  }

  // spec: {id, el, x, xLabel, series: [{label, data, colour, scale, points, dash, width}],
  //        scales: {key: {log, label, side}}, group, syncKey}
  function chart(spec) {
    const el = spec.el || $(spec.id);
    const series = spec.series.filter((s) => hasData(s.data));
    if (!series.length) {
      el.innerHTML = `<div class="empty">${esc(spec.empty || "nothing recorded")}</div>`;
      return null;
    }
    const scaleKeys = [...new Set(series.map((s) => s.scale || "y"))];
    const scales = { x: { time: false } };
    const axes = [{ label: spec.xLabel, stroke: css("--fg"), grid: { stroke: css("--line"), width: 1 } }];
    scaleKeys.forEach((k, i) => {
      const sc = (spec.scales && spec.scales[k]) || {};
      scales[k] = sc.log ? { distr: 3, log: 10 } : {};
      if (sc.range) scales[k].range = sc.range;
      axes.push({ scale: k, label: sc.label || "", side: i === 0 ? 3 : 1, stroke: css("--fg"),
                  grid: { show: i === 0, stroke: css("--line"), width: 1 }, size: 60,
                  values: (u, vals) => vals.map((v) => fmt(v, 6)) });
    });
    const opts = {
      width: width(el),
      height: spec.height || 260,
      scales,
      axes,
      legend: { live: true },
      cursor: { sync: { key: spec.syncKey, setSeries: true }, drag: { x: true, y: false } },
      series: [{ label: spec.xLabel, value: (u, v) => (v === null ? "–" : fmt(v, 6)) }].concat(series.map((s, i) => ({
        label: s.label,
        scale: s.scale || "y",
        stroke: s.colour || palette[i % palette.length],
        width: s.width || 1.5,
        dash: s.dash,
        spanGaps: false,
        paths: s.points ? () => null : undefined,
        points: s.points ? { show: true, size: 7, fill: s.colour || palette[i % palette.length] } : { show: false },
        value: (u, v) => fmt(v, 5),
      }))),
      hooks: { setScale: [zoomFollower(spec.group || [])] },
      plugins: spec.markers ? [markersPlugin(spec.note)] : [],
    };
    const isLog = (s) => { const sc = (spec.scales || {})[s.scale || "y"]; return !!(sc && sc.log); };
    const data = [spec.x].concat(series.map((s) => (isLog(s) ? positive(s.data) : s.data)));
    const u = new uPlot(opts, data, el);
    if (spec.group) spec.group.push(u);
    status.charts[el.id] = { u, series: series.length, colours: series.map((s, i) => s.colour || palette[i % palette.length]) };
    return u;
  }

  function stepChart(id, series, scales, extra) {
    const el = $(id);
    const note = document.createElement("div");
    note.className = "markers-note";
    const u = chart(Object.assign({ el, x: T.step, xLabel: "step", series, scales, group: stepCharts, syncKey: "steps",
                                    markers: true, note }, extra || {}));
    if (u) el.appendChild(note);
    return u;
  }

  // ---- step charts ----------------------------------------------------------------------
  const T = D.steps;
  // Validation runs after a step (val at step N follows step line N - 1), so its steps
  // can lie past the last step line: join both onto one x.
  const lossTable = uPlot.join([[T.step, T.loss], [D.val.step, D.val.loss]]);
  stepChart("chart-loss", [
    { label: "train loss", data: lossTable[1], colour: palette[0] },
    { label: "val loss", data: lossTable[2], colour: palette[3], points: true },
  ], { y: { label: "nats/token" } }, { empty: "no loss recorded", x: lossTable[0] });
  stepChart("chart-lr", [{ label: "learning rate", data: T.lr, colour: palette[1] }], { y: { label: "lr" } });
  stepChart("chart-grad", [
    { label: "grad norm", data: T.grad_norm, colour: palette[0], scale: "norm" },
    { label: "clip threshold", data: T.clip_threshold, colour: palette[2], scale: "norm", dash: [6, 4] },
    { label: "forecast", data: T.forecast_expected, colour: palette[5], scale: "norm", dash: [2, 3] },
    { label: "forecast band low", data: T.forecast_low, colour: palette[5], scale: "norm", width: 0.75, dash: [1, 3] },
    { label: "forecast band high", data: T.forecast_high, colour: palette[5], scale: "norm", width: 0.75, dash: [1, 3] },
    { label: "above the forecast band", data: T.forecast_breach, colour: palette[3], scale: "norm", points: true },
    { label: "clip coef", data: T.clip_coef, colour: palette[3], scale: "coef", width: 1 },
  ], { norm: { label: "L2 norm (log)", log: true }, coef: { label: "clip coefficient", range: [0, 1.05] } });
  stepChart("chart-scale", [{ label: "loss scale", data: T.loss_scale, colour: palette[4] }],
            { y: { label: "scale (log)", log: true } });
  stepChart("chart-noise", [{ label: "B_simple (sequences)", data: T.noise_scale, colour: palette[6], points: true }],
            { y: { label: "sequences" } }, { empty: "not measured in this run (guard.noise_scale.every, which needs batch.accum_steps > 1)" });

  // ---- per-layer heatmap ---------------------------------------------------------------
  heatmap = (function () {
    const box = $("heatmap");
    const canvas = box.querySelector("canvas");
    const tip = box.querySelector(".tip");
    const L = D.layers;
    let lo = 0, hi = 0;
    const cells = [];
    L.values.forEach((row) => row.forEach((v) => { if (v !== null && v > 0) cells.push(Math.log10(v)); }));
    if (!cells.length) {
      box.innerHTML = '<div class="empty">no per-layer gradient norms recorded</div>';
      return { setRange() {} };
    }
    cells.sort((a, b) => a - b);
    lo = cells[Math.floor(cells.length * 0.01)];
    hi = cells[Math.floor(cells.length * 0.995)];
    if (hi <= lo) hi = lo + 1;
    // A perceptually ordered ramp (dark blue → teal → yellow), interpolated in RGB.
    const ramp = [[33, 17, 90], [40, 90, 160], [30, 150, 140], [110, 195, 80], [250, 230, 40]];
    const colour = (v) => {
      if (v === null || !(v > 0)) return "rgba(0,0,0,0)";
      let t = (Math.log10(v) - lo) / (hi - lo);
      t = Math.min(1, Math.max(0, t)) * (ramp.length - 1);
      const i = Math.min(ramp.length - 2, Math.floor(t)), f = t - i;
      const c = ramp[i].map((a, k) => Math.round(a + (ramp[i + 1][k] - a) * f));
      return `rgb(${c[0]},${c[1]},${c[2]})`;
    };
    const labelW = 110, rowH = 18;
    let range = [L.step[0], L.step[L.step.length - 1]];
    function draw() {
      const w = width(box), h = rowH * L.names.length + 22;
      canvas.width = w * devicePixelRatio;
      canvas.height = h * devicePixelRatio;
      canvas.style.height = h + "px";
      const ctx = canvas.getContext("2d");
      ctx.scale(devicePixelRatio, devicePixelRatio);
      ctx.font = "12px system-ui, sans-serif";
      ctx.fillStyle = css("--fg");
      ctx.textBaseline = "middle";
      L.names.forEach((n, r) => ctx.fillText(n, 2, r * rowH + rowH / 2, labelW - 6));
      const cols = [];
      L.step.forEach((s, c) => { if (s >= range[0] && s <= range[1]) cols.push(c); });
      const plotW = w - labelW;
      const cw = plotW / Math.max(1, cols.length);
      L.values.forEach((row, r) => cols.forEach((c, k) => {
        ctx.fillStyle = colour(row[c]);
        ctx.fillRect(labelW + k * cw, r * rowH, Math.ceil(cw), rowH - 1);
      }));
      ctx.fillStyle = css("--muted");
      ctx.fillText("step " + (cols.length ? L.step[cols[0]] : "–"), labelW, h - 9);
      const last = "step " + (cols.length ? L.step[cols[cols.length - 1]] : "–");
      ctx.fillText(last, w - ctx.measureText(last).width - 2, h - 9);
      draw.cols = cols;
      draw.cw = cw;
    }
    canvas.addEventListener("mousemove", (e) => {
      const r = canvas.getBoundingClientRect();
      const x = e.clientX - r.left - labelW, row = Math.floor((e.clientY - r.top) / rowH);
      const k = Math.floor(x / draw.cw);
      if (x < 0 || row < 0 || row >= L.names.length || k < 0 || k >= draw.cols.length) { tip.hidden = true; return; }
      const c = draw.cols[k];
      tip.hidden = false;
      tip.textContent = `${L.names[row]} · step ${L.step[c]}${L.bin > 1 ? " (+" + (L.bin - 1) + " after, max)" : ""}: ${fmt(L.values[row][c], 4)}`;
      tip.style.left = Math.min(e.clientX - r.left + 12, r.width - 260) + "px";
      tip.style.top = (e.clientY - r.top + 12) + "px";
    });
    canvas.addEventListener("mouseleave", () => { tip.hidden = true; });
    canvas.addEventListener("dblclick", () => { range = [L.step[0], L.step[L.step.length - 1]]; draw(); });
    box.querySelector(".scale").textContent =
      `colour: log10 norm from ${lo.toFixed(2)} (dark) to ${hi.toFixed(2)} (yellow)` +
      (L.bin > 1 ? ` · each column is the max over ${L.bin} steps` : "");
    draw();
    // the cells only: right of the labels, above the step captions (device pixels)
    status.charts.heatmap = { canvas, series: L.names.length,
                              box: { left: labelW * devicePixelRatio, top: 0, width: canvas.width - labelW * devicePixelRatio,
                                     height: rowH * L.names.length * devicePixelRatio } };
    return { setRange(min, max) { range = [min, max]; draw(); }, redraw: draw };
  })();

  // ---- time charts: throughput and telemetry --------------------------------------------
  const timeCharts = [];
  chart({ id: "chart-tps", x: T.elapsed_s, xLabel: "seconds", group: timeCharts, syncKey: "time",
          series: [{ label: "tokens/s", data: T.tokens_per_s, colour: palette[0] }], scales: { y: { label: "tokens/s" } },
          empty: "no throughput recorded" });
  const groups = [
    ["CPU", /^cpu_percent$/, "percent of one core"],
    ["Memory", /^(rss_mb|gpu\d+_memory_used_mb)$/, "MiB"],
    ["Temperature", /^gpu\d+_temperature_c$/, "°C"],
    ["Power", /^gpu\d+_power_w$/, "W"],
    ["GPU utilisation", /^gpu\d+_utilization_pct$/, "percent"],
    ["Clocks", /^gpu\d+_(sm|memory)_clock_mhz$/, "MHz"],
  ];
  const telBox = $("telemetry");
  if (!D.telemetry.length) telBox.innerHTML = '<div class="empty">no telemetry recorded (telemetry.interval_s)</div>';
  let anyGpu = false;
  for (const [title, re, unit] of groups) {
    // one aligned table over every rank's samples: x = union of sample times
    const tables = [], labels = [];
    for (const t of D.telemetry) {
      for (const [name, values] of Object.entries(t.fields)) {
        if (!re.test(name) || !hasData(values)) continue;
        tables.push([t.t_s, values]);
        labels.push((t.rank >= 0 ? "rank " + t.rank + " " : "") + name);
      }
    }
    if (!tables.length) continue;
    if (labels.some((l) => /gpu\d+_/.test(l))) anyGpu = true;
    const joined = uPlot.join(tables);
    const h3 = document.createElement("h3");
    h3.textContent = title;
    const el = document.createElement("div");
    el.className = "chart";
    el.id = "chart-telemetry-" + title.toLowerCase().replace(/[^a-z]+/g, "-");
    telBox.append(h3, el);
    chart({ el, x: joined[0], xLabel: "seconds", group: timeCharts, syncKey: "time", height: 200,
            series: labels.map((l, i) => ({ label: l, data: joined[i + 1] })), scales: { y: { label: unit } } });
  }
  if (D.telemetry.length && !anyGpu) {
    const p = document.createElement("p");
    p.className = "help";
    p.textContent = "No GPU readings in this run (no NVML or ROCm SMI device was found).";
    telBox.append(p);
  }
  ready = true;

  // ---- anomalies and their diagnoses ---------------------------------------------------
  {
    const box = $("anomalies");
    if (!D.anomalies.length) {
      box.innerHTML = '<div class="empty">no anomalies: the guard judged every step healthy</div>';
    } else {
      const rows = D.anomalies.map((a) => `<tr><td class="num">${a.step}</td><td>${esc(a.kind)}</td><td>${esc(a.severity)}</td>` +
        `<td>${esc(a.action || "")}</td><td>${esc(a.message)}</td><td>${a.diagnosis !== null
          ? `<a href="#diagnosis-${a.diagnosis}">diagnosis</a>` : "–"}</td></tr>`).join("");
      box.innerHTML = `<table><thead><tr><th>step</th><th>kind</th><th>severity</th><th>action</th><th>what the guard saw</th>` +
        `<th></th></tr></thead><tbody>${rows}</tbody></table>` +
        D.diagnoses.map((d, i) => `<details id="diagnosis-${i}"><summary>${esc(d.snapshot)}</summary>` +
          `<pre>${esc(d.markdown)}</pre></details>`).join("");
      for (const a of box.querySelectorAll("a[href^='#diagnosis-']")) {
        a.addEventListener("click", () => { const d = document.querySelector(a.getAttribute("href")); if (d) d.open = true; });
      }
    }
  }

  // ---- resizing and the status record ---------------------------------------------------
  window.addEventListener("resize", () => {
    for (const c of Object.values(status.charts)) if (c.u) c.u.setSize({ width: width(c.u.root.parentNode), height: c.u.height });
    heatmap.redraw && heatmap.redraw();
  });
  // Pixels inside `box` whose colour is within a small distance of one of `colours`
  // (the series' strokes): what the series drew, not the grid, text or marker lines.
  function inked(canvas, box, colours) {
    const ctx = canvas.getContext("2d");
    const img = ctx.getImageData(box.left, box.top, box.width, box.height).data;
    const rgb = colours.map((c) => { const m = /^#(..)(..)(..)$/.exec(c); return m ? m.slice(1).map((h) => parseInt(h, 16)) : null; })
      .filter((c) => c);
    let n = 0;
    for (let i = 0; i < img.length; i += 4) {
      if (img[i + 3] < 128) continue;
      if (!rgb.length) { n++; continue; }
      for (const c of rgb)
        if (Math.abs(img[i] - c[0]) + Math.abs(img[i + 1] - c[1]) + Math.abs(img[i + 2] - c[2]) < 60) { n++; break; }
    }
    return n;
  }
  setTimeout(() => {
    const out = { errors: status.errors, charts: {} };
    for (const [id, c] of Object.entries(status.charts)) {
      try {
        const canvas = c.u ? c.u.ctx.canvas : c.canvas;
        const box = c.u ? c.u.bbox : c.box;
        const markers = markerKinds.map(([, v]) => css(v));
        const colours = (c.colours || []).filter((x) => !markers.includes(x));
        out.charts[id] = { series: c.series, ink: inked(canvas, box, colours) };
      } catch (e) {
        out.errors.push(id + ": " + e);
      }
    }
    const el = document.createElement("script");
    el.type = "application/json";
    el.id = "report-status";
    el.textContent = JSON.stringify(out);
    document.body.appendChild(el);
  }, 100);
})();
