"""A GradientTape loop with no strategy at all (as TensorFlow's quickstart for experts)."""
import numpy as np
import tensorflow as tf

model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(1)])
optimizer = tf.keras.optimizers.Adam()
x = np.random.default_rng(0).random((64, 8), dtype=np.float32)
for batch in tf.data.Dataset.from_tensor_slices((x, x[:, :1])).batch(16):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((model(batch[0]) - batch[1]) ** 2)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
print("loss", float(loss), flush=True)
