"""Run detail: params, curves, checkpoints with their evals, fingerprint, link to mlflow ui."""

import json

import streamlit as st

from tracker.dashboard import (charts, context_view, curve_chart, doctor_view, lineage, load_view, metric_docs, recipe,
                               reconcile_view, ui, watch_form)
from tracker.dashboard.compare import run_acceptance
from tracker.dashboard.escape import md, md_code
from tracker.dashboard.tables import (
    checkpoints_frame,
    diff_frame,
    fingerprint_frame,
    metrics_frame,
    mlflow_ui_url,
    params_frame,
    picker_options,
)

cfg, index = ui.shared()

wanted = st.query_params.get("run")
if wanted and wanted not in index.runs and "detail_run" not in st.session_state:
    st.warning(f"No run with id {md_code(wanted)} in this store: the link names a run that does not exist here "
               "(deleted, or another store's). Showing another run.", icon="🔗")
trains = index.of_kind("train")
shown_first = wanted if wanted in index.runs else trains[0].run_id if trains else next(iter(index.runs))
run_ids, left_out = picker_options(index, ("train", "eval", "reference"),  # keeps only runs the index holds
                                   keep=[shown_first, st.session_state.get("detail_run")])
if st.session_state.get("detail_run") not in run_ids:  # deleted since
    st.session_state.pop("detail_run", None)
run_id = st.selectbox("Run", run_ids, index=run_ids.index(shown_first), key="detail_run",
                      format_func=lambda r: ui.run_option_label(index, r))
ui.picker_note(left_out)
if st.query_params.get("run") != run_id:
    st.query_params["run"] = run_id
run = index.runs[run_id]

st.title(md(run.name))
ui.env_badges(run)
meta = [f"**{md(run.kind_label)}**", f"status {md(run.status)}", f"target {md_code(run.target or 'unknown')}",
        f"id {md_code(run.run_id)}"]
st.markdown(" · ".join(meta))
if run.error:
    st.error(f"The run failed: {md(run.error)}")
if run.alert:
    st.warning(f"**Regression** — {md(run.alert)}", icon="📉")
if run.known_bad:
    st.warning(f"**Known-bad serving box** (docs/DESIGN.md, The known-bad table) — {md(run.known_bad)}", icon="⚠️")
if cfg.mlflow_ui:
    st.link_button("Open in mlflow ui", mlflow_ui_url(run, cfg.mlflow_ui), icon=":material/open_in_new:",
                   help=f"the same run in `mlflow ui` at {md_code(cfg.mlflow_ui)}")

# Lineage and environment check.
train = index.train_of(run)
if train is not None:
    step = f" at step {run.checkpoint_step}" if run.checkpoint_step is not None else ""
    st.markdown(f"Checkpoint{step} of training run **{md(index.label(train.run_id))}**: "
                f"{md_code(run.checkpoint or '?')}")
    st.page_link(ui.RUN_DETAIL_PAGE, label=f"Open {md(index.label(train.run_id))}", icon=":material/arrow_upward:",
                 query_params={"run": train.run_id})
open_pairs = lineage.mismatches(index, run)
if open_pairs:  # one banner for all of them: a training run with five such evals reads five lines, not five boxes
    ui.bullet_list([lineage.mismatch_text(index, pair) for pair in open_pairs],
                   "Critical environment difference" if len(open_pairs) == 1 else
                   f"{len(open_pairs)} evals differ critically from their training run")
    probes = [h for pair in open_pairs if (h := pair.probe_help(index))]
    if probes:
        st.caption("Hidden states compared on the fixed probe input", help=md("\n\n".join(probes)))
    if run.kind == "eval" and not cfg.readonly:
        ui.reevaluate(cfg, index, run.run_id, "detail_reeval")
for pair, by in lineage.resolutions(index, run):
    st.success(f"Resolved: {md(index.eval_label(pair.eval))} differed from training "
               f"({md(pair.summary())}); re-evaluated under training's environment as "
               f"**{md(index.label(by.run_id))}**", icon="✅")
    st.page_link(ui.RUN_DETAIL_PAGE, label=f"Open {md(index.label(by.run_id))}", icon=":material/science:",
                 query_params={"run": by.run_id})

