"""Where panels go: left to right in 24-column rows, numbered in order."""

from __future__ import annotations

from typing import Any


class Layout:
    """Places panels left to right in 24-column rows and numbers them."""

    def __init__(self) -> None:
        self.panels: list[dict[str, Any]] = []
        self.x = 0
        self.y = 0
        self.row_h = 0
        self.next_id = 1

    def _pos(self, w: int, h: int) -> dict[str, int]:
        if self.x + w > 24:
            self.x, self.y, self.row_h = 0, self.y + self.row_h, 0
        pos = {"h": h, "w": w, "x": self.x, "y": self.y}
        self.x += w
        self.row_h = max(self.row_h, h)
        return pos

    def row(self, title: str) -> None:
        if self.x:
            self.x, self.y, self.row_h = 0, self.y + self.row_h, 0
        self.panels.append(
            {
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": self.y},
                "id": self.next_id,
                "panels": [],
                "title": title,
                "type": "row",
            }
        )
        self.next_id += 1
        self.y += 1

    def add(self, panel: dict[str, Any], w: int, h: int) -> None:
        panel = {"id": self.next_id, "gridPos": self._pos(w, h), **panel}
        self.next_id += 1
        self.panels.append(panel)
