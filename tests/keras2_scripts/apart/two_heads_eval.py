# A two-head model whose evaluation is printed by position.
import numpy as np
import tensorflow as tf

inputs = tf.keras.Input((4,))
score = tf.keras.layers.Dense(1, name="score")(inputs)
label = tf.keras.layers.Dense(1, activation="sigmoid", name="label")(inputs)
model = tf.keras.Model(inputs, [score, label])
model.compile("adam", loss={"score": "mse", "label": "binary_crossentropy"},
              metrics={"score": ["mse"], "label": ["accuracy"]})
x = np.random.rand(16, 4).astype("float32")
y = {"score": np.random.rand(16, 1), "label": (np.random.rand(16, 1) > 0.5).astype("float32")}
model.fit(x, y, epochs=1, verbose=0)
results = model.evaluate(x, y, verbose=0)
print("label accuracy:", results[4])
