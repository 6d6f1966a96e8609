"""Fails at its imports, before any strategy or step."""
import tensorflow as tf
import tensorflow_addons as tfa  # noqa: F401  (gone: TensorFlow Addons ended in 2024)

strategy = tf.distribute.MirroredStrategy()
