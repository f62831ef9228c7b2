"""The instrumentation venv (tests' name for :mod:`streams.otel.instrumentations`, which the demo uses too)."""

from streams.otel.instrumentations import REQUIREMENTS, VENVS, instrumentation_python, venv_dir

__all__ = ["REQUIREMENTS", "VENVS", "instrumentation_python", "venv_dir"]
