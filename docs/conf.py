"""Sphinx configuration for the fddps documentation.

Build (from the repository root, after ``python -m pip install -e ".[docs]"``)::

    sphinx-build -W --keep-going -b html docs docs/_build/html

The API reference is generated from the packages' ``__all__`` on every build
(``_ext/fddps_docs.py``), the notebooks of ``experiments/notebooks/`` are copied
into ``examples/`` and executed at their small sizes (myst-nb), and a results
page that names a generated page ``experiments/results/<name>.md`` includes it
when an experiment has written it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))  # document this checkout, not an installed copy
sys.path.insert(0, str(DOCS / "_ext"))

# The notebooks' kernels inherit this process's environment: small sizes, no saved results.
os.environ["FDDPS_NOTEBOOK_SMALL"] = "1"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("MPLBACKEND", "Agg")

project = "fddps"
author = "the fddps authors"
copyright = "the fddps authors, Apache-2.0"
release = version = "0.1.0"

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
    "numpydoc",
    "myst_nb",  # MyST Markdown pages and executed notebooks
    "fddps_docs",
]

source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store", "**.ipynb_checkpoints"]
templates_path = ["_templates"]

# API reference: one page per public name, from numpydoc docstrings.
autosummary_generate = True
autosummary_imported_members = True
autodoc_default_options = {"member-order": "bysource"}
autodoc_typehints = "none"  # numpydoc's Parameters sections say the types
numpydoc_show_class_members = False  # the class template lists members itself
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False
add_module_names = False

# Markdown.
myst_enable_extensions = ["colon_fence", "deflist", "dollarmath"]
myst_heading_anchors = 3

# Notebooks: executed on every build; any cell error fails it.
nb_execution_mode = "force"
nb_execution_timeout = 600
nb_execution_raise_on_error = True
nb_execution_show_tb = True
nb_merge_streams = True

html_theme = "furo"
html_title = "fddps"
html_static_path: list[str] = []
html_show_sourcelink = False

# Warnings that are not about our sources.
suppress_warnings = ["myst.header"]
