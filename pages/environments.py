"""Environments: fingerprints side by side, train-vs-eval pairs, re-evaluation in the training environment."""

import streamlit as st

from tracker.dashboard import ui
from tracker.dashboard.compare_deltas import told_apart
from tracker.dashboard.envmatrix import (SEVERITY_LEGEND, evidence_frame, fingerprint_matrix, pairs_table,
                                        unfingerprinted)
from tracker.dashboard.escape import md, md_code
from tracker.dashboard.lineage import resolved_by, train_eval_pairs
from tracker.dashboard.tables import PICKER_RUNS, picker_options

cfg, index = ui.shared()
st.title("Environments")

# ------------------------------------------------------------------ train vs eval
st.subheader("Training run vs its evals",
             help="each eval's fingerprint against its training run's; critical = can change the numbers "
                  "(linear-attention path, dtype, device kind, attention implementation, torch/transformers/fla "
                  "minor version, TF32, hidden-state probe)")
pairs = train_eval_pairs(index)
answered: set[str] = set()  # evals a matching re-evaluation answered (the table's *re-evaluated as*)
if not pairs:
    st.info("No eval is linked to a training run yet (evals carry the tag `draftboard.train_run_id`).")
else:
    table = pairs_table(index)
    redone = table["re-evaluated as"].ne("")
    answered = set(table.loc[redone, "eval_run_id"])
    n_crit = int((table["critical"] > 0).sum())  # open ones: a re-evaluation's answer counts 0
    if n_crit:
        st.error(f"{n_crit} eval(s) ran in an environment that differs critically from their training run.",
                 icon="⚠️")
    if redone.any():
        st.success(f"{int(redone.sum())} such eval(s) were re-evaluated under their training run's environment "
                   "and match it (column *re-evaluated as*).", icon="✅")
    # What differs right after which eval it is: at 1280 px it shows without scrolling past the counts.
    first = ["check", "eval", "differences", "re-evaluated as"]
    st.dataframe(table, hide_index=True, key="env_pairs",
                 column_order=first + [c for c in table.columns if c not in (*first, "eval_run_id")],
                 column_config={"differences": st.column_config.TextColumn(width="medium"),
                                "re-evaluated as": st.column_config.TextColumn(width="medium"),
                                "critical": st.column_config.NumberColumn(
                                    help="critical differences still open: one a re-evaluation in the training "
                                         "environment answered counts 0 (its row names the re-evaluation)")})

    # -------------------------------------------------------------- re-evaluate
    if not cfg.readonly:
        # An eval a re-evaluation already answered is not offered again (its row says *re-evaluated as*);
        # the evals that differ critically first (what there is to repeat), then the rest, as many as a picker
        # offers (tables.PICKER_RUNS): each option is labelled and sent on every visit
        open_first = sorted((p for p in pairs if p.eval.run_id not in answered), key=lambda p: not p.critical)
        eval_ids = [p.eval.run_id for p in open_first[:PICKER_RUNS]]
        if eval_ids:
            named = told_apart(index, [index.runs[r] for r in eval_ids])  # two evals of one step: never alike
            pick = st.selectbox("Eval to repeat", eval_ids, key="env_reeval_run",
                                format_func=lambda r: f"{named[r]} — {index.runs[r].env_badges}",
                                help="the same target, drafter, prompts and settings as this eval, with its training "
                                     "run's linear-attention path, dtype, drafter precision and device")
            ui.reevaluate(cfg, index, pick, "env_reeval")

