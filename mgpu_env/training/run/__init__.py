"""The run: its plan, its folder, its loop and epochs, resuming, signals and progress."""
