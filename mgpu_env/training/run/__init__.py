"""A training run: `mgpu train`'s, in its folder runs/<name>/.

The package holds the sequence, its identity, its plan, what prepares it, its loop and
epochs, checkpoints, its folder, resuming, "already finished", signals and the progress shown
while it trains. In mgpu's code "run" means this only; `mgpu run` (your own script) is
`entrypoint/launch.py` and `mgpu_env/launcher/`."""
