"""Compare: training and eval curves of chosen runs against a reference, with environment checks.

One view at a time (`VIEWS`, picked with the `compare_view` switch, kept in the URL): only the shown
view is computed and sent. To add a view, define `def my_view() -> None` (it may read the page's
`data`, `index`, `colors`, ...) and add it to `VIEWS`; list it in `NEEDS_HISTORIES` if it reads
`data.train_curves`.
"""

import streamlit as st

from tracker.dashboard import (charts, context_view, curve_chart, load_view, metric_docs, recipe, reconcile_view, report,
                               ui)
from tracker.dashboard.compare import (
    TITLES,
    checkpoint_steps,
    closest_reference,
    common_budgets,
    compare_data,
    engines_views,
    eval_tables,
    outside_budgets,
    reference_label,
    train_runs_for_histories,
    training_curves,
    without_ddtree,
)
from tracker.dashboard.escape import csv_bytes, md, md_code
from tracker.dashboard.tables import WRAP_ROW_HEIGHT, cells_text, default_selection, ids_from_link, picker_options

AUTO = "__closest__"
NONE = "__none__"
PLOTLY = {"displaylogo": False}
# The verdict tables' sentences wrap in tall rows (tables.WRAP_ROW_HEIGHT) instead of being cut.
_WRAPPED = {name: st.column_config.TextColumn(width=width) for name, width in (
    ("eval", "medium"), ("series", "medium"), ("verdict", "medium"), ("how", "medium"), ("protocol", "large"))}

cfg, index = ui.shared()
st.title("Compare")

if not index.of_kind("train", "eval"):
    st.info("No training or eval runs to compare yet: log a training run, or evaluate a checkpoint with "
            "`draftboard eval` (or from the Launch page).")
    st.stop()
from_url, unknown = ids_from_link(st.query_params.get("runs"), [r for r in index.runs
                                                                  if index.runs[r].kind in ("train", "eval")])
# A reference in the link (Runs' "Compare selected" of a reference row) is the page's reference, not a missing run.
linked_refs = [r for r in unknown if r in index.runs and index.runs[r].kind == "reference"]
unknown = [r for r in unknown if r not in linked_refs]
if linked_refs and "compare_reference" not in st.session_state:
    st.session_state["compare_reference"] = linked_refs[0]
if unknown and "compare_runs" not in st.session_state:
    st.warning(f"No training or eval run with id {', '.join(md_code(r) for r in unknown)} in this store: the link "
               "names runs that do not exist here (deleted, or another store's).", icon="🔗")
if "compare_runs" not in st.session_state:
    st.session_state["compare_runs"] = from_url or default_selection(index)
options, left_out = picker_options(index, ("train", "eval"), keep=st.session_state["compare_runs"])
st.session_state["compare_runs"] = [r for r in st.session_state["compare_runs"] if r in options]  # deleted since
chosen = st.multiselect("Runs", options, key="compare_runs", format_func=lambda r: ui.run_option_label(index, r),
                        help="training runs (their curves, and their evals by checkpoint) and single eval runs")
ui.picker_note(left_out)
st.query_params["runs"] = ",".join(chosen)
if not chosen:
    st.info("Choose runs to compare.")
    st.stop()

choice = closest_reference(index, chosen)
refs = [r.run_id for r in index.of_kind("reference")]
ordered = list(choice.candidates) + [r for r in refs if r not in choice.candidates]
auto_label = (f"closest match: {reference_label(index, index.runs[choice.run_id])}" if choice.run_id
              else "closest match: none")


def _ref_label(value: str) -> str:
    if value == AUTO:
        return auto_label
    if value == NONE:
        return "no reference"
    return reference_label(index, index.runs[value])


with st.sidebar:
    st.subheader("Reference")
    ref_pick = st.selectbox("Reference", [AUTO, NONE, *ordered], key="compare_reference", format_func=_ref_label,
                            help="default: a reference evaluated for the same target with the closest environment "
                                 "(fewest critical, then warning, fingerprint differences). Published references "
                                 "show their target.")
