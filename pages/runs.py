"""Runs: every training, eval and reference run in one table."""

from collections import Counter

import streamlit as st

from tracker.dashboard import lineage, metric_docs, ui
from tracker.dashboard.escape import csv_bytes
from tracker.dashboard.tables import RUNS_PAGE_ROWS, WRAP_ROW_HEIGHT, filter_runs, runs_display, runs_table

index = ui.shared().index
st.title("Runs")
st.caption("draftboard tracks DFlash drafters: their training runs, evals and references, each number with the "
           "environment, protocol and sample size that make it comparable with another, or say why not.")
open_evals = lineage.open_evals(index)
if open_evals:
    with st.container(horizontal=True, vertical_alignment="center"):
        st.warning(f"{len(open_evals)} eval(s) ran in a different environment than trained: their numbers are not "
                   "the drafter as trained. (Runs flagged 🔴 below counts every row with a 🔴: these evals, their "
                   "training runs, and evals whose protocol differs.)", icon="⚠️")
        st.page_link(ui.ENVIRONMENTS_PAGE, label="Re-evaluate", icon=":material/replay:")

with st.sidebar:
    st.subheader("Filters")
    kinds = st.multiselect("Kind", ["train", "eval", "reference"], key="runs_kind",
                           help="train: training runs; eval: evaluations of checkpoints; reference: runs to compare "
                                "against (e.g. z-lab's drafter, published numbers)")
    targets = st.multiselect("Target", index.targets(), key="runs_target", help="the target model a run belongs to")
    tags = st.multiselect("Tag", index.user_tags(), key="runs_tag",
                          help="runs carrying every chosen tag (key=value), e.g. env.linear_attn=fallback")
search = st.text_input("Search by name", key="runs_search", placeholder="name or run id prefix",
                       label_visibility="collapsed")

runs = filter_runs(index, kinds, targets, tags, search)
if not runs:
    st.info("No run matches the filters.", icon="🔍")
    st.stop()

table = runs_table(index, runs)
flagged = Counter(index.runs[r].kind for r in table.loc[table["critical"] > 0, "run_id"])
n_bad = sum(flagged.values())
of_kind = Counter(r.kind for r in runs)
cols = st.columns(4)
cols[0].metric("Training runs", of_kind["train"])
cols[1].metric("Evals", of_kind["eval"])
cols[2].metric("References", of_kind["reference"])
cols[3].metric("Runs flagged 🔴", n_bad,
               help=f"{', '.join(f'{n} {kind}' for kind, n in flagged.most_common()) or 'none'}: the rows with a 🔴 in "
                    "env or protocol. An eval whose environment differs critically from its training run's (and its "
                    "training run, on whose row the step is named), or whose protocol differs critically from the "
                    "evals it is drawn with (another prompt set or dataset, thinking, temperature, block size): "
                    "their numbers are not comparable")

tau_help = (metric_docs.help_text("tau") + " Shown with its 95% interval over prompts, the number of prompts, the "
            "sampling (T=0: greedy) and the new tokens per prompt; a training run's is its latest evaluated "
            "checkpoint's (`@ step`); published numbers per dataset. The CSV also has `tau latest` and `tau best`.")
