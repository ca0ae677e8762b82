"""Launch eval: queue `draftboard eval` for a checkpoint, and follow the job queue live."""

import streamlit as st

from tracker.dashboard import ui
from tracker.dashboard.tables import team_training_runs
from tracker.dashboard.escape import md, md_code
from tracker.dashboard.launch_form import (
    CUSTOM_SAMPLING,
    DEFAULT_REPEATS,
    DEVICES,
    DRAFTER_PRECISIONS,
    DTYPES,
    LINEAR_ATTN_CHOICES,
    MAX_DRAWS,
    MAX_REPEATS,
    PROMPT_PATH,
    SAMPLING_PRESETS,
    LaunchForm,
    describe_job,
    edit_state,
    error_line,
    eval_params,
    form_defaults,
    measure_choices,
    measure_label,
    no_engine_note,
    prompt_choices,
    registered_step,
    result_line,
    shown_log,
    submit_eval,
    training_linear_attn,
    unused_settings,
    workers_caption,
)

OTHER = "__path__"

# The Samples field's starting value, for the sampled presets: at T = 0 left as it was, it is nobody's choice to note.
SAMPLES_SHOWN = 8
# The count fields are number inputs of floats shown as typed: Streamlit's integer inputs cut a fraction off in the
# browser (parseInt) before the server sees it, so "8.5" became 8 in silence; as floats it arrives, and
# `eval_params` refuses it by name.
COUNT = {"step": 1.0, "format": "%.15g"}
cfg, index = ui.shared(needs_runs=False)
PROMPT_CHOICES = {c.value: c.label for c in prompt_choices(index)}


def _set_prompts(spec: str) -> None:
    """The picker on a known set or file; any other path goes to the path field below it."""
    known = spec in PROMPT_CHOICES and spec != PROMPT_PATH
    st.session_state["launch_prompt_set"] = spec if known else PROMPT_PATH
    if not known:
        st.session_state["launch_prompts"] = spec

st.title("Launch eval")
queue = ui.open_queue_or_stop(cfg)


def _on_sampling_preset() -> None:
    """A preset fills in its temperature, top_p and top_k; `custom` leaves the numbers to the user."""
    chosen = SAMPLING_PRESETS.get(st.session_state.get("launch_sampling"))
    if chosen is not None:
        for key, value in zip(("launch_temperature", "launch_top_p", "launch_top_k"), chosen):
            st.session_state[key] = value


def _on_train_change() -> None:
    """Pre-fill the form from the chosen training run and the project defaults (launch_form.form_defaults)."""
    defaults = form_defaults(index, index.get(st.session_state.get("launch_train_run")))
    for key, field in (("launch_target", "target"), ("launch_device", "device"), ("launch_dtype", "dtype"),
                       ("launch_precision", "drafter_precision"), ("launch_max_new", "max_new_tokens"),
                       ("launch_budgets", "budgets")):
        if defaults[field] is not None:
            st.session_state[key] = defaults[field]
    if defaults["prompts"] is not None:
        _set_prompts(defaults["prompts"])
    run = index.get(st.session_state.get("launch_train_run"))
    st.session_state["launch_linear"] = ("match training run" if run and training_linear_attn(run.fingerprint)[0]
                                         else "auto")


if cfg.readonly:
    st.info("Read-only dashboard (DRAFTBOARD_READONLY=1): launching evals is disabled.", icon="🔒")