# ------------------------------------------------------------------ no fingerprint
SHOWN_FIXES = 15
missing = unfingerprinted(index, cfg.store_uri)
if not missing.empty:
    st.subheader(f"Runs without a fingerprint ({len(missing)})",
                 help="their environment is unknown, so no environment check can compare them; runs other tools "
                      "(SpecForge, speculators, the HF Trainer) wrote are the usual case")
    st.caption("Run the command on the machine that trained the run, in its environment (same Python, torch, GPU); "
               "or add `tracker.attach_fingerprint()` to the launch script.")
    for row in missing.head(SHOWN_FIXES).itertuples(index=False):
        st.markdown(f"**{md(row.run)}** · {md(row.kind)}: {md_code(row.fix)}")
    if len(missing) > SHOWN_FIXES:
        with st.expander(f"All {len(missing)} runs"):
            st.dataframe(missing, hide_index=True, key="env_unfingerprinted",
                         column_config={"fix": st.column_config.TextColumn(width="large")})

# ------------------------------------------------------------------ matrix
st.subheader("Fingerprint matrix", help="one column per run; cells are graded against the baseline column")
if "env_runs" not in st.session_state:
    # an open mismatch first: a re-evaluated one's red cells are history, shown when chosen (said below)
    first = next((p for p in pairs if p.critical and p.eval.run_id not in answered), pairs[0] if pairs else None)
    st.session_state["env_runs"] = [first.train.run_id, first.eval.run_id] if first else list(index.runs)[:3]
options, left_out = picker_options(index, ("train", "eval", "reference"), keep=st.session_state["env_runs"])
st.session_state["env_runs"] = [r for r in st.session_state["env_runs"] if r in options]  # deleted since
chosen = st.multiselect("Runs", options, key="env_runs", format_func=lambda r: ui.run_option_label(index, r))
ui.picker_note(left_out)
if not chosen:
    st.info("Choose runs to see their fingerprints side by side.")
    st.stop()
c1, c2 = st.columns([3, 1])
baseline = c1.selectbox("Baseline", chosen, key="env_baseline", format_func=lambda r: ui.run_option_label(index, r))
show_all = c2.toggle("Show all fields", key="env_all", help="off: only fields that differ somewhere")
labels = {r: index.label(r) for r in chosen}
matrix = fingerprint_matrix({labels[r]: index.runs[r].fingerprint for r in chosen}, labels[baseline],
                            only_differing=not show_all)
st.markdown(f"Cells differing from **{md(labels[baseline])}**: {SEVERITY_LEGEND}")
if matrix.values.empty:
    st.success("No differences: these runs' numbers are comparable.")
else:
    summary = ", ".join(f"{label}: {c['critical']} critical, {c['warning']} warning"
                        for label, c in matrix.counts.items() if label != matrix.baseline)
    if summary:
        st.caption(md(summary))
    for r in chosen:
        by = resolved_by(index, index.runs[r]) if index.runs[r].kind == "eval" else None
        if by is not None:
            st.caption(f"{md(labels[r])} was re-evaluated in its training run's environment as "
                       f"{md(index.label(by.run_id))}, which matches it: its differences here are answered.")
    st.dataframe(matrix.styled(), key="env_matrix", height=min(36 * (len(matrix.values) + 1) + 4, 700))

# ------------------------------------------------------------------ evidence
cited, conflicts = evidence_frame({labels[r]: index.runs[r].fingerprint for r in chosen})
if not cited.empty or conflicts:
    st.subheader("Where imported runs' values come from",
                 help="an imported run's environment is read from its own files (its console, its package list, its "
                      "tracker's metadata); each value cites the file, the line and the rule that read it")
    for label, text in conflicts:
        st.warning(f"**{md(label)}**: its own files disagree. {md(text)}", icon="⁉️")
    SHOWN_CITATIONS = 60
    for row in cited.head(SHOWN_CITATIONS).itertuples(index=False):
        st.markdown(f"**{md(row.run)}** · {md_code(row.field)} = {md_code(row.value)} · {md_code(row.source)} "
                    f"“{md(row.quoted)}” ({md(row.rule)})")
    if len(cited) > SHOWN_CITATIONS:
        with st.expander(f"All {len(cited)} citations"):
            st.dataframe(cited, hide_index=True, key="env_evidence")
