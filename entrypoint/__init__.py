"""The `mgpu` command line: thin typer commands over the `mgpu_env` library."""