else:
    st.caption(ui.allowed_roots_caption(cfg))
    st.caption(workers_caption(queue.workers()))
    trains = [r.run_id for r in index.of_kind("train")]
    if "launch_train_run" not in st.session_state:
        # the team's newest drafter, as Compare starts with: not a reference's own training run
        team = team_training_runs(index)
        st.session_state["launch_train_run"] = team[0].run_id if team else trains[0] if trains else None
        _on_train_change()
    for key, field in (("launch_budgets", "budgets"), ("launch_max_new", "max_new_tokens")):
        st.session_state.setdefault(key, form_defaults(index, None)[field])
    for key, value in zip(("launch_temperature", "launch_top_p", "launch_top_k"), SAMPLING_PRESETS[next(iter(
            SAMPLING_PRESETS))]):
        st.session_state.setdefault(key, value)

    if st.session_state.get("launch_edited") is not None:
        st.info(f"The form holds job #{st.session_state['launch_edited']}'s settings: change what you need and "
                "queue it.", icon="✏️")
        ui.bullet_list(st.session_state.get("launch_edit_notes") or [], "Not carried into the form",
                       alert=st.warning)
    # What shapes the form (and pre-fills it) sits above it; the form holds the values, so a submit
    # queues exactly what is shown, and every number is checked then, not clamped by the field.
    c1, c2 = st.columns(2)
    train_id = c1.selectbox("Training run", [None, *trains], key="launch_train_run", on_change=_on_train_change,
                            format_func=lambda r: "none (a checkpoint path)" if r is None
                            else ui.run_option_label(index, r),
                            help="the run the checkpoint belongs to: the eval is linked to it")
    train = index.get(train_id)
    by_step = {c.step: c for c in (ui.checkpoints(cfg, train.run_id) if train is not None else [])}
    ck_options = [*sorted(by_step, reverse=True), OTHER]
    pick = c2.selectbox("Checkpoint", ck_options, key="launch_checkpoint",
                        format_func=lambda s: "a path under the allowed roots…" if s == OTHER
                        else f"step {s} · {by_step[s].size_bytes / 1e6:.1f} MB · {by_step[s].sha256[:12]}",
                        help="checkpoints registered on the training run (run.log_checkpoint), newest first")
    c1, c2, c3 = st.columns([2, 2, 3])
    prompt_set = c1.selectbox(
        "Prompts", list(PROMPT_CHOICES), key="launch_prompt_set", format_func=PROMPT_CHOICES.get,
        help="the prompt files this project's evals used (an eval on them compares with theirs), z-lab's benchmark "
             "sets by name (gsm8k, math500, humaneval, mbpp, mt-bench: read by the worker's `datasets` library with "
             "z-lab's column mapping, each prompt labelled with its set so Compare meets the reference's number "
             "for it), or a path under the allowed roots")
    preset = c2.selectbox(
        "Sampling", [*SAMPLING_PRESETS, CUSTOM_SAMPLING], key="launch_sampling", on_change=_on_sampling_preset,
        help="how the target's tokens are drawn. T = 0: greedy (z-lab's benchmark default). T > 0: the acceptance "
             "length z-lab's sampled loop has in expectation, over `samples` continuations per prompt drawn from the "
             "target and shared by every checkpoint of this target and protocol; top_p and top_k cut the target's "
             "and a DFlash drafter's distributions as z-lab's _sampling_probs does (a DFlash2 selector uses the "
             "temperature alone). Greedy and sampled numbers are never compared as one")
    measured_by = c3.selectbox(
        "Measured by", measure_choices(), key="launch_measured_by", format_func=measure_label,
        help="offline: teacher-forced, exact, with DDTree; an engine: the same prompts and protocol served by vLLM, "
             "SGLang or llama.cpp, read from the engine's own per-request acceptance (the worker starts it from "
             "DRAFTBOARD_<ENGINE>_PYTHON, or attaches to a server of DRAFTBOARD_ENGINE_URLS). "
             "`draftboard reconcile` and Run detail explain the gap between the two")
    if (note := no_engine_note()) is not None:
        c3.caption(note)
    c1, c2 = st.columns(2)
    linear = c1.selectbox("Linear attention", LINEAR_ATTN_CHOICES, key="launch_linear",
                          help="auto: what transformers picks here; fast: fla + causal-conv1d kernels; fallback: "
                               "torch; match training run: the path in the training run's fingerprint")
    as_reference = c2.checkbox("Log as a reference", key="launch_reference",
                               help="log the eval as a reference run (`--reference NAME`), a baseline for Compare")
    if linear == "match training run":
        resolved, why = training_linear_attn(train.fingerprint if train else None)
        if resolved:
            st.caption(f"Linear attention: {md(why)} → {md_code('--linear-attn ' + resolved)}")
        else:
            st.warning(f"Linear attention: {md(why)}")

    with st.form("launch_form", border=True, enter_to_submit=False):  # Enter commits a field; only the button queues
        drafter_path, step = None, None
        if pick == OTHER:
            c1, c2 = st.columns([3, 1])
            drafter_path = c1.text_input("Checkpoint path", key="launch_drafter_path",
                                         placeholder="/path/to/drafter (z-lab directory, .safetensors or .pt)")
            if train is not None:
                step = c2.number_input("Checkpoint step", value=None, **COUNT, key="launch_step",
                                       help="the training step of this checkpoint (links the eval to the curve)")
        else:
            step = pick
            st.caption(md_code(by_step[pick].path))
        c1, c2 = st.columns(2)
        target = c1.text_input("Target", key="launch_target", placeholder="/path/to/target model directory",
                               help="the target model directory (transformers format)")
        prompts = prompt_set
        if prompt_set == PROMPT_PATH:
            prompts = c2.text_input("Prompts path", key="launch_prompts",
                                    placeholder="/path/to/prompts.jsonl or folder",
                                    help='JSON lines ({"id", "input_ids" | "prompt" | "messages"}, optional "dataset"), '
                                         "z-lab or Spec-Bench `turns` files, or a folder of them (one file per dataset)")
        c1, c2, c3, c4, c5, c7, c6 = st.columns([1, 1, 1, 1, 1.2, 0.8, 1])
        budgets = c1.text_input("DDTree budgets", key="launch_budgets",
                                help="node budgets B for ddtree_tau_b{B}, comma-separated")
        max_new = c2.number_input("Max new tokens", **COUNT, key="launch_max_new",
                                  help="tokens generated per prompt by the target; checked against its context")
        limit = c3.number_input("Prompts per dataset", value=None, **COUNT, key="launch_limit",
                                help="at most N prompts of each dataset, a fixed-seed sample as z-lab's --max-samples "
                                     "draws it (gsm8k has 1,319); empty: every prompt")
        device = c4.selectbox("Device", DEVICES, key="launch_device")
        gpus = c4.number_input("GPUs", value=None, **COUNT, key="launch_gpus", placeholder="1 on cuda",
                               help="GPUs the job holds, its own, on a worker that hands them out (`draftboard worker "
                                    "--gpus 0,1,2,3`); it waits until they are free; empty: 1 on cuda, none on cpu")
        dtype = c5.selectbox("Dtype", DTYPES, key="launch_dtype")
        shards = c5.number_input("Shards", value=None, **COUNT, key="launch_shards", placeholder="1",
                                 help="split the prompts across N processes, each on its own GPU (the job holds N) or "
                                      "its share of the CPU cores; merged into one eval, every number exactly as one "
                                      "process gives it; empty: one process")
        precision = c6.selectbox("Drafter precision", [None, *DRAFTER_PRECISIONS], key="launch_precision",
                                 format_func=lambda p: "as dtype" if p is None else p,
                                 help="as dtype: the drafter's weights cast to the dtype; bf16-autocast: fp32 "
                                      "weights under bf16 autocast, as mixed-precision training computes")
        fixed = preset != CUSTOM_SAMPLING
        c1, c2, c3, c4, c5, c7, c6 = st.columns([1, 1, 1, 1, 1.2, 0.8, 1])
        temperature = c1.number_input("Temperature", step=0.1, key="launch_temperature", disabled=fixed)
        top_p = c2.number_input("top_p", step=0.05, key="launch_top_p", disabled=fixed, help="in (0, 1]")
        top_k = c3.number_input("top_k", **COUNT, key="launch_top_k", disabled=fixed, help="0: no top-k")
        samples_off = fixed and SAMPLING_PRESETS[preset][0] == 0  # a greedy preset: one continuation
        # Its default in the session, not as `value`: Edit sets the key, and a widget given both warns in the terminal
        st.session_state.setdefault("launch_samples", float(SAMPLES_SHOWN))
        samples = c4.number_input("Samples", **COUNT, key="launch_samples", disabled=samples_off,
                                  help=f"continuations drawn per prompt at T > 0 (1–{MAX_DRAWS}): more narrow the "
                                       "interval over draws; an engine eval sends each prompt once")
        concurrency = c5.text_input("Concurrency levels", key="launch_concurrency", placeholder="e.g. 1,4,8",
                                    help="with an engine: the same prompts again with this many requests in flight "
                                         "at each level, with the drafter and with the target alone: tokens/s, "
                                         "speedup and each request's own counts per level (docs/DESIGN.md, Load "
                                         "sweeps); empty: one request at a time only")
        repeats = c7.number_input("Rounds", value=None, **COUNT, key="launch_repeats",
                                  placeholder=str(DEFAULT_REPEATS),
                                  help=f"with concurrency levels: timed rounds per level, the drafter's and the "
                                       f"target alone's interleaved; the speedup is the ratio of their medians with "
                                       f"its interval over rounds (1–{MAX_REPEATS}; empty: {DEFAULT_REPEATS})")
        prompt_tokens = c6.number_input("Prompt tokens", value=None, **COUNT, key="launch_prompt_tokens",
                                        help="long-context sets (LongBench, LongBench v2, ShareGPT rows): each prompt "
                                             "made N tokens long, its middle cut as LongBench cuts it or filled with "
                                             "the set's own documents, never padding; empty: each at its own length")
        ref_name = (st.text_input("Reference name", key="launch_reference_name", placeholder="e.g. z-lab v1")
                    if as_reference else "")
        submitted = st.form_submit_button("Queue eval", key="launch_submit", type="primary",
                                          icon=":material/rocket_launch:")

    if submitted:
        form = LaunchForm(
            target=target, prompts=prompts, drafter=drafter_path,
            checkpoint_path=by_step[pick].path if pick != OTHER else None,
            train_run_id=train.run_id if train else None, train_name=index.label(train.run_id) if train else None,
            drafter_family=train.drafter_family if train else None,
            checkpoint_step=step,
            budgets=budgets, max_new_tokens=max_new, device=device, dtype=dtype,
            drafter_precision=precision, linear_attn=linear,
            training_fingerprint=train.fingerprint if train else None,
            reference=as_reference, reference_name=ref_name or "",
            limit_per_dataset=limit, measured_by=measured_by,
            prompt_tokens=prompt_tokens,
            temperature=float(temperature), top_p=float(top_p), top_k=top_k,
            samples=1 if samples_off or (temperature == 0 and samples == SAMPLES_SHOWN) else samples,
            concurrency=concurrency or "", repeats=repeats, gpus=gpus, shards=shards,
        )
        with ui.reported(lambda text: st.error(text, icon="🚫")):
            params = eval_params(form, cfg.allowed_roots)
            job = submit_eval(queue, params, ui.tracker_for(cfg.store_uri))
            if job.existing:
                st.info(f"This checkpoint was already submitted with these settings: job #{job.id} ({job.state}). "
                        "No duplicate was queued.", icon="📋")
                if job.mlflow_run_id:
                    st.page_link(ui.RUN_DETAIL_PAGE, label="Open the existing result",
                                 query_params={"run": job.mlflow_run_id}, icon=":material/science:")
            else:
                st.session_state.pop("launch_edited", None)
                st.session_state.pop("launch_edit_notes", None)
                st.success(f"Queued job #{job.id}.", icon="✅")
            unused = unused_settings(form)
            if unused:
                st.info("Not part of this eval: " + md("; ".join(unused)) + ".", icon="ℹ️")

