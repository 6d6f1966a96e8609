# Unpacking evaluate's dict values, trusting their order.
import numpy as np
import tensorflow as tf

model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1, activation="sigmoid")])
model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])
x, y = np.random.rand(16, 4), (np.random.rand(16, 1) > 0.5).astype("float32")
model.fit(x, y, epochs=1, verbose=0)
loss, acc = model.evaluate(x, y, verbose=0, return_dict=True).values()
print(f"loss={loss:.3f} accuracy={acc:.3f}")