reference_id = choice.run_id if ref_pick == AUTO else (None if ref_pick == NONE else ref_pick)


LATEST = "latest"
steps = checkpoint_steps(index, chosen)
trains = sum(index.runs[r].kind == "train" for r in chosen)
step = left_out_note = None
with st.sidebar:
    if st.session_state.get("compare_checkpoint", LATEST) not in (LATEST, *steps):
        del st.session_state["compare_checkpoint"]  # a step of runs no longer chosen
    if len(steps) > 1:  # one control for every run: the same checkpoint of each, or each run's latest
        picked = st.selectbox(
            "Checkpoint drawn", [LATEST, *steps], key="compare_checkpoint",
            format_func=lambda s: "latest of each run" if s == LATEST else f"step {s} ({steps[s]} of {trains} runs)",
            help="which checkpoint of each training run the Acceptance by position, By context and DDTree views "
                 "draw, and the vs-reference table compares: each run's latest evaluated checkpoint (its default "
                 "protocol's eval, drawn solid where one is, then the closest to the reference's environment), or "
                 "the same step of every run (a run with no eval there is left out, and said)")
        step = None if picked == LATEST else picked
        left_out_note = st.empty()  # filled once the comparison is assembled


# --------------------------------------------------------------------------- views


@st.fragment
def eval_view() -> None:
    if data.not_drawn:
        st.caption("Not on these charts: " + md("; ".join(data.not_drawn)) + ".")
    if not data.eval_metrics:
        st.info("No eval results for these runs yet: evaluate a checkpoint from the Launch page or with "
                "`draftboard eval --train-run-id ... --checkpoint-step ...`.")
        return
    wanted = [m for m in ("tau", "streak") if m in data.eval_metrics] or data.eval_metrics[:1]
    keys = st.multiselect("Eval metrics", data.eval_metrics, default=wanted, key="compare_eval_metrics",
                          help="\n\n".join(metric_docs.help_text(k) for k in data.eval_metrics
                                           if metric_docs.family(k) != "accept_rate_pos"))
    ref_label = reference_label(index, ref) if ref is not None else None
    if ref_label and data.target_note:  # drawn in its own style, its caveat in the legend
        ref_label += " · other target: shape only"
    cols = st.columns(2)
    for i, key in enumerate(keys):
        with cols[i % 2]:
            st.markdown(f"**{md(key)}** · {md(metric_docs.describe(key).title)}", help=metric_docs.help_text(key))
            ui.canvas_chart(curve_chart.eval_spec(data.eval_points, key, colors,
                                                  data.references(key, ref_label) if ref_label else ()),
                            key=f"compare_eval_{key}")
    st.caption("Error bars: the 95% bootstrap interval over prompts of each eval; the legend holds each series' "
               "latest checkpoint (or the one under the cursor) with that interval. Series marked (online) were "
               "scored by z-lab's cached online loop, not the lossless offline walk; (served by ...) were measured "
               "by a serving engine, its steps as blocks.")
    shown = data.eval_points[data.eval_points["key"].isin(keys)]
    st.download_button("Download shown eval data (CSV)", lambda: csv_bytes(shown), "eval_by_checkpoint.csv", "text/csv",
                       key="compare_eval_csv", on_click="ignore")
    tables = eval_tables(index, data, results)
    verdict_help = ("Δτ = this − the other, with its 95% interval: a paired bootstrap over prompts when both evals "
                    "hold per-prompt data for the same prompts (as `draftboard compare`), else each side's own "
                    "interval (better or worse only when they do not overlap). Not comparable: a critical "
                    "environment or protocol difference.")
    st.markdown("**vs reference**", help="each chosen eval (a training run's: the checkpoint drawn) against the "
                                         "reference's number for the same dataset, never an average over other "
                                         "sets. " + verdict_help)
    if ref is None:
        st.info("No reference chosen.")
    else:
        st.dataframe(tables.vs_reference.drop(columns="run_id"), hide_index=True, key="compare_vs_reference",
                     row_height=WRAP_ROW_HEIGHT, column_config=_WRAPPED)
    st.markdown("**vs previous checkpoint**", help="each evaluated checkpoint against the one before it in the "
                                                   "same series, per dataset. " + verdict_help)
    if tables.vs_previous.empty:
        st.caption("No series has two evaluated checkpoints.")
    else:
        # The change and its verdict before the numbers it comes from: at 1280 px they show without scrolling.
        st.dataframe(tables.vs_previous, hide_index=True, key="compare_vs_previous", row_height=WRAP_ROW_HEIGHT,
                     column_config=_WRAPPED, column_order=["series", "step", "eval", "previous step", "delta tau",
                                                           "verdict", "tau", "previous tau", "dataset", "how"])
    st.markdown("**Per-dataset results**", help="tau per dataset with its 95% bootstrap interval (published "
                                                "numbers have none), grouped by dataset")
    st.dataframe(tables.by_dataset.drop(columns="run_id"), hide_index=True, key="compare_by_dataset")
    if not tables.online.empty:
        st.markdown("**Online vs offline**", help="tau of one checkpoint scored online (z-lab's cached loop) and "
                                                  "offline (the lossless walk): on hybrid targets the cached loop "
                                                  "can leave greedy decoding, and the gap shows it")
        st.dataframe(tables.online, hide_index=True, key="compare_online_gap")
    if not tables.served.empty:
        st.markdown("**Served vs offline**", help="an engine eval's own number (1 + accepted / drafts, pooled over "
                                                  "its steps) against the offline tau of the same checkpoint and "
                                                  "prompts, the gap in parts: pooling and end of generation are "
                                                  "definitions; acceptance on equal completions points at the "
                                                  "features the drafter saw; numerics at the target's decoding "
                                                  "(`draftboard reconcile`, docs/DESIGN.md)")
        st.dataframe(tables.served, hide_index=True, key="compare_served_gap",
                     column_config={"verdict": st.column_config.TextColumn(width="large")})


