"""The web dashboard served at /ui by ``gpuplan server`` (see scheduler.ui.app)."""

from scheduler.ui.app import create_ui

__all__ = ["create_ui"]
