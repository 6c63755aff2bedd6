"""The `adaptguard` command line (`main.py` puts together one module per command)."""

from .main import build_parser, main

__all__ = ["build_parser", "main"]
