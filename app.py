"""draftboard dashboard: `streamlit run app.py` (or `draftboard ui`).

The router, and the setup every page shares (Streamlit's convention: shared setup lives in the
entrypoint): settings, the run index and the store sidebar, from `tracker.dashboard.ui.setup`.
The pages in pages/ only render; they read what was set up here with `ui.shared()`.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # `streamlit run app.py` from anywhere

import streamlit as st

from tracker.dashboard import ui

# The favicon is an emoji, drawn in the browser: a `:material/...:` favicon is fetched from Google's
# font host, which fails offline and leaks every visit.
st.set_page_config(page_title="draftboard", page_icon="📈", layout="wide")

LAUNCH = st.Page("pages/launch.py", title="Launch eval", icon=":material/rocket_launch:", url_path="launch")
page = st.navigation([
    # The default page is served at `/` only (`/home` is the name it must reserve); the same page,
    # hidden from the menu, answers `/runs`, so that a link to it by name works too.
    st.Page("pages/runs.py", title="Runs", icon=":material/table_rows:", url_path="home", default=True),
    st.Page("pages/runs.py", title="Runs", icon=":material/table_rows:", url_path="runs", visibility="hidden"),
    st.Page("pages/compare.py", title="Compare", icon=":material/compare_arrows:", url_path="compare"),
    st.Page("pages/environments.py", title="Environments", icon=":material/memory:", url_path="environments"),
    LAUNCH,  # the only page with something to do on an empty store: evaluate a checkpoint by its path
    st.Page("pages/run_detail.py", title="Run detail", icon=":material/article:", url_path="run"),
])
ui.setup(page.title, needs_runs=page.url_path != LAUNCH.url_path)
page.run()
