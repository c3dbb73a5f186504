"""Rendering of what gact did: a self-contained HTML viewer, DOT for papers, plain text.

All of it reads ``GraphRecord``s (their plain-data graph views and timelines); nothing
here touches a live graph or torch.
"""

from .render import render_dot, render_html, render_text

__all__ = ["render_dot", "render_html", "render_text"]
