"""Sphinx configuration of torchmover's documentation site: user guide pages in Markdown (MyST), the
API reference from the docstrings (autodoc + napoleon). Built with warnings as errors:

    sphinx-build -W --keep-going -b html docs docs/_build/html
"""
import os
import sys

sys.path.insert(0, os.path.abspath(".."))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

project = "torchmover"
author = "torchmover developers"
copyright = "2026, torchmover developers"

extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon", "sphinx.ext.mathjax",
              "sphinx.ext.viewcode"]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build"]
myst_enable_extensions = ["colon_fence", "dollarmath"]
myst_heading_anchors = 3

autodoc_member_order = "bysource"
autodoc_typehints = "none"  # the docstrings state types and shapes
autodoc_default_options = {"members": True, "show-inheritance": False}
napoleon_google_docstring = True
napoleon_numpy_docstring = False

html_theme = "furo"
html_title = "torchmover"
