"""How to add an optional extra to this installation, in the form that reaches where it came from.

The project is installed from a clone (or a wheel built from one), not from a package index, so
`pip install 'llamacpp-exporter[html]'` would ask an index for a name it may not hold. pip records
where a package came from in the distribution's `direct_url.json` (PEP 610): a folder (editable or
not), an archive or a version-control URL. No such file means an index.
"""

from __future__ import annotations

import json
import shlex
import sys
from importlib import metadata
from typing import Any
from urllib.parse import unquote, urlsplit

DISTRIBUTION = "llamacpp-exporter"


def _pip() -> str:
    """pip of the interpreter that runs the exporter (a bare `pip` may belong to another one)."""
    return f"{shlex.quote(sys.executable)} -m pip install"


def hint_for(extra: str, direct_url: dict[str, Any] | None, *, installed: bool = True) -> str:
    """The install command for `extra`, given the distribution's parsed direct_url.json.

    `installed` False: the modules run from a source tree that pip never installed.
    """
    if not installed:
        return f"pip install '.[{extra}]' in a clone of this repository"
    if direct_url is None:
        return f"{_pip()} {shlex.quote(f'{DISTRIBUTION}[{extra}]')}"
    url = str(direct_url.get("url", ""))
    if "dir_info" in direct_url and url.startswith("file:"):
        path = unquote(urlsplit(url).path)
        editable = "-e " if direct_url["dir_info"].get("editable") else ""
        return f"{_pip()} {editable}{shlex.quote(f'{path}[{extra}]')}"
    vcs = direct_url.get("vcs_info")
    if isinstance(vcs, dict) and vcs.get("vcs"):
        url = f"{vcs['vcs']}+{url}@{vcs.get('commit_id', '')}".rstrip("@")
    return f"{_pip()} {shlex.quote(f'{DISTRIBUTION}[{extra}] @ {url}')}"


def extra_install_hint(extra: str) -> str:
    """`pip install …` that adds `extra` to the running installation (or, from a source tree, to a clone)."""
    # A source tree's own llamacpp_exporter.egg-info (left by an editable build) comes first on sys.path
    # when Python runs from the clone (`python -m exporter`); the installed one is the one an installer
    # (pip) recorded.
    for dist in metadata.distributions(name=DISTRIBUTION):
        if dist.read_text("INSTALLER") is None:
            continue
        text = dist.read_text("direct_url.json")
        try:
            direct_url = json.loads(text) if text else None
        except ValueError:
            direct_url = None
        return hint_for(extra, direct_url if isinstance(direct_url, dict) else None)
    return hint_for(extra, None, installed=False)
