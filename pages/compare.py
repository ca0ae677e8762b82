"""Compare: training and eval curves of chosen runs against a reference, with environment checks."""

import streamlit as st

from tracker.dashboard import charts, metric_docs, ui
from tracker.dashboard.compare import (
    best_evals,
    closest_reference,
    common_budgets,
    compare_data,
    default_selection,
    outside_budgets,
    reference_label,
    train_runs_for_histories,
)
from tracker.dashboard.escape import csv_bytes, md, md_code

AUTO = "__closest__"
NONE = "__none__"

cfg, index = ui.shared()
st.title("Compare")

options = [r.run_id for r in index.of_kind("train", "eval")]
if not options:
    st.info("No training or eval runs to compare yet: log a training run, or evaluate a checkpoint with "
            "`draftboard eval` (or from the Launch page).")
    st.stop()
from_url = [r for r in st.query_params.get("runs", "").split(",") if r in options]
if "compare_runs" not in st.session_state:
    st.session_state["compare_runs"] = from_url or default_selection(index)
else:  # runs may have been deleted since
    st.session_state["compare_runs"] = [r for r in st.session_state["compare_runs"] if r in options]
chosen = st.multiselect("Runs", options, key="compare_runs", format_func=lambda r: ui.run_option_label(index, r),
                        help="training runs (their curves, and their evals by checkpoint) and single eval runs")
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
    full = st.toggle("Full resolution", key="compare_full",
                     help=f"off: at most {ui.DEFAULT_MAX_POINTS} points per training curve (every k-th step, first "
                          "and last kept); on: every logged point (slower for long runs)")
reference_id = choice.run_id if ref_pick == AUTO else (None if ref_pick == NONE else ref_pick)


def _pick_label(run_id: str) -> str:
    ev = index.runs[run_id]
    tau = ev.metrics.get("tau")
    return (f"step {ev.checkpoint_step} · {ev.linear_attn}/{ev.device}/{ev.dtype}"
            + (f" · tau {tau:.3f}" if isinstance(tau, float) else ""))


picks = {}
with st.sidebar:
    ranked = {r: best_evals(index, index.runs[r], index.get(reference_id)) for r in chosen
              if index.runs[r].kind == "train"}
    if any(len(evals) > 1 for evals in ranked.values()):
        st.subheader("Checkpoint drawn", help="which eval of each training run the Acceptance by position and "
                                              "DDTree tabs draw. Default: the one closest to the reference's "
                                              "environment, then to its training run's; then the latest step.")
        for run_id, evals in ranked.items():
            if len(evals) > 1:
                picks[run_id] = st.selectbox(index.label(run_id), [e.run_id for e in evals],
                                             key=f"compare_pick_{run_id}", format_func=_pick_label)

hist = ui.histories(cfg.store_uri, train_runs_for_histories(index, chosen),
                    max_points=None if full else ui.DEFAULT_MAX_POINTS, index=index)
data = compare_data(index, chosen, reference_id, hist, ui.eval_results_loader(cfg.store_uri), picks)
ref = data.reference
colors = charts.run_colors(index)
PLOTLY = {"displaylogo": False}
if data.target_note:
    # A reference for another model makes every other difference moot: said once, first, loudest.
    st.error(f"**{md(data.target_note)}**", icon=":material/error:")
else:
    if ref_pick == AUTO:
        if choice.run_id is None or not choice.matches:
            st.warning(f"Reference: {md(choice.message)}", icon=":material/info:")
        else:
            st.caption(f"Reference: {md(choice.message)}")
    if ref is not None and ref.published:
        st.info(f"The reference **{md(ref.name)}** is published numbers for target {md_code(ref.target or 'unknown')}: "
                "its environment is unknown, so differences are warnings, not proof of comparability.",
                icon=":material/menu_book:")
    ui.bullet_list(data.banner, "Environment differs critically from the reference — drawn dashed on every chart "
                                "(the legend says why), not comparable:")
ui.bullet_list(data.lineage_banner, "Evaluated in a different environment than trained:", st.warning)

tab_eval, tab_train, tab_pos, tab_tree, tab_data = st.tabs(
    ["Eval by checkpoint", "Training curves", "Acceptance by position", "DDTree vs budget", "Data"])

