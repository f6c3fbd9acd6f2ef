"""Rendering DOT text to a picture with the `graphviz` Python package (the `viz` extra),
which runs Graphviz's `dot` program."""

from __future__ import annotations

from pathlib import Path

INSTALL_HINT = ("pip install 'semigrad[viz]' (the graphviz Python package) and Graphviz's dot program "
                "(e.g. apt-get install graphviz)")


def render_dot(dot: str, path: str | Path, format: str | None = None) -> Path:
    """Write ``dot`` rendered to ``path``; ``format`` (svg, png, pdf, ...) defaults to the suffix."""
    try:
        import graphviz
    except ImportError:
        raise ImportError(f"rendering needs the graphviz Python package: {INSTALL_HINT}") from None
    path = Path(path)
    format = format or path.suffix.lstrip(".").lower()
    if not format:
        raise ValueError(f"cannot tell the picture format of '{path}': give format= or a suffix (.svg, .png, ...)")
    try:
        picture = graphviz.pipe("dot", format, dot.encode())
    except graphviz.ExecutableNotFound:
        raise RuntimeError(f"rendering needs Graphviz's dot program on PATH: {INSTALL_HINT}") from None
    path.write_bytes(picture)
    return path
