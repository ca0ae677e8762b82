// One training-curve chart, drawn by uPlot on a canvas from `data` (tracker/dashboard/curve_chart.py's
// `spec`). `uPlot` is defined by the vendored build that curve_chart.JS puts before this code.
//
// Once drawn, the chart's root (.db-curves) says so, for tests and benchmarks: data-drawn="1",
// data-series (how many named series), data-scale (log | linear); root.curves() lists every drawn
// series with its points.

const charts = new WeakMap(); // parentElement -> the chart drawn there, replaced on new data

// curve_chart.pack's base64 back to numbers; NaN (no point at that step) to null, uPlot's gap.
function unpack(packed, Type) {
  const bytes = Uint8Array.from(atob(packed), (c) => c.charCodeAt(0));
  return Array.from(new Type(bytes.buffer), (v) => Number.isNaN(v) ? null : v);
}

// Legend and hover numbers: 4 significant digits, exponent form outside [1e-3, 1e4).
const fmt = (v) => v == null ? "--"
  : (v !== 0 && (Math.abs(v) < 1e-3 || Math.abs(v) >= 1e4)) ? v.toExponential(3) : String(+v.toPrecision(4));

// Series log at their own steps, so the union of steps leaves holes: under the cursor, a series
// shows its closest logged value, but only inside the steps it spans (a finished run shows "--").
function spanOf(ys) {
  let first = ys.findIndex((v) => v != null), last = ys.length - 1;
  while (last >= 0 && ys[last] == null) last--;
  return [first, last];
}

function valueAt(ys, span, i) {
  if (i == null || span[0] < 0 || i < span[0] || i > span[1]) return null;
  for (let d = 0; d <= span[1] - span[0]; d++) {
    if (i - d >= span[0] && ys[i - d] != null) return ys[i - d];
    if (i + d <= span[1] && ys[i + d] != null) return ys[i + d];
  }
  return null;
}

// Steps are whole numbers: x ticks at 1, 2, 5, 10, 20, 50, ... steps apart, never at 0.2.
const STEP_INCRS = Array.from({ length: 13 }, (_, e) => [1, 2, 5].map((m) => m * 10 ** e)).flat();

// Streamlit's theme, as the CSS properties it gives a component (light theme's values otherwise):
// a canvas needs the colours themselves.
function themed(el, name, fallback) {
  return getComputedStyle(el).getPropertyValue(name).trim() || fallback;
}

function options(data, width, root, setTriggerValue) {
  const text = themed(root, "--st-text-color", "#31333F"), rule = themed(root, "--st-border-color", "#E6E9EF");
  const axis = { stroke: text, grid: { stroke: rule, width: 1 }, ticks: { stroke: rule, width: 1 } };
  const smoothed = data.smoothing > 0 ? ` (EMA ${data.smoothing})` : "";
  return {
    width,
    height: data.height,
    scales: { x: { time: false, distr: data.log_x ? 3 : 1 } },
    axes: [{ ...axis, label: data.x_title, ...(data.log_x ? {} : { incrs: STEP_INCRS }) },
           { ...axis, label: data.y_title, size: 64 }],
    series: [
      { label: "step", value: (u, v) => v == null ? "--" : v.toLocaleString("en-US") },
      ...data.series.map((s) => {
        const span = spanOf(s.y);
        return {
          label: s.reason ? `${s.name} ⚠ ${s.reason}` : s.name,
          stroke: s.faint ? s.color + "40" : s.color, // 25% opaque behind the smoothed line
          width: s.faint ? 1 : 1.5,
          dash: s.dashed ? [6, 4] : undefined,
          spanGaps: true,
          points: s.single ? { show: true, size: 7, fill: s.color } : { show: false },
          value: (u, v, si, i) => fmt(valueAt(s.y, span, i)) + (s.faint ? "" : smoothed),
        };
      }),
    ],
    legend: { live: true },
    cursor: {
      drag: { x: true, y: false },
      bind: { // a double click shows the whole run again: the page reads it back, decimated
        dblclick: (u, target, handler) => (e) => {
          handler(e);
          if (data.zoomable && data.x_range) setTriggerValue("zoom", null);
          return null;
        },
      },
    },
    hooks: {
      ready: [(u) => { if (data.x_range) u.setScale("x", { min: data.x_range[0], max: data.x_range[1] }); }],
      setSelect: [(u) => { // a dragged window: the page reads those steps again, at full detail
        if (!data.zoomable || u.select.width < 2) return;
        const lo = u.posToVal(u.select.left, "x"), hi = u.posToVal(u.select.left + u.select.width, "x");
        setTriggerValue("zoom", [Math.max(0, Math.floor(lo)), Math.ceil(hi)]);
      }],
      draw: [() => {
        root.dataset.drawn = "1";
        root.dataset.series = String(data.series.filter((s) => !s.faint).length);
        root.dataset.scale = data.log_x ? "log" : "linear";
      }],
    },
  };
}

export default function ({ data: packed, parentElement, setTriggerValue }) {
  charts.get(parentElement)?.destroy();
  const data = { ...packed, x: unpack(packed.x, Float64Array),
                 series: packed.series.map((s) => ({ ...s, y: unpack(s.y, Float32Array) })) };
  const root = document.createElement("div");
  root.className = "db-curves";
  root.dataset.drawn = "0";
  parentElement.querySelector(":scope > .db-curves")?.remove();
  parentElement.appendChild(root);
  root.curves = () => data.series.map((s) => {
    const x = [], y = [];
    s.y.forEach((v, i) => { if (v != null) { x.push(data.x[i]); y.push(v); } });
    return { name: s.name, faint: s.faint, dashed: s.dashed, single: !!s.single, x, y };
  });

  const width = () => Math.max(200, Math.floor(parentElement.getBoundingClientRect().width));
  const plot = new uPlot(options(data, width(), root, setTriggerValue), [data.x, ...data.series.map((s) => s.y)], root);
  plot.root.querySelectorAll(".u-legend .u-series").forEach((row, i) => {
    const s = data.series[i - 1]; // row 0 is the step
    if (s && s.faint) row.style.display = "none"; // its smoothed twin carries the name
    if (s && s.reason) row.title = `dashed: ${s.reason}`;
  });
  let frame = 0;
  const resized = new ResizeObserver(() => {
    cancelAnimationFrame(frame);
    frame = requestAnimationFrame(() => { if (width() !== plot.width) plot.setSize({ width: width(), height: data.height }); });
  });
  resized.observe(parentElement);
  const chart = { destroy: () => { resized.disconnect(); cancelAnimationFrame(frame); plot.destroy(); } };
  charts.set(parentElement, chart);
  return () => { if (charts.get(parentElement) === chart) { chart.destroy(); charts.delete(parentElement); } };
}