with tab_eval:
    if not data.eval_metrics:
        st.info("No eval results for these runs yet: evaluate a checkpoint from the Launch page or with "
                "`draftboard eval --train-run-id ... --checkpoint-step ...`.")
    else:
        wanted = [m for m in ("tau", "streak") if m in data.eval_metrics] or data.eval_metrics[:1]
        keys = st.multiselect("Eval metrics", data.eval_metrics, default=wanted, key="compare_eval_metrics",
                              help="\n\n".join(metric_docs.help_text(k) for k in data.eval_metrics
                                               if metric_docs.family(k) != "accept_rate_pos"))
        ref_label = reference_label(index, ref) if ref is not None else None
        cols = st.columns(2)
        for i, key in enumerate(keys):
            with cols[i % 2]:
                st.markdown(f"**{md(key)}** · {md(metric_docs.describe(key).title)}", help=metric_docs.help_text(key))
                st.plotly_chart(charts.eval_curves(data.eval_points, key, data.reference_values.get(key), ref_label,
                                                   colors), key=f"compare_eval_{key}", config=PLOTLY)
        shown = data.eval_points[data.eval_points["key"].isin(keys)]
        st.download_button("Download shown eval data (CSV)", csv_bytes(shown), "eval_by_checkpoint.csv", "text/csv",
                           key="compare_eval_csv", on_click="ignore")

with tab_train:
    if not data.train_metrics:
        st.info("No training steps logged by the chosen runs.")
    else:
        keys = st.multiselect("Training metrics", data.train_metrics, default=data.train_metrics[:4],
                              key="compare_train_metrics",
                              help="\n\n".join(metric_docs.help_text(k) for k in data.train_metrics))
        with st.container(horizontal=True):
            smoothing = st.slider("Smoothing", 0.0, 0.99, 0.6, 0.01, key="compare_smoothing",
                                  help="exponential moving average weight w: each point is w × the previous smoothed "
                                       "value + (1 − w) × its own. 0: raw. The raw curve stays behind, faint.")
            log_x = st.toggle("Log step axis", key="compare_log_step",
                              help="training step on a log scale: early training is readable next to late")
        cols = st.columns(2)
        for i, key in enumerate(keys):
            with cols[i % 2]:
                st.markdown(f"**{md(key)}** · {md(metric_docs.describe(key).title)}", help=metric_docs.help_text(key))
                st.plotly_chart(charts.step_curves(data.train_curves, key, colors=colors, smoothing=smoothing,
                                                   log_x=log_x), key=f"compare_train_{key}", config=PLOTLY)
        shown = data.train_curves[data.train_curves["key"].isin(keys)]
        st.caption(f"{len(shown):,} points shown" + ("" if full else
                                                      f" (at most {ui.DEFAULT_MAX_POINTS} per curve)"))
        st.download_button("Download shown training data (CSV)", csv_bytes(shown), "training_curves.csv",
                           "text/csv", key="compare_train_csv", on_click="ignore")

def per_run_tab(title: str, family: str, frame, figure, empty: str, csv_name: str, key: str) -> None:
    """A chart of one checkpoint per chosen run, with its data as CSV."""
    st.markdown(f"**{title}**", help=metric_docs.family_help(family))
    if frame.empty:
        st.info(empty)
        return
    st.caption("Training runs: one evaluated checkpoint each, picked in the sidebar (default: the eval closest to "
               "the reference's environment).")
    st.plotly_chart(figure(frame), key=f"compare_{key}", config=PLOTLY)
    st.download_button("Download (CSV)", csv_bytes(frame), csv_name, "text/csv", key=f"compare_{key}_csv",
                       on_click="ignore")


with tab_pos:
    per_run_tab("Acceptance rate by draft position", "accept_rate_pos", data.accept_by_position,
                lambda frame: charts.accept_by_position(frame, colors), "No per-position acceptance for these runs.",
                "accept_by_position.csv", "positions")

with tab_tree:
    span = common_budgets(data.ddtree)
    per_run_tab("DDTree tau against node budget", "ddtree_tau", data.ddtree,
                lambda frame: charts.ddtree_vs_budget(frame, colors, span), "No DDTree results for these runs.",
                "ddtree_vs_budget.csv", "ddtree")
    outside = outside_budgets(data.ddtree, span)
    if outside:
        st.caption(f"The axis spans the budgets every series has ({span[0]}–{span[1]} nodes). Also measured, off "
                   f"the chart (in the CSV): {md('; '.join(outside))}.")

with tab_data:
    export = data.export_frame()
    st.dataframe(export, hide_index=True, key="compare_data_table")
    st.download_button("Download all shown data (CSV)", csv_bytes(export), "compare.csv", "text/csv",
                       key="compare_csv", on_click="ignore")
    with st.expander("Metric definitions"):
        for doc in metric_docs.glossary():
            st.markdown(doc.help())
