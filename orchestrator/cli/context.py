"""The click context settings every command shares: -h as well as --help, and help text up to
100 columns wide."""

from __future__ import annotations

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}
