"""Run Streamlit's server for app.py, with pages/ served only through app.py's st.navigation.

Streamlit treats a `pages/` folder beside the entry script as a v1 multipage app until some
session has run `st.navigation`; until then a first request for a deep link (/launch, a
bookmarked /compare?runs=...) would run that page file alone, without app.py's layout and
navigation. Clearing the flag before the server starts makes every request go through app.py.
"""

import sys

from streamlit.runtime.pages_manager import PagesManager
from streamlit.web import cli


def main(argv: list[str]) -> None:
    PagesManager.uses_pages_directory = False
    cli.main(args=["run", *argv], prog_name="streamlit")


if __name__ == "__main__":
    main(sys.argv[1:])