@st.fragment
def train_view() -> None:
    if not data.train_metrics:
        st.info("No training steps logged by the chosen runs.")
        return
    keys = st.multiselect("Training metrics", data.train_metrics, default=data.train_metrics[:4],
                          key="compare_train_metrics",
                          help="\n\n".join(metric_docs.help_text(k) for k in data.train_metrics))
    with st.container(horizontal=True):
        smoothing = st.slider("Smoothing", 0.0, 0.99, 0.6, 0.01, key="compare_smoothing",
                              help="exponential moving average weight w: each point is w × the previous smoothed "
                                   "value + (1 − w) × its own. 0: raw. The raw curve stays behind, faint, for up "
                                   f"to {curve_chart.RAW_BEHIND_MAX_SERIES} runs.")
        log_x = st.toggle("Log step axis", key="compare_log_step",
                          help="training step on a log scale: early training is readable next to late")
    window = ui.step_window(data.train_curves)
    curves = data.train_curves
    if window is not None:  # zoomed: the window again, at full detail where it fits the chart
        hist = ui.curves(cfg.store_uri, history_runs, index=index, window=window)
        curves = training_curves(index, chosen, reference_id, hist)
    cols = st.columns(2)
    for i, key in enumerate(keys):
        with cols[i % 2]:
            st.markdown(f"**{md(key)}** · {md(metric_docs.describe(key).title)}", help=metric_docs.help_text(key))
            ui.canvas_chart(curve_chart.spec(curves, key, recipe.step_axis_title(index, chosen), colors=colors,
                                               smoothing=smoothing, log_x=log_x, x_range=window, zoomable=True),
                              key=f"compare_train_{key}")
    shown = curves[curves["key"].isin(keys)]
    st.caption(ui.curves_caption(shown, zoomable=True))
    # Written when clicked: a CSV of every shown point costs more than drawing them, on every rerun.
    st.download_button("Download shown training data (CSV)", lambda: csv_bytes(shown), "training_curves.csv",
                       "text/csv", key="compare_train_csv", on_click="ignore")


