# A manual epoch loop over train_on_batch, one output.
import numpy as np
import tensorflow as tf

model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1, activation="sigmoid")])
model.compile("sgd", "binary_crossentropy", metrics=["accuracy"])
for _ in range(2):
    loss, acc = model.train_on_batch(np.random.rand(8, 4), np.ones((8, 1)))
print(f"loss={loss:.3f} accuracy={acc:.3f}")