if run.kind in ("eval", "reference") and not run.published and not cfg.readonly:
    # Published numbers were never an eval of ours: there is nothing to demote them to.
    target_kind = "eval" if run.kind == "reference" else "reference"
    label = "Demote to eval" if run.kind == "reference" else "Promote to reference"
    if st.button(label, key="detail_promote", icon=":material/star:",
                 help="references are the baselines the Compare page measures against"):
        with ui.reported():
            ui.tracker_for(cfg.store_uri).set_kind(run.run_id, target_kind)
            ui.refresh()
            st.toast(f"{md(run.name)} is now a {target_kind} run")
            st.rerun()


def context_section(run) -> None:
    results = ui.eval_results_loader(cfg.store_uri)(run) or (
        ui.imported_details(cfg.store_uri, run) if run.imported else None)
    frame = context_view.context_frame(results)
    if frame is None:
        if line := context_view.unavailable_line(results):
            st.caption(md(line))
        return
    st.markdown("**Acceptance by context length**", help="`tau_by_context`: the mean acceptance length of the blocks "
                "in each context-length bucket (`--context-buckets`; docs/DESIGN.md, Load, context and families): "
                "a checkpoint can hold at 1K and fall at 16K while one mean tau hides it")
    st.dataframe(frame, hide_index=True, key="detail_context", column_config={
        name: st.column_config.Column(name, help=what) for name, what in context_view.COLUMNS.items()})


def load_section(run) -> None:
    results = ui.eval_results_loader(cfg.store_uri)(run)
    frame = load_view.levels_frame(results)
    if frame is None:
        return
    st.markdown("**Under load**", help="`draftboard eval --engine vllm --concurrency ...`: the same prompts with "
                "several requests in flight, with the drafter and with the target alone (docs/DESIGN.md, Load sweeps)")
    st.dataframe(frame, hide_index=True, key="detail_load", column_config={
        name: (st.column_config.NumberColumn(name, help=what, format="%.3f" if name != "requests in flight" else "%d")
               if name in load_view.NUMBERS else st.column_config.Column(name, help=what))
        for name, what in load_view.COLUMNS.items()})
    crossing = load_view.break_even_line(results)
    if crossing:
        st.caption(crossing)
    ui.bullet_list(load_view.flag_lines(results), "Flagged under load", alert=st.warning)


def reconcile_section(run) -> None:
    st.markdown("**Served vs offline**", help="`draftboard reconcile`: the engine's own number (1 + accepted / "
                "drafts, pooled over steps) against an offline tau of the same checkpoint and prompts, the gap "
                "taken apart: definitions first, then acceptance on equal completions, then numerics")
    partners = reconcile_view.offline_partners(index, run)
    if not partners:
        st.info("No offline eval of this checkpoint on the same prompts (protocol.prompt_digest) to reconcile "
                "with: queue one from Launch with 'Measured by: offline'.")
        return
    other = st.selectbox("Offline eval", partners, key="detail_reconcile_with",
                         format_func=lambda r: ui.run_option_label(index, r.run_id))
    with ui.reported():
        report = reconcile_view.report(run, other, ui.eval_results_loader(cfg.store_uri))
        if report is None:
            st.warning("The results of one of the two runs cannot be read.")
            return
        st.markdown(md(report["verdict"]))
        st.dataframe(reconcile_view.parts_frame(report), hide_index=True, key="detail_reconcile_parts",
                     column_config={"change of the pooled mean": st.column_config.NumberColumn(format="%+.4f"),
                                    "what it is": st.column_config.TextColumn(width="large")})
        st.dataframe(reconcile_view.prompts_frame(report), hide_index=True, key="detail_reconcile_prompts")
        gdn = reconcile_view.gdn_frame(index, run, other)
        if gdn is not None:
            st.markdown("**Gated DeltaNet, per piece**", help="what ran each piece of the target's linear-attention "
                        "layers in training, in the offline eval and on the serving engine (its own kernels, read "
                        "in its Python and from its start log); critical: two sides ran different code")
            for note in (report.get("hybrid") or {}).get("notes", []):
                st.markdown(f"- {md(note)}")
            st.dataframe(gdn, hide_index=True, key="detail_reconcile_gdn")