def per_run_view(title: str, family: str, frame, figure, empty: str, csv_name: str, key: str) -> None:
    """A chart of one checkpoint per chosen run, with its data as CSV."""
    st.markdown(f"**{title}**", help=metric_docs.family_help(family))
    if frame.empty:
        st.info(empty)
        return
    st.caption("Training runs: one evaluated checkpoint each, picked in the sidebar (default: the latest; of its "
               "evals, one matching its training run's environment, then the closest to the reference's).")
    st.plotly_chart(figure(frame), key=f"compare_{key}", config=PLOTLY)
    st.download_button("Download (CSV)", lambda: csv_bytes(frame), csv_name, "text/csv", key=f"compare_{key}_csv",
                       on_click="ignore")


def position_view() -> None:
    per_run_view("Acceptance rate by draft position", "accept_rate_pos", data.accept_by_position,
                 lambda frame: charts.accept_by_position(frame, colors), "No per-position acceptance for these runs.",
                 "accept_by_position.csv", "positions")


def ddtree_view() -> None:
    span = common_budgets(data.ddtree)
    per_run_view("DDTree tau against node budget", "ddtree_tau", data.ddtree,
                 lambda frame: charts.ddtree_vs_budget(frame, colors, span), "No DDTree results for these runs.",
                 "ddtree_vs_budget.csv", "ddtree")
    missing = without_ddtree(index, data)
    if missing:
        st.caption(f"Not on this chart: {md('; '.join(missing))}.")
    outside = outside_budgets(data.ddtree, span)
    if outside:
        st.caption(f"The axis spans the budgets every series has ({span[0]}–{span[1]} nodes). Also measured, off "
                   f"the chart (in the CSV): {md('; '.join(outside))}.")


def data_view() -> None:
    export = data.export_frame()
    # Each row fills only its own kind's columns (a training point has no interval, an eval point no budget).
    st.dataframe(cells_text(export), hide_index=True, key="compare_data_table")
    st.download_button("Download all shown data (CSV)", lambda: csv_bytes(export), "compare.csv", "text/csv",
                       key="compare_csv", on_click="ignore")
    with st.expander("Metric definitions"):
        for doc in metric_docs.glossary():
            st.markdown(doc.help())


def config_view() -> None:
    ids, default = recipe.reference_choices(index, chosen, reference_id)
    if len(ids) < 2:
        st.info("The Config view diffs training recipes: choose at least two training runs (or evals of them).")
        return
    with st.container(horizontal=True):
        ref_id = st.selectbox("Recipe reference", ids, index=ids.index(default), key="compare_recipe_ref",
                              format_func=lambda r: ui.run_option_label(index, r),
                              help="default: the training run behind the reference, else the first chosen run")
        show_all = st.toggle("Show all keys", key="compare_config_all", help="off: only the keys that differ")
    cv = recipe.config_view(index, ids, ref_id, diff_only=not show_all)
    st.caption(f"{md(cv.summary)} · {recipe.DFLASH_MARK} a DFlash recipe key · `logged as`: the tool's own name")
    if cv.critical_keys:
        st.error(f"Critical recipe differences ({md(', '.join(cv.critical_keys))}): acceptance numbers of these "
                 "runs are not comparable with the reference's.", icon="🚫")
    if cv.table.empty:
        st.success("No key differs from the reference.")
    else:
        st.dataframe(cv.styled(), hide_index=True, key="compare_config_table",
                     column_config={"reason": st.column_config.TextColumn(width="large")})
    if not cv.lints.empty:
        st.markdown("**Lint**", help="rules on each recipe, each with why it matters")
        st.dataframe(cv.lints, hide_index=True, key="compare_config_lints",
                     column_config={"reason": st.column_config.TextColumn(width="large")})
    st.download_button("Download the recipe diff (CSV)", lambda: csv_bytes(cv.table), "recipe_diff.csv", "text/csv",
                       key="compare_config_csv", on_click="ignore")