# ------------------------------------------------------------------ queue
st.subheader("Queue", help="evals run by `draftboard worker` (started by `draftboard ui`)")
active = ui.queue_busy(queue)


def _cancel(job_id: int) -> None:
    """Runs before the rerun, so the list drawn next already shows the cancellation."""
    st.session_state.pop(f"confirm_cancel_{job_id}", None)
    with ui.reported(st.toast):
        queue.request_cancel(job_id)


def _retry(params: dict) -> None:
    """The same eval again (a failed or cancelled job's params, checked as a new submission is)."""
    with ui.reported(st.toast):
        job = submit_eval(queue, params, ui.tracker_for(cfg.store_uri))
        st.toast(f"Already {job.state}: job #{job.id}." if job.existing else f"Queued job #{job.id}.")


def _edit(job_id: int, params: dict) -> None:
    """The form above, filled in with a job's settings, to change and queue again. The button sits in
    the queue's fragment, whose click reruns only the fragment: the whole page reruns next
    (`job_list`), so the form shows what was filled in, with a line saying whose settings they are."""
    state = st.session_state
    state["launch_edit_pending"] = True
    state["launch_edited"] = job_id
    filled, state["launch_edit_notes"] = edit_state(params, measure_choices())
    state.update(filled)
    if params.get("prompts"):
        _set_prompts(params["prompts"])
    train = params.get("train_run_id") if params.get("train_run_id") in index.runs else None
    state["launch_train_run"] = train
    step = registered_step(params, {c.step: c.path for c in ui.checkpoints(cfg, train)} if train else {})
    state["launch_checkpoint"] = OTHER if step is None else step
    state["launch_drafter_path"] = params.get("drafter", "")


