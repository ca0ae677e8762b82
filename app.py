"""draftboard dashboard: `streamlit run app.py` (or `draftboard ui`).

The pages in pages/ only render; the data comes from tracker/ (views, compare, envmatrix,
launch, metrics_sql) through the cached loaders of tracker.dashboard.ui. Configuration is read
from the environment (see tracker/dashboard/ui.py).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # `streamlit run app.py` from anywhere

import streamlit as st

st.set_page_config(page_title="draftboard", page_icon=":material/stacked_line_chart:", layout="wide")

pages = [
    st.Page("pages/runs.py", title="Runs", icon=":material/table_rows:", url_path="runs", default=True),
    st.Page("pages/compare.py", title="Compare", icon=":material/compare_arrows:", url_path="compare"),
    st.Page("pages/environments.py", title="Environments", icon=":material/memory:", url_path="environments"),
    st.Page("pages/launch.py", title="Launch eval", icon=":material/rocket_launch:", url_path="launch"),
    st.Page("pages/run_detail.py", title="Run detail", icon=":material/article:", url_path="run"),
]
st.navigation(pages).run()
