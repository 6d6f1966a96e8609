"""The step: the model (the tutorial's or the user's, `user_code` imports the user's
builder), the compiled training and evaluation steps, and the trainer that holds them."""