GRID_HEADER_PX = 38  # the grid's header row
# Widths add up to 1100 px: with the selection column, what a 1600 px screen leaves beside the sidebar (the
# e2e test measures it); the kind column wraps "reference · published" between its words, never inside one. Rows taller than 4rem let the grid wrap text, so names and reasons read whole in
# three lines instead of being cut; the env and protocol reasons get the most room.
# A page of rows at a time: what the browser is sent and draws stays bounded by what it shows, however
# large the store (the counts above and the CSV are over every matching run).
pages = max(1, -(-len(table) // RUNS_PAGE_ROWS))
page = 1
if pages > 1:
    page = st.number_input(f"Page (of {pages:,}, {RUNS_PAGE_ROWS} runs each)", min_value=1, max_value=pages,
                           value=1, step=1, key="runs_page")
shown = table.iloc[(page - 1) * RUNS_PAGE_ROWS:page * RUNS_PAGE_ROWS]
event = st.dataframe(
    runs_display(shown),
    key=f"runs_table_{page}",  # a selection belongs to the page it was made on
    hide_index=True,
    row_height=WRAP_ROW_HEIGHT,
    # Streamlit's "auto" height holds ten rows of its default height, five of these: show up to twelve
    height=GRID_HEADER_PX + WRAP_ROW_HEIGHT * min(len(shown), 12) + 2,
    on_select="rerun",
    selection_mode="multi-row",
    column_order=[c for c in table.columns if c not in ("critical", "run_id", "tau latest", "tau best", "linear-attn",
                                                        "device", "dtype")],
    column_config={
        "env check": st.column_config.TextColumn(
            "env", help="🔴 what differs critically between an eval and its training run (on a training run's "
                        "row: at which evaluated step). 🟢 re-evaluated: the difference was answered by the same eval "
                        "repeated in the training run's environment. ✓ the same environment as its training run (on a "
                        "training run's row: every eval's). ⚪ no fingerprint. Empty: nothing to compare with (no "
                        "training run, or no eval yet).",
            width=140),
        "protocol check": st.column_config.TextColumn(
            "protocol", help="🔴 how an eval's protocol differs critically from the latest other eval of its training "
                             "run (on a training run's row: which evaluated steps differ from its latest eval's): "
                             "another prompt set or dataset, thinking, greedy vs sampled or other top_p / top_k, block "
                             "size. 🔵 online: tau from z-lab's cached online loop, not the lossless offline score. "
                             "🎲 sampled (T > 0): its tau is the expected acceptance length over xN draws per prompt. "
                             "⚪ evaluated before protocols were recorded. Empty: nothing to say.",
            width=85),
        "name": st.column_config.TextColumn("name", width=135),
        "status": st.column_config.TextColumn(
            "status", width=68, help="📉 a regression alert: the eval is worse than its run's previous checkpoint or "
                                     "than a reference, by the paired bootstrap (Run detail says by how much); ⚠️ the serving box it "
                                     "measured is in the known-bad table (Run detail says which row, and its source); ⁉️ an "
                                     "imported run whose own files disagree about its environment (a kernel package "
                                     "installed that its console says did not run, say: Environments cites both)"),
        "kind": st.column_config.TextColumn("kind", width=90, help="train / eval / reference; published = numbers from a "
                                                         "publication, for another target or environment"),
        "drafter": st.column_config.TextColumn("drafter", width=62, help="the drafter's family: DFlash, or DFlash2 "
                                               "(grouped dynamic convs and a candidate selector)"),
        "target": st.column_config.TextColumn("target", width=95, help="the target model (last path component)"),
        "steps": st.column_config.TextColumn("steps", width=45, help="training: the last logged step; eval: the "
                                                             "checkpoint's training step"),
        "tau": st.column_config.TextColumn("tau", width=130, help=tau_help),
        "environment": st.column_config.TextColumn(
            "environment", width=120, help="which implementation ran the Gated DeltaNet layers (🟢 fast: fla + "
                                           "causal-conv1d kernels, 🟠 fallback: torch, 🟡 partial, ⚪ unknown) · the "
                                           "device (GPU model) · the dtype of the target's forward pass"),
        "started": st.column_config.TextColumn("started (UTC)", width=80),
        "detail": st.column_config.LinkColumn("detail", display_text="open", width=40,
                                            help="the run's detail page"),
    },
)
selected = [shown.iloc[i]["run_id"] for i in event.selection.rows] if event and event.selection else []
with st.container(horizontal=True):
    if st.button("Open run detail", key="runs_open", disabled=len(selected) != 1,
                 help="select one row in the table"):
        st.switch_page(ui.RUN_DETAIL_PAGE, query_params={"run": selected[0]})
    if st.button("Compare selected", key="runs_compare", disabled=not selected,
                 help="select rows in the table"):
        st.switch_page(ui.COMPARE_PAGE, query_params={"runs": ",".join(selected)})
    # Written when clicked: the CSV of every matching run costs more than the page, on every visit.
    st.download_button("Download CSV", lambda: csv_bytes(table), "runs.csv", "text/csv",
                       key="runs_csv", on_click="ignore")
