"""Tests with a `slow` test: they train real models or start processes (seconds to minutes)."""
