"""The step: the model (the tutorial's or the user's, `hooks` holds the user's code),
the compiled training and evaluation steps, and the trainer that holds them."""
