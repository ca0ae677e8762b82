// One chart of curves over steps, drawn by uPlot on a canvas from `data` (tracker/dashboard/curve_chart.py's
// `spec`: training curves; `eval_spec`: evals by checkpoint, with markers, interval bars and the reference
// line). `uPlot` is defined by the vendored build that curve_chart.JS puts before this code.
//
// Once drawn, the chart's root (.db-curves) says so, for tests and benchmarks: data-drawn="1",
// data-series (how many named series), data-scale (log | linear), data-reference (how many reference
// lines are drawn); root.curves() lists every drawn series with its points (and intervals).

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

function pointAt(ys, span, i) {
  if (i == null || span[0] < 0 || i < span[0] || i > span[1]) return null;
  for (let d = 0; d <= span[1] - span[0]; d++) {
    if (i - d >= span[0] && ys[i - d] != null) return i - d;
    if (i + d <= span[1] && ys[i + d] != null) return i + d;
  }
  return null;
}

// An eval's value with its interval where it has one: `4.12 (3.50–4.71)`.
function valueText(s, j) {
  if (j == null) return "--";
  const lo = s.low ? s.low[j] : null, hi = s.high ? s.high[j] : null;
  return fmt(s.y[j]) + (lo != null && hi != null ? ` (${lo.toFixed(3)}–${hi.toFixed(3)})` : "");
}

// The y axis of an eval chart spans its values, their intervals and the reference (uPlot's own range
// looks at the values only, and would cut an error bar or the reference line off).
function evalRange(data) {
  const all = [];
  for (const s of data.series) for (const ys of [s.y, s.low, s.high]) for (const v of ys || []) if (v != null) all.push(v);
  for (const ref of data.references || []) all.push(...[ref.value, ref.low, ref.high].filter((v) => v != null));
  return () => {
    const lo = Math.min(...all), hi = Math.max(...all);
    const pad = hi > lo ? (hi - lo) * 0.08 : Math.max(Math.abs(hi) * 0.05, 0.5);
    return [lo - pad, hi + pad];
  };
}

// Checkpoints at the chart's edges keep their whole marker: the x axis reaches a little past them.
const stepRange = (u, lo, hi) => {
  const pad = Math.max(1, (hi - lo) * 0.04);
  return [lo - pad, hi + pad];
};

