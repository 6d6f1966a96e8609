"""What the training folders share, below all of them.

Message pieces, atomic writes, the tutorial data's shape. Imports nothing of input/, step/,
run/ or multiworker/."""
