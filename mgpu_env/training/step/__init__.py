"""The step: the model and what runs it on each replica.

It holds the model (`model`: the tutorial's, or the user's that `user_code` imports), one
replica's training and evaluation steps (`steps`), the compiled loops a feed wraps the step
in (`loops`), and the `Trainer` that holds model, optimizer and steps (`build`)."""