// What uPlot leaves to its hooks on an eval chart: each point's interval as an error bar, and each
// reference as a dotted horizontal line with its label, its interval a faint band behind it (a reference
// drawn apart, not measured on the evals' prompts: grey, long dashes, shape only).
function drawEvalExtras(u, data, text, paper) {
  const ctx = u.ctx, px = uPlot.pxRatio, { left, top, width, height } = u.bbox;
  ctx.save();
  ctx.beginPath();
  ctx.rect(left, top, width, height);
  ctx.clip();
  for (const ref of data.references || []) {
    if (ref.low != null && ref.high != null) {
      const y0 = u.valToPos(ref.high, "y", true), y1 = u.valToPos(ref.low, "y", true);
      ctx.fillStyle = "rgba(51, 51, 51, 0.08)";
      ctx.fillRect(left, y0, width, y1 - y0);
    }
    const y = u.valToPos(ref.value, "y", true);
    ctx.strokeStyle = ref.apart ? "#999999" : "#333333";
    ctx.lineWidth = 2 * px;
    ctx.setLineDash(ref.apart ? [8 * px, 6 * px] : [2 * px, 3 * px]);
    ctx.beginPath();
    ctx.moveTo(left, y);
    ctx.lineTo(left + width, y);
    ctx.stroke();
    ctx.setLineDash([]);
    ctx.font = `${12 * px}px sans-serif`;
    ctx.textAlign = "left";
    ctx.textBaseline = "bottom";
    // The label shortened to the plot's width, its number always whole: `z-lab/Qwen3-8B-DF…: 4.105`.
    const number = `: ${ref.value.toFixed(3)}`, room = width - 8 * px;
    let label = ref.label;
    while (label.length > 1 && ctx.measureText(label + number).width > room) label = label.slice(0, -2) + "…";
    // Placed where it covers the fewest points (left or right end, above or below the line), on a faint
    // backing: at the left end above the line it sat on the early checkpoints' points.
    const w = ctx.measureText(label + number).width, h = 14 * px;
    const places = [[left + 4 * px, y - 3 * px], [left + width - w - 4 * px, y - 3 * px],
                    [left + 4 * px, y + h + 1 * px], [left + width - w - 4 * px, y + h + 1 * px]];
    const covered = ([x, base]) => {
      let n = 0;
      for (let si = 1; si < u.data.length; si++) {
        u.data[si].forEach((v, i) => {
          if (v == null) return;
          const px_ = u.valToPos(u.data[0][i], "x", true), py = u.valToPos(v, "y", true);
          if (px_ >= x - 6 * px && px_ <= x + w + 6 * px && py >= base - h - 6 * px && py <= base + 6 * px) n++;
        });
      }
      return n;
    };
    const counts = places.map(covered);  // once per place: each count scans every point
    const [tx, ty] = places[counts.indexOf(Math.min(...counts))];
    ctx.globalAlpha = 0.75;  // the page's own background (light or dark theme), the points faint behind it
    ctx.fillStyle = paper;
    ctx.fillRect(tx - 2 * px, ty - h, w + 4 * px, h + 2 * px);
    ctx.globalAlpha = 1;
    ctx.fillStyle = text;
    ctx.fillText(label + number, tx, ty);
  }
  ctx.lineWidth = 1.5 * px;
  u.series.forEach((shown, si) => {
    const s = data.series[si - 1];
    if (!s || !s.low || shown.show === false) return;
    ctx.strokeStyle = s.color;
    s.y.forEach((v, i) => {
      const lo = s.low[i], hi = s.high[i];
      if (v == null || lo == null || hi == null) return;
      const x = u.valToPos(data.x[i], "x", true), y0 = u.valToPos(lo, "y", true), y1 = u.valToPos(hi, "y", true);
      ctx.beginPath();
      ctx.moveTo(x, y0);
      ctx.lineTo(x, y1);
      for (const yc of [y0, y1]) { ctx.moveTo(x - 4 * px, yc); ctx.lineTo(x + 4 * px, yc); }
      ctx.stroke();
    });
  });
  ctx.restore();
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
  const paper = themed(root, "--st-background-color", "#FFFFFF");
  const ticks = data.ticks ? { splits: (u, ai, lo, hi) => data.ticks.filter((t) => t >= lo && t <= hi) } : {};
  return {
    width,
    height: data.height,
    scales: data.markers ? { x: { time: false, range: stepRange }, y: { range: evalRange(data) } }
      : { x: { time: false, distr: data.log_x ? 3 : 1 } },
    axes: [{ ...axis, label: data.x_title, ...(data.log_x ? {} : { incrs: STEP_INCRS }), ...ticks },
           { ...axis, label: data.y_title, size: 64 }],
    series: [
      // An eval chart's legend, the cursor away, holds each series' latest checkpoint (a training chart's: "--").
      { label: data.markers ? "checkpoint step" : "step",
        value: (u, v) => v == null ? (data.markers ? "latest" : "--") : v.toLocaleString("en-US") },
      ...data.series.map((s) => {
        const span = spanOf(s.y);
        return {
          label: s.reason ? `${s.name} ⚠ ${s.reason}` : s.name,
          stroke: s.faint ? s.color + "40" : s.color, // 25% opaque behind the smoothed line
          width: s.faint ? 1 : 1.5,
          dash: s.dashed ? [6, 4] : undefined,
          spanGaps: true,
          // An eval chart marks every checkpoint (open: a dashed series); a training curve of one point is its point.
          points: data.markers ? { show: true, size: s.marker_px, width: 2, stroke: s.color, fill: s.dashed ? paper : s.color }
            : s.single ? { show: true, size: 7, fill: s.color } : { show: false },
          value: (u, v, si, i) => valueText(s, i == null && data.markers && span[0] >= 0 ? span[1] : pointAt(s.y, span, i))
            + (s.faint ? "" : smoothed),
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
      draw: [(u) => {
        if (data.markers) drawEvalExtras(u, data, text, paper);
        root.dataset.drawn = "1";
        root.dataset.reference = String((data.references || []).length);
        root.dataset.series = String(data.series.filter((s) => !s.faint).length);
        root.dataset.scale = data.log_x ? "log" : "linear";
      }],
    },
  };
}

export default function ({ data: packed, parentElement, setTriggerValue }) {
  charts.get(parentElement)?.destroy();
  const data = { ...packed, x: unpack(packed.x, Float64Array),
                 series: packed.series.map((s) => ({ ...s, y: unpack(s.y, Float32Array),
                   ...(s.low ? { low: unpack(s.low, Float32Array), high: unpack(s.high, Float32Array) } : {}) })) };
  const root = document.createElement("div");
  root.className = "db-curves";
  root.dataset.drawn = "0";
  parentElement.querySelector(":scope > .db-curves")?.remove();
  parentElement.appendChild(root);
  root.curves = () => data.series.map((s) => {
    const x = [], y = [], low = [], high = [];
    s.y.forEach((v, i) => {
      if (v == null) return;
      x.push(data.x[i]); y.push(v);
      if (s.low) { low.push(s.low[i]); high.push(s.high[i]); }
    });
    return { name: s.name, faint: s.faint, dashed: s.dashed, single: !!s.single, x, y, ...(s.low ? { low, high } : {}) };
  });

  const width = () => Math.max(200, Math.floor(parentElement.getBoundingClientRect().width));
  const plot = new uPlot(options(data, width(), root, setTriggerValue), [data.x, ...data.series.map((s) => s.y)], root);
  plot.root.querySelectorAll(".u-legend .u-series").forEach((row, i) => {
    const s = data.series[i - 1]; // row 0 is the step
    if (s && s.faint) row.style.display = "none"; // its smoothed twin carries the name
    const why = [s && s.reason && `dashed: ${s.reason}`, s && s.env && `env: ${s.env}`].filter(Boolean);
    if (why.length) row.title = why.join("\n");
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