@st.fragment
def engines_view() -> None:
    views = engines_views(index, data, results)
    if not views:
        owners = reconcile_view.engine_eval_owners(index)
        elsewhere = (f" This store has engine evals of {md(', '.join(index.label(r) for r in owners[:3]))}"
                     f"{' and more' if len(owners) > 3 else ''}: choose that run above." if owners else "")
        st.info("No engine evals among these runs: measure a checkpoint as an engine serves it with "
                "`draftboard eval --engine vllm|sglang|llamacpp` (or from the Launch page), then choose that eval "
                f"here.{elsewhere}")
        return
    st.caption("Each checkpoint and prompt set: the offline tau and each engine's own number (two definitions, "
               "named in each row), and each pair of engines' gap in parts, measured through the offline eval of the "
               "same prompts so that pooling cancels (`draftboard reconcile A B --offline C`, docs/DESIGN.md).")
    for i, view in enumerate(views):
        st.markdown(f"**{md(view.title)}**")
        st.dataframe(view.numbers, hide_index=True, key=f"compare_engines_numbers_{i}",
                     column_config={"definition": st.column_config.TextColumn(width="large")})
        if view.gaps.empty:
            st.caption("One engine eval of this checkpoint and prompt set: choose another engine's eval of the same "
                       "prompts to see the gap between them.")
            continue
        if view.offline is None:
            st.warning("No offline eval of this checkpoint on these prompts: the gap is not taken apart (evaluate it "
                       "offline with the same prompts).", icon="ℹ️")
        st.dataframe(view.gaps, hide_index=True, key=f"compare_engines_gaps_{i}", row_height=WRAP_ROW_HEIGHT,
                     column_config={name: st.column_config.TextColumn(width="large")
                                    for name in ("settings that differ", "verdict")})


@st.fragment
def load_curves_view() -> None:
    frame = load_view.load_curves(index, [index.runs[r] for r in chosen])
    if frame.empty:
        st.info("No load sweeps among these runs: measure a checkpoint with several requests in flight with "
                "`draftboard eval --engine vllm|llamacpp --concurrency 1,4,8` (or Concurrency levels on the Launch "
                "page), then choose that eval here.")
        return
    st.caption("Each line: one served eval, its prompts at each level with that many requests in flight, with the "
               "drafter and with the target alone on the same server settings, both measured in that eval "
               "(docs/DESIGN.md, Load sweeps). Speedup = acceptance length / step cost. Published speedups state no "
               "concurrency, so none is drawn here.")
    for y, title, hover in (
            ("speedup", "speedup (tok/s with the drafter / tok/s of the target alone)", "speedup %{y:.2f}x"),
            ("engine_mean_acceptance_length", "served mean acceptance length (1 + accepted / steps)",
             "acceptance length %{y:.3f} tokens / step"),
            ("step_cost", "step cost (a speculative step's time / a plain decode step's)", "step cost %{y:.2f}")):
        if frame[y].notna().any():
            st.plotly_chart(charts.under_load(frame, y, title, hover, colors), config=PLOTLY,
                            key=f"compare_load_{y}")
    st.dataframe(frame.drop(columns="owner"), hide_index=True, key="compare_load_table",
                 column_config={"series": st.column_config.TextColumn(width="large")})


def context_curves_view() -> None:
    frame = context_view.context_curves(index, data.picked, ref, results)
    st.markdown("**Acceptance by context length**", help="tau of the blocks in each context-length bucket (prompt + "
                "completion tokens up to the block's anchor), pooled over prompts, with its 95% bootstrap interval "
                "over prompts (docs/DESIGN.md, Load, context and families)")
    if frame.empty:
        st.info("No eval among these runs has acceptance by context length: evaluate a checkpoint (greedy) with this "
                "version of draftboard, or with `--context-buckets 0,512,2048` for edges of your own.")
        return
    st.caption("Training runs: the checkpoint drawn by position (picked in the sidebar). Buckets with no block are "
               "left out; evals on other prompt sets or edges are their own lines, never one.")
    st.plotly_chart(charts.by_context(frame, colors), key="compare_context", config=PLOTLY)
    st.download_button("Download (CSV)", lambda: csv_bytes(frame), "tau_by_context.csv", "text/csv", key="compare_context_csv",
                       on_click="ignore")