def watch_section(run) -> None:
    """The run's checkpoint watch: its state, and (unless read-only) a form that registers one
    for `draftboard worker --watch` to run."""
    st.markdown("**Checkpoint watch**", help="records the checkpoints a training tool writes into a folder as they "
                                             "appear (z-lab folders, SpecForge epoch_*_step_* and *-stepN, "
                                             "speculators epoch folders), each digested once; with an eval preset, "
                                             "queues an eval of each, so Eval by checkpoint fills itself")
    state = None
    with ui.reported(st.warning):
        state = watch_form.state(ui.tracker_for(cfg.store_uri), run.run_id)
        if state is not None:
            st.caption(f"Watching {md_code(state.dir)}" + (" · evaluates each new checkpoint"
                                                           if state.preset else " · records only")
                       + f" · a checkpoint is taken once its files are {state.settle_s:g} s old. Scanned every "
                         "minute by a worker started with `--watch` (the one `draftboard ui` starts, and the "
                         "deployment's worker, are); with no worker running, nothing scans it.")
            seen = watch_form.seen_frame(state)
            if not seen.empty:
                st.dataframe(seen, hide_index=True, key="detail_watch_seen")
    if cfg.readonly:
        if state is None:
            st.caption("Not watched. This dashboard is read-only: start a watch with "
                       f"{md_code(f'draftboard watch {run.run_id} DIR')}.")
        return
    if not st.toggle("Watch a checkpoint folder" if state is None else "Change the watch", key="detail_watch",
                     help="registers the watch in the store; a worker started with `--watch` runs it (the one "
                          "`draftboard ui` starts does)"):
        return
    with st.form("detail_watch_form", enter_to_submit=False):  # Enter commits a field; only the button starts
        folder = st.text_input("Checkpoint folder", value=state.dir if state else "", key="detail_watch_dir",
                               help="the folder the tool saves its checkpoints in (SpecForge --output-dir, "
                                    "speculators --save-path)")
        auto = st.checkbox("Evaluate each new checkpoint", value=bool(state and state.preset), key="detail_watch_auto")
        preset = st.text_area("Eval preset (JSON eval params)", key="detail_watch_preset", height=160,
                              value=json.dumps(state.preset, indent=2) if state and state.preset
                              else watch_form.default_preset(index, run),
                              help="target, prompts, budgets, device, dtype, ...: the watcher fills in the drafter, "
                                   "train_run_id and checkpoint_step of each checkpoint")
        settle = st.number_input("Settle time (s)", min_value=0.0, value=state.settle_s if state
                                 else watch_form.DEFAULT_SETTLE_S, key="detail_watch_settle",
                                 help="a checkpoint is taken once none of its files changed for this long, so one "
                                      "still being written is not read half-way")
        st.caption(ui.allowed_roots_caption(cfg))
        if st.form_submit_button("Watch", icon=":material/visibility:", type="primary"):
            with ui.reported():
                state = watch_form.register(ui.tracker_for(cfg.store_uri), run.run_id, folder,
                                            preset if auto else "", settle, cfg.allowed_roots)
                st.toast(f"Watching {md_code(state.dir)}: `draftboard worker --watch` records each checkpoint "
                         "as it appears" + (" and queues its eval." if state.preset else "."))
                st.rerun()


colors = charts.run_colors(index)  # the run's colour on Compare too
tabs = st.tabs(["Metrics", "Checkpoints" if run.kind == "train" else "Acceptance", "Params", "Fingerprint", "Doctor"])

with tabs[0]:
    if run.kind == "train":
        frame = ui.curves(cfg.store_uri, [run.run_id], index=index)  # min and max per step range, as Compare
        if not frame.empty:  # another tool's metric names read as ours, its own in the legend
            frame = recipe.alias_curves(frame.assign(series=run.name, owner=run.run_id, dashed=False, reason=""),
                                        index)
        keys = metric_docs.sort_metrics(frame["key"].unique()) if not frame.empty else []
        if not keys:
            st.info("This run has logged no steps yet.")
        else:
            chosen = st.multiselect("Metrics", keys, default=keys[:4], key="detail_metrics",
                                    help="\n\n".join(metric_docs.help_text(k) for k in keys[:8]))
            cols = st.columns(2)
            for i, key in enumerate(chosen):
                with cols[i % 2]:
                    st.markdown(f"**{md(key)}**", help=metric_docs.help_text(key))
                    ui.canvas_chart(curve_chart.spec(frame, key, recipe.step_axis_title(index, [run.run_id]),
                                                       colors=colors), key=f"detail_curve_{key}")
            st.caption(ui.curves_caption(frame[frame["key"].isin(chosen)], zoomable=False))
    metrics = metrics_frame(run)
    if not metrics.empty:
        st.dataframe(metrics, hide_index=True, key="detail_metric_table",
                     column_config={"value": st.column_config.NumberColumn(format="%.3f"),
                                    "definition": st.column_config.TextColumn(width="large")})

