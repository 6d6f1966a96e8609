"""The tutorial data's shape (MNIST's).

What the built-in sets hold and the tutorial's MLP takes by default. Below the folders: input/
reads data of this shape, step/ builds for it."""

IMAGE_SIDE = 28
FEATURES = IMAGE_SIDE * IMAGE_SIDE
CLASSES = 10
