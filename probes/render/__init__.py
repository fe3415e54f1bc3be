"""Rendering: HTML reports, attention views and cross-run comparisons."""