@st.fragment(run_every=2 if active else 10)
def job_list() -> None:
    if st.session_state.pop("launch_edit_pending", False):
        st.rerun(scope="app")  # the form above is outside this fragment
    jobs = queue.list(limit=25)
    if not jobs:
        st.info("No jobs yet. Queued evals appear here with their progress.")
        return
    runs = index
    seen = st.session_state.setdefault("launch_results_read", set())
    new = {j.mlflow_run_id for j in jobs if j.state == "succeeded" and j.mlflow_run_id} - set(index.runs) - seen
    if new:  # an eval just landed: read the store again now, so its card shows its τ without a reload
        seen.update(new)
        ui.refresh()
        runs = ui.run_index(cfg.store_uri)
    labels = {r: runs.label(r) for r in runs.runs}
    for job in jobs:
        view = describe_job(job, labels)
        with st.container(border=True, key=f"job_{job.id}"):
            head, side = st.columns([5, 1])
            head.markdown(f"**{md(view.title)}**")
            head.progress(view.progress, text=md(view.progress_text))
            head.caption(md(view.when))
            result = result_line(runs.get(view.run_id))
            if result:
                head.markdown(md(result), help="τ: mean acceptance length along the walk (tokens per block, "
                                              "bonus included); ddtree_tau_b8: the same with a DDTree of 8 nodes")
            cause = error_line(view.error) if view.state != "succeeded" else None
            if cause:
                head.caption(md(cause[:300]))
            if view.run_id:
                side.page_link(ui.RUN_DETAIL_PAGE, label="Open eval run", query_params={"run": view.run_id},
                               icon=":material/science:")
            if view.can_cancel and not cfg.readonly:  # asks once: a stray click costs nobody an eval
                if st.session_state.get(f"confirm_cancel_{job.id}"):
                    side.button("Yes, cancel", key=f"cancel_{job.id}", icon=":material/cancel:", type="primary",
                                on_click=_cancel, args=(job.id,),
                                help="a queued job is dropped; a running one is stopped by its worker")
                    side.button("Keep it", key=f"keep_{job.id}",
                                on_click=lambda k=f"confirm_cancel_{job.id}": st.session_state.pop(k, None))
                else:
                    side.button("Cancel", key=f"ask_cancel_{job.id}", icon=":material/cancel:",
                                on_click=lambda k=f"confirm_cancel_{job.id}": st.session_state.update({k: True}))
            if view.state in ("failed", "cancelled") and not cfg.readonly and isinstance(job.params, dict):
                side.button("Retry", key=f"retry_{job.id}", icon=":material/replay:", on_click=_retry,
                            args=(job.params,), help="queue the same eval again")
                side.button("Edit", key=f"edit_{job.id}", icon=":material/edit:", on_click=_edit,
                            args=(job.id, job.params), help="fill the form above with this job's settings")
            tail = queue.log_tail(job, 200) if job.log_path else ""
            if tail:
                with st.expander("Log tail"):
                    everything = st.toggle("Show progress and protocol lines", key=f"log_all_{job.id}")
                    st.code("\n".join(shown_log(tail, everything).splitlines()[-30:]), language=None,
                            wrap_lines=True)


job_list()
