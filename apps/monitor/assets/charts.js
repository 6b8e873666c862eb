// charts.js — strata's run charts, one copy shared by the live dashboard (GET / of
// `strata train --serve`) and the file `strata report` writes. Hand-written canvas drawing with
// no library, so both pages work offline and load nothing from anywhere.
//
// Input: a history {run: {...}, steps: [...]} (GET /api/history, or RUN.json reshaped by
// `strata report`). run: config, state ("starting|running|finished|failed"), error, first_step,
// total_steps, committed_step, tokens_per_step, predicted_step_seconds (0: none), budgets
// {device, host, nvme} in bytes. steps[i]: step, loss, seconds, compute_seconds, stall_seconds,
// nvme_read_bytes, nvme_write_bytes, host_to_device_bytes, device_to_host_bytes (moved during
// the step), device_bytes, host_bytes, nvme_bytes (in use at its end), committed, learning_rate
// (the lr of the step's update; absent in files from before schedules), eval_loss (the held-out
// loss measured after the step's commit; only on evaluated steps).
// Fields a file lacks are drawn as absent, never as zero.
"use strict";
var StrataCharts = (function () {
  var COLORS = ["#1f6fb4", "#d0402b", "#2a9d3c", "#8a4fbf", "#e08a00"];

  function formatBytes(bytes) {
    if (bytes === undefined || bytes === null || !isFinite(bytes)) return "–";
    var units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    var i = 0;
    while (Math.abs(bytes) >= 1024 && i < units.length - 1) { bytes /= 1024; i++; }
    return (i === 0 ? bytes.toFixed(0) : bytes.toFixed(bytes < 10 ? 2 : 1)) + " " + units[i];
  }
  function formatNumber(v) {
    if (v === undefined || v === null || !isFinite(v)) return "–";
    var a = Math.abs(v);
    if (a === 0) return "0";
    if (a !== 0 && (a >= 1e6 || a < 1e-3)) return v.toExponential(2);
    if (a >= 1000) return v.toFixed(0);
    if (a >= 10) return v.toFixed(1);
    return v.toFixed(a >= 1 ? 3 : 4);
  }
  function formatSeconds(s) {
    if (!isFinite(s) || s < 0) return "–";
    if (s < 120) return s.toFixed(1) + " s";
    if (s < 7200) return (s / 60).toFixed(1) + " min";
    return (s / 3600).toFixed(1) + " h";
  }
  function num(x) { return typeof x === "number" && isFinite(x) ? x : null; }

  // Keeps at most ~2 points per pixel column: a million-step run still draws quickly.
  function thin(points, columns) {
    if (points.length <= columns * 2) return points;
    var stride = Math.ceil(points.length / (columns * 2));
    var out = [];
    for (var i = 0; i < points.length; i += stride) out.push(points[i]);
    if (out[out.length - 1] !== points[points.length - 1]) out.push(points[points.length - 1]);
    return out;
  }

  // spec: {series: [{name, color, points: [[x, y]...], dash}], format(y) → text, zero: y axis from 0}
  // Returns the number of points drawn.
  function drawChart(canvas, spec) {
    var ratio = window.devicePixelRatio || 1;
    var width = canvas.clientWidth || 460, height = canvas.clientHeight || 200;
    if (canvas.width !== Math.round(width * ratio)) canvas.width = Math.round(width * ratio);
    if (canvas.height !== Math.round(height * ratio)) canvas.height = Math.round(height * ratio);
    var ctx = canvas.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.fillStyle = "#ffffff";
    ctx.fillRect(0, 0, width, height);
    var right = 12, top = 10, bottom = 26;
    var xMin = Infinity, xMax = -Infinity, yMin = Infinity, yMax = -Infinity, count = 0;
    spec.series.forEach(function (s) {
      s.points.forEach(function (p) {
        if (p[1] === null) return;
        xMin = Math.min(xMin, p[0]); xMax = Math.max(xMax, p[0]);
        yMin = Math.min(yMin, p[1]); yMax = Math.max(yMax, p[1]);
        count++;
      });
    });
    ctx.font = "12px sans-serif";
    if (count === 0) {
      ctx.fillStyle = "#777";
      ctx.fillText("no data yet", 20, height / 2);
      return 0;
    }
    if (spec.zero) yMin = Math.min(0, yMin);
    if (yMax === yMin) { yMax += Math.abs(yMax) * 0.1 || 1; yMin -= spec.zero ? 0 : Math.abs(yMin) * 0.1 || 1; }
    if (xMax === xMin) { xMax += 1; }
    var pad = (yMax - yMin) * 0.05;
    yMax += pad; if (!(spec.zero && yMin === 0)) yMin -= pad;
    // The left margin fits the widest y label, so no label is cut off.
    var labels = [];
    for (var t = 0; t <= 4; t++) labels.push(spec.format(yMin + (yMax - yMin) * t / 4));
    var left = 12 + Math.max.apply(null, labels.map(function (l) { return ctx.measureText(l).width; }));
    var plotW = width - left - right, plotH = height - top - bottom;
    function X(x) { return left + (x - xMin) / (xMax - xMin) * plotW; }
    function Y(y) { return top + plotH - (y - yMin) / (yMax - yMin) * plotH; }
    // grid and y labels
    ctx.strokeStyle = "#e4e4e4"; ctx.lineWidth = 1; ctx.fillStyle = "#555";
    ctx.textAlign = "right"; ctx.textBaseline = "middle";
    for (var i = 0; i <= 4; i++) {
      var yp = Y(yMin + (yMax - yMin) * i / 4);
      ctx.beginPath(); ctx.moveTo(left, yp); ctx.lineTo(left + plotW, yp); ctx.stroke();
      ctx.fillText(labels[i], left - 6, yp);
    }
    ctx.textAlign = "center"; ctx.textBaseline = "top";
    for (var j = 0; j <= 4; j++) {
      var xv = xMin + (xMax - xMin) * j / 4;
      ctx.fillText(String(Math.round(xv)), X(xv), top + plotH + 6);
    }
    ctx.strokeStyle = "#999"; ctx.strokeRect(left, top, plotW, plotH);
    spec.series.forEach(function (s, k) {
      var points = thin(s.points.filter(function (p) { return p[1] !== null; }), plotW);
      ctx.strokeStyle = s.color || COLORS[k % COLORS.length];
      ctx.lineWidth = 1.6;
      ctx.setLineDash(s.dash ? [6, 4] : []);
      ctx.beginPath();
      points.forEach(function (p, n) {
        if (n === 0) ctx.moveTo(X(p[0]), Y(p[1])); else ctx.lineTo(X(p[0]), Y(p[1]));
      });
      if (points.length === 1) ctx.arc(X(points[0][0]), Y(points[0][1]), 2, 0, 2 * Math.PI);
      ctx.stroke();
    });
    ctx.setLineDash([]);
    return count;
  }

  // The chart list: each derives its series from the history.
  function chartSpecs(history) {
    var run = history.run || {}, steps = history.steps || [];
    var budgets = run.budgets || {};
    function series(name, f, extra) {
      var s = { name: name, points: steps.map(function (st) { return [st.step, f(st)]; }) };
      for (var key in extra || {}) s[key] = extra[key];
      return s;
    }
    function perSecond(field) {
      return function (st) {
        var b = num(st[field]), s = num(st.seconds);
        return b === null || !s ? null : b / s;
      };
    }
    var tokens = num(run.tokens_per_step);
    var predicted = num(run.predicted_step_seconds);
    var nvmeWritten = 0;
    var specs = [
      { id: "loss", title: "Loss: training and held-out (eval)", format: formatNumber,
        series: [series("loss", function (st) { return num(st.loss); })].concat(
          steps.some(function (st) { return num(st.eval_loss) !== null; })
            ? [series("eval", function (st) { return num(st.eval_loss); })] : []) },
      { id: "learning_rate", title: "Learning rate (the schedule's)", format: function (v) { return v.toExponential(2); }, zero: true,
        series: [series("lr", function (st) { return num(st.learning_rate); })] },
      { id: "tokens", title: "Tokens per second", format: formatNumber, zero: true,
        series: [series("tokens/s", function (st) { var s = num(st.seconds); return tokens && s ? tokens / s : null; })] },
      { id: "step_time", title: "Step time against the prediction", format: function (v) { return v.toFixed(v < 1 ? 3 : 2) + " s"; }, zero: true,
        series: [series("measured", function (st) { return num(st.seconds); })].concat(
          predicted ? [series("predicted", function () { return predicted; }, { dash: true })] : []) },
      { id: "stall", title: "Stall share (compute waiting for data)", format: function (v) { return (100 * v).toFixed(1) + " %"; }, zero: true,
        series: [series("stall", function (st) { var s = num(st.seconds), w = num(st.stall_seconds); return s && w !== null ? w / s : null; })] },
      { id: "occupancy", title: "Tier occupancy (share of its budget)", format: function (v) { return (100 * v).toFixed(0) + " %"; }, zero: true,
        series: ["device", "host", "nvme"].map(function (tier) {
          return series(tier + " " + formatBytes(budgets[tier]), function (st) {
            var used = num(st[tier + "_bytes"]), budget = num(budgets[tier]);
            return used === null || !budget ? null : used / budget;
          });
        }) },
      { id: "bandwidth", title: "Bandwidth per tier pair", format: function (v) { return formatBytes(v) + "/s"; }, zero: true,
        series: [series("nvme → host", perSecond("nvme_read_bytes")), series("host → device", perSecond("host_to_device_bytes")),
                 series("device → host", perSecond("device_to_host_bytes")), series("host → nvme", perSecond("nvme_write_bytes"))] },
      { id: "nvme_written", title: "NVMe bytes written (cumulative)", format: formatBytes, zero: true,
        series: [series("written", function (st) { var b = num(st.nvme_write_bytes); if (b === null) return null; nvmeWritten += b; return nvmeWritten; })] }
    ];
    return specs;
  }

  function lastValue(points) {
    for (var i = points.length - 1; i >= 0; i--) if (points[i][1] !== null) return points[i][1];
    return null;
  }

  function element(tag, className, text) {
    var e = document.createElement(tag);
    if (className) e.className = className;
    if (text !== undefined) e.textContent = text;
    return e;
  }

  // One stylesheet for both pages, added by the first render.
  var STYLE = [
    "body{font-family:system-ui,sans-serif;margin:16px;background:#f4f5f7;color:#222}",
    "h1{font-size:18px;margin:0 0 10px}",
    ".strata-tiles{display:flex;flex-wrap:wrap;gap:8px;margin-bottom:12px}",
    ".strata-tile{background:#fff;border:1px solid #ddd;border-radius:6px;padding:6px 10px;min-width:90px}",
    ".strata-tile-label{font-size:11px;color:#666;text-transform:uppercase}",
    ".strata-tile-value{font-size:16px;font-variant-numeric:tabular-nums}",
    ".strata-error{color:#a00;flex-basis:100%}",
    ".strata-grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(440px,1fr));gap:12px}",
    ".strata-card{background:#fff;border:1px solid #ddd;border-radius:6px;padding:8px 10px}",
    ".strata-card h2{font-size:13px;margin:0 0 4px;font-weight:600}",
    ".strata-card canvas{width:100%;height:200px;display:block}",
    ".strata-legend{font-size:12px;color:#444;display:flex;flex-wrap:wrap;gap:10px;margin-top:4px}",
    ".strata-swatch{display:inline-block;width:10px;height:10px;margin-right:4px;border-radius:2px}"
  ].join("\n");

  // Builds the page's cards once, then redraws them from `history` on every call.
  function render(root, history) {
    var run = history.run || {}, steps = history.steps || [];
    var specs = chartSpecs(history);
    if (!root.querySelector(".strata-tiles")) {
      var style = element("style");
      style.textContent = STYLE;
      document.head.appendChild(style);
      root.appendChild(element("div", "strata-tiles"));
      var grid = element("div", "strata-grid");
      specs.forEach(function (spec) {
        var card = element("section", "strata-card");
        card.id = "chart-" + spec.id;
        card.appendChild(element("h2", null, spec.title));
        var canvas = element("canvas");
        canvas.setAttribute("data-chart", spec.id);
        card.appendChild(canvas);
        card.appendChild(element("div", "strata-legend"));
        grid.appendChild(card);
      });
      root.appendChild(grid);
    }
    var last = steps.length ? steps[steps.length - 1] : {};
    var elapsed = 0;
    steps.forEach(function (st) { elapsed += num(st.seconds) || 0; });
    var done = steps.length ? last.step - (run.first_step || 0) : 0;
    var left = (run.total_steps || 0) - (last.step || run.first_step || 0);
    var eta = done > 0 && run.state === "running" ? elapsed / done * left : NaN;
    var tiles = [
      ["state", run.state || "–"],
      ["step", steps.length ? last.step + " / " + run.total_steps : "– / " + (run.total_steps || "–")],
      ["loss", formatNumber(num(last.loss))],
      ["lr", num(last.learning_rate) === null ? "–" : num(last.learning_rate).toExponential(2)],
      ["eval loss", (function () {
        for (var i = steps.length - 1; i >= 0; i--) if (num(steps[i].eval_loss) !== null) return formatNumber(steps[i].eval_loss) + " @" + steps[i].step;
        return "–";
      })()],
      ["tokens/s", run.tokens_per_step && last.seconds ? formatNumber(run.tokens_per_step / last.seconds) : "–"],
      ["step time", last.seconds ? last.seconds.toFixed(3) + " s" + (run.predicted_step_seconds ? " (pred. " + run.predicted_step_seconds.toFixed(3) + " s)" : "") : "–"],
      ["stall", last.seconds ? (100 * last.stall_seconds / last.seconds).toFixed(1) + " %" : "–"],
      ["committed", String(run.committed_step === undefined ? "–" : run.committed_step)],
      ["elapsed", formatSeconds(elapsed)],
      ["ETA", isFinite(eta) ? formatSeconds(eta) : "–"]
    ];
    var tileBox = root.querySelector(".strata-tiles");
    tileBox.textContent = "";
    tiles.forEach(function (t) {
      var tile = element("div", "strata-tile");
      tile.id = "tile-" + t[0].replace(/[^a-z]/gi, "");
      tile.appendChild(element("div", "strata-tile-label", t[0]));
      tile.appendChild(element("div", "strata-tile-value", t[1]));
      tileBox.appendChild(tile);
    });
    if (run.error) {
      var error = element("div", "strata-tile strata-error", run.error);
      tileBox.appendChild(error);
    }
    var drawn = 0;
    specs.forEach(function (spec) {
      var card = root.querySelector("#chart-" + spec.id);
      drawn += drawChart(card.querySelector("canvas"), spec) > 0 ? 1 : 0;
      var legend = card.querySelector(".strata-legend");
      legend.textContent = "";
      spec.series.forEach(function (s, k) {
        var item = element("span", "strata-legend-item");
        var swatch = element("span", "strata-swatch");
        swatch.style.background = s.color || COLORS[k % COLORS.length];
        item.appendChild(swatch);
        var value = lastValue(s.points);
        item.appendChild(document.createTextNode(s.name + ": " + (value === null ? "–" : spec.format(value))));
        legend.appendChild(item);
      });
    });
    root.setAttribute("data-charts-drawn", String(drawn));
    root.setAttribute("data-last-step", String(last.step || 0));
    return drawn;
  }

  return { render: render, formatBytes: formatBytes };
})();
