"""Tests with a `docker` test: they need a Docker engine, and build and run the image."""
