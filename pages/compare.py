"""Compare: training and eval curves of chosen runs against a reference, with environment checks."""

import streamlit as st

from tracker.dashboard import charts, metric_docs, ui
from tracker.dashboard.compare import (
    closest_reference,
    compare_data,
    default_selection,
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
if ref_pick == AUTO:
    if choice.run_id is None or not choice.matches:
        st.warning(f"Reference: {md(choice.message)}", icon=":material/info:")
    else:
        st.caption(f"Reference: {md(choice.message)}")

hist = ui.histories(cfg.store_uri, train_runs_for_histories(index, chosen),
                    max_points=None if full else ui.DEFAULT_MAX_POINTS, index=index)
data = compare_data(index, chosen, reference_id, hist, ui.eval_results_loader(cfg.store_uri))
ref = data.reference
if ref is not None and ref.published:
    st.info(f"The reference **{md(ref.name)}** is published numbers for target {md_code(ref.target or 'unknown')}: its "
            "environment is unknown, so differences are warnings, not proof of comparability.",
            icon=":material/menu_book:")
ui.bullet_list(data.banner, "Environment differs critically from the reference — drawn dashed, not comparable:")
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
                st.plotly_chart(charts.eval_curves(data.eval_points, key, data.reference_values.get(key), ref_label),
                                key=f"compare_eval_{key}")
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
        cols = st.columns(2)
        for i, key in enumerate(keys):
            with cols[i % 2]:
                st.markdown(f"**{md(key)}** · {md(metric_docs.describe(key).title)}", help=metric_docs.help_text(key))
                st.plotly_chart(charts.step_curves(data.train_curves, key), key=f"compare_train_{key}")
        shown = data.train_curves[data.train_curves["key"].isin(keys)]
        st.caption(f"{len(shown):,} points shown" + ("" if full else
                                                      f" (at most {ui.DEFAULT_MAX_POINTS} per curve)"))
        st.download_button("Download shown training data (CSV)", csv_bytes(shown), "training_curves.csv",
                           "text/csv", key="compare_train_csv", on_click="ignore")

def per_run_tab(title: str, family: str, frame, figure, empty: str, csv_name: str, key: str) -> None:
    """A chart of each run's latest evaluated checkpoint, with its data as CSV."""
    st.markdown(f"**{title}**", help=metric_docs.family_help(family))
    if frame.empty:
        st.info(empty)
        return
    st.caption("Training runs: their latest evaluated checkpoint.")
    st.plotly_chart(figure(frame), key=f"compare_{key}")
    st.download_button("Download (CSV)", csv_bytes(frame), csv_name, "text/csv", key=f"compare_{key}_csv",
                       on_click="ignore")


with tab_pos:
    per_run_tab("Acceptance rate by draft position", "accept_rate_pos", data.accept_by_position,
                charts.accept_by_position, "No per-position acceptance for these runs.", "accept_by_position.csv",
                "positions")

with tab_tree:
    per_run_tab("DDTree tau against node budget", "ddtree_tau", data.ddtree, charts.ddtree_vs_budget,
                "No DDTree results for these runs.", "ddtree_vs_budget.csv", "ddtree")

with tab_data:
    export = data.export_frame()
    st.dataframe(export, hide_index=True, key="compare_data_table")
    st.download_button("Download all shown data (CSV)", csv_bytes(export), "compare.csv", "text/csv",
                       key="compare_csv", on_click="ignore")
    with st.expander("Metric definitions"):
        for doc in metric_docs.glossary():
            st.markdown(doc.help())