VIEWS = {
    "Eval by checkpoint": eval_view,
    "Engines": engines_view,
    "Under load": load_curves_view,
    "Training curves": train_view,
    "Acceptance by position": position_view,
    "By context": context_curves_view,
    "DDTree vs budget": ddtree_view,
    "Config": config_view,
    "Data": data_view,
}
NEEDS_HISTORIES = {"Training curves", "Data"}  # the views that read data.train_curves

# --------------------------------------------------------------------------- the page

banners = st.container()  # above the view switch, filled once the data is known
view = st.segmented_control("View", list(VIEWS), default=next(iter(VIEWS)), required=True, key="compare_view",
                            bind="query-params", label_visibility="collapsed",
                            help="one view at a time: only the one shown is computed")
history_runs = train_runs_for_histories(index, chosen)
results = ui.eval_results_loader(cfg.store_uri)
hist = ui.curves(cfg.store_uri, history_runs if view in NEEDS_HISTORIES else [], index=index)
data = compare_data(index, chosen, reference_id, hist, results, step)
if left_out_note is not None and data.not_picked:
    left_out_note.caption("Left out of the views by checkpoint: " + md("; ".join(data.not_picked)) + ".")
ref = data.reference
colors = charts.run_colors(index)
with banners:
    if data.target_note:
        # A reference for another model makes every other difference moot: said once, first, loudest.
        st.error(f"**{md(data.target_note)}**", icon="🚫")
    else:
        if ref_pick == AUTO:
            if choice.run_id is None or not choice.matches:
                st.warning(f"Reference: {md(choice.message)}", icon="ℹ️")
            else:
                st.caption(f"Reference: {md(choice.message)}")
        if ref is not None and ref.published:
            st.info(f"The reference **{md(ref.name)}** is published numbers for target "
                    f"{md_code(ref.target or 'unknown')}: its environment is unknown, so differences are warnings, "
                    "not proof of comparability.", icon="📖")
    # Every comparability warning in one panel, in the legend's words (≠ reference, ≠ training): open when
    # a series is not comparable with the reference, folded to one line otherwise.
    lists = [] if data.target_note else [data.resolution_notes, data.banner, data.protocol_notes]
    count = sum(map(len, [*lists, data.lineage_banner]))
    if count:
        critical = bool(data.banner) and not data.target_note
        with st.expander(f"{count} note(s) on what these numbers can be compared with"
                         + (" — some series are not comparable with the reference" if critical else ""),
                         expanded=critical, icon="⚠️" if critical else "ℹ️"):
            if not data.target_note:
                ui.bullet_list(data.resolution_notes, TITLES["resolution_notes"], st.warning,
                               icon="↔️")
                ui.bullet_list(data.banner, TITLES["banner"])
                if data.probe_help:
                    st.caption("Hidden states compared on the fixed probe input",
                               help=md("\n\n".join(data.probe_help)))
                ui.bullet_list(data.protocol_notes, TITLES["protocol_notes"], st.info, icon="📏")
            ui.bullet_list(data.lineage_banner, TITLES["lineage_banner"], st.warning)
    if data.reference_note:  # chosen for another target too: whether its line is drawn, or exactly why not
        (st.warning if data.reference_note.startswith("No reference") else st.caption)(md(data.reference_note))
with st.sidebar:
    # Built when clicked: the report reads every drawn eval's results and every training point.
    st.download_button(
        "Download report", lambda: report.compare_report(
            index, chosen, reference_id, ui.curves(cfg.store_uri, history_runs, index=index), results,
            cfg.store_uri, step).encode(),
        "draftboard-report.html", "text/html", key="compare_report", on_click="ignore", icon=":material/download:",
        help="one self-contained HTML file of this comparison: curves, warnings, environment and protocol "
             "differences, the vs-reference and vs-previous tables, every metric's definition; it opens offline "
             "(`draftboard report` writes the same)")
VIEWS[view]()