with tabs[1]:
    if run.kind == "train":
        table = checkpoints_frame(index, run, ui.checkpoints(cfg, run.run_id))
        if table.empty:
            st.info("No checkpoints registered (`run.log_checkpoint(path, step)`) and no evals yet.")
        else:
            # What was measured first (tau, the env check, the evals), where a file sits last: at 1280 px the
            # numbers show without scrolling past a long path.
            # A row without a size (an eval of a checkpoint never registered) or a tau (not evaluated) reads "—",
            # not Streamlit's "None".
            st.dataframe(table.style.format({"size (MB)": "{:.3f}", "tau": "{:.3f}"}, na_rep="—"), hide_index=True,
                         key="detail_checkpoints",
                         column_order=["step", "tau", "env check", "evals", "size (MB)", "sha256", "path"],
                         column_config={
                "tau": st.column_config.Column("best tau", help=metric_docs.help_text("tau")),
                "evals": st.column_config.TextColumn(width="large"),
                "path": st.column_config.TextColumn(width="medium"),
            })
        evals = index.evals_of(run.run_id, ("eval", "reference"))
        for ev in evals:
            # eval_label names the run and its step; the run's own name only where it says something else
            named = "" if ev.name.startswith(index.eval_label(ev)) else f" — {ev.name}"
            st.page_link(ui.RUN_DETAIL_PAGE, label=md(f"{index.eval_label(ev)}{named} [{ev.env_badges}]"),
                         query_params={"run": ev.run_id}, icon=":material/science:")
        watch_section(run)
    else:
        positions, trees = run_acceptance(run, ui.eval_results_loader(cfg.store_uri))
        if not positions.empty:
            st.markdown("**Acceptance rate by draft position**", help=metric_docs.family_help("accept_rate_pos"))
            st.plotly_chart(charts.accept_by_position(positions, colors), key="detail_positions")
        if not trees.empty:
            st.markdown("**DDTree tau vs node budget**", help=metric_docs.family_help("ddtree_tau"))
            st.plotly_chart(charts.ddtree_vs_budget(trees, colors), key="detail_ddtree")
        if positions.empty and trees.empty:
            st.info("This run has no per-position or DDTree results.")
        context_section(run)
        if reconcile_view.is_engine_eval(run):
            load_section(run)
            reconcile_section(run)

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
            st.info(f"Fingerprint source: **{md(run.source_kind)}** — fields the source does not state are unknown.")
        st.dataframe(fingerprint_frame(run.fingerprint), hide_index=True, key="detail_fingerprint",
                     column_config={"value": st.column_config.TextColumn(width="large")})
        own = lineage.vs_training(index, run)
        if own is not None:
            rows = own.rows
            st.markdown(f"**Differences from its training run** ({md(index.label(train.run_id))})")
            if rows:
                st.dataframe(diff_frame(rows, "this eval", "training run"), hide_index=True, key="detail_diff")
            elif rows is not None:  # no row differs (`Lineage.rows` is a tuple: never `== []`)
                st.success("Same environment as the training run.")
            else:
                st.caption("The training run has no fingerprint: not comparable.")
        with st.expander("Raw fingerprint.json"):
            st.json(run.fingerprint, expanded=False)

with tabs[4]:
    shown = doctor_view.frame(ui.doctor_report(cfg.store_uri, run))
    if shown is None:
        st.info("No doctor report on this run. `draftboard doctor` checks the hidden-state layer mapping, the "
                "checkpoint against its config and target, the mask and stop tokens, thinking, a serving config and "
                "this machine against the training run's fingerprint; with `--run` it attaches its report here.")
        st.code(doctor_view.command(run), language="bash")
    else:
        worst = doctor_view.severity(run)
        alert = {"critical": st.error, "warning": st.warning, "ok": st.success}.get(worst, st.info)
        alert(f"Doctor: **{md(worst or '?')}** — {len(shown)} checks, the most severe first.")
        st.dataframe(shown, hide_index=True, key="detail_doctor", column_config={
            "verdict": st.column_config.TextColumn(width="large"),
            "evidence": st.column_config.TextColumn(width="large"),
            "fix": st.column_config.TextColumn(width="medium")})
