# The accuracy curve taken as the history's second key.
import numpy as np
import tensorflow as tf

model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1, activation="sigmoid")])
model.compile(optimizer="adam", loss="binary_crossentropy",
              metrics=[tf.keras.metrics.BinaryAccuracy()])
history = model.fit(np.random.rand(16, 4), np.random.rand(16, 1) > 0.5, epochs=2, verbose=0)
curve = history.history[list(history.history.keys())[1]]
print("accuracy per epoch:", curve)
