"""Run detail: params, curves, checkpoints with their evals, fingerprint, link to mlflow ui."""

import streamlit as st

from tracker.dashboard import charts
from tracker.dashboard import metric_docs
from tracker.dashboard import ui
from tracker.dashboard.compare import run_acceptance
from tracker.errors import DraftboardError
from tracker.dashboard.views import (
    checkpoints_frame,
    diff_frame,
    env_diff,
    eval_label,
    fingerprint_frame,
    lineage_mismatches,
    metrics_frame,
    mismatch_text,
    mlflow_ui_url,
    params_frame,
)

cfg = ui.settings()
index = ui.load_index_or_stop(cfg)
ui.store_sidebar(cfg, index)

run_ids = list(index.runs)
wanted = st.query_params.get("run")
trains = index.of_kind("train")
default = run_ids.index(wanted) if wanted in index.runs else run_ids.index(trains[0].run_id) if trains else 0
run_id = st.selectbox("Run", run_ids, index=default, key="detail_run",
                      format_func=lambda r: ui.run_option_label(index, r))
if st.query_params.get("run") != run_id:
    st.query_params["run"] = run_id
run = index.runs[run_id]

st.title(run.name)
ui.env_badges(run)
meta = [f"**{run.kind_label}**", f"status {run.status}", f"target `{run.target or 'unknown'}`", f"id `{run.run_id}`"]
st.markdown(" · ".join(meta))
if run.error:
    st.error(f"The run failed: {run.error}")
st.link_button("Open in mlflow ui", mlflow_ui_url(run, cfg.mlflow_ui), icon=":material/open_in_new:",
               help=f"the same run in `mlflow ui` at {cfg.mlflow_ui} (set DRAFTBOARD_MLFLOW_UI to change)")

# Lineage and environment check.
train = index.train_of(run)
if train is not None:
    step = f" at step {run.checkpoint_step}" if run.checkpoint_step is not None else ""
    st.markdown(f"Checkpoint{step} of training run **{index.label(train.run_id)}**: `{run.checkpoint or '?'}`")
    st.page_link(ui.RUN_DETAIL_PAGE, label=f"Open {index.label(train.run_id)}", icon=":material/arrow_upward:",
                 query_params={"run": train.run_id})
for m in lineage_mismatches(index, run):
    st.error(f"**Critical environment difference** — {mismatch_text(index, m)}", icon=":material/warning:")

if run.kind in ("eval", "reference") and not cfg.readonly:
    target_kind = "eval" if run.kind == "reference" else "reference"
    label = "Demote to eval" if run.kind == "reference" else "Promote to reference"
    if st.button(label, key="detail_promote", icon=":material/star:",
                 help="references are the baselines the Compare page measures against"):
        try:
            ui.tracker_for(cfg.store_uri).set_kind(run.run_id, target_kind)
        except DraftboardError as exc:
            st.error(str(exc))
        else:
            ui.refresh()
            st.toast(f"{run.name} is now a {target_kind} run")
            st.rerun()

tabs = st.tabs(["Metrics", "Checkpoints" if run.kind == "train" else "Acceptance", "Params", "Fingerprint"])

with tabs[0]:
    if run.kind == "train":
        frame = ui.histories(cfg.store_uri, [run.run_id], index=index)
        keys = metric_docs.sort_metrics(frame["key"].unique()) if not frame.empty else []
        if not keys:
            st.info("This run has logged no steps yet.")
        else:
            frame = frame.assign(series=run.name, dashed=False)
            chosen = st.multiselect("Metrics", keys, default=keys[:4], key="detail_metrics",
                                    help="\n\n".join(metric_docs.help_text(k) for k in keys[:8]))
            cols = st.columns(2)
            for i, key in enumerate(chosen):
                with cols[i % 2]:
                    st.markdown(f"**{key}**", help=metric_docs.help_text(key))
                    st.plotly_chart(charts.step_curves(frame, key), key=f"detail_curve_{key}")
            st.caption(f"Curves show at most {ui.DEFAULT_MAX_POINTS} points each (every k-th step).")
    metrics = metrics_frame(run)
    if not metrics.empty:
        st.dataframe(metrics, hide_index=True, key="detail_metric_table",
                     column_config={"value": st.column_config.NumberColumn(format="%.4f"),
                                    "definition": st.column_config.TextColumn(width="large")})

with tabs[1]:
    if run.kind == "train":
        try:
            checkpoints = ui.tracker_for(cfg.store_uri).checkpoints(run.run_id)
        except DraftboardError as exc:
            checkpoints = []
            st.warning(str(exc))
        table = checkpoints_frame(index, run, checkpoints)
        if table.empty:
            st.info("No checkpoints registered (`run.log_checkpoint(path, step)`) and no evals yet.")
        else:
            st.dataframe(table, hide_index=True, key="detail_checkpoints", column_config={
                "size (MB)": st.column_config.NumberColumn(format="%.3f"),
                "tau": st.column_config.NumberColumn("best tau", format="%.3f", help=metric_docs.help_text("tau")),
                "evals": st.column_config.TextColumn(width="large"),
            })
        evals = index.evals_of(run.run_id, ("eval", "reference"))
        for ev in evals:
            st.page_link(ui.RUN_DETAIL_PAGE, label=f"{eval_label(index, ev)} — {ev.name} [{ev.env_badges}]",
                         query_params={"run": ev.run_id}, icon=":material/science:")
    else:
        positions, trees = run_acceptance(run, ui.eval_results_loader(cfg.store_uri))
        if not positions.empty:
            st.markdown("**Acceptance rate by draft position**", help=metric_docs.help_text("accept_rate_pos1"))
            st.plotly_chart(charts.accept_by_position(positions), key="detail_positions")
        if not trees.empty:
            st.markdown("**DDTree tau vs node budget**", help=metric_docs.help_text("ddtree_tau_b8"))
            st.plotly_chart(charts.ddtree_vs_budget(trees), key="detail_ddtree")
        if positions.empty and trees.empty:
            st.info("This run has no per-position or DDTree results.")

with tabs[2]:
    params = params_frame(run)
    if params.empty:
        st.info("No params logged.")
    else:
        st.dataframe(params, hide_index=True, key="detail_params")

with tabs[3]:
    if run.fingerprint is None:
        st.warning("No fingerprint.json on this run (not logged by draftboard?).")
    else:
        if run.source_kind not in (None, "captured"):
            st.info(f"Fingerprint source: **{run.source_kind}** — fields the source does not state are unknown.")
        st.dataframe(fingerprint_frame(run.fingerprint), hide_index=True, key="detail_fingerprint",
                     column_config={"value": st.column_config.TextColumn(width="large")})
        if train is not None:
            rows = env_diff(run, train)
            st.markdown(f"**Differences from its training run** ({index.label(train.run_id)})")
            if rows:
                st.dataframe(diff_frame(rows, "this eval", "training run"), hide_index=True, key="detail_diff")
            elif rows == []:
                st.success("Same environment as the training run.")
            else:
                st.caption("The training run has no fingerprint: not comparable.")
        with st.expander("Raw fingerprint.json"):
            st.json(run.fingerprint, expanded=False)
