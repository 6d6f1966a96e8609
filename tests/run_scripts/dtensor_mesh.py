"""As TensorFlow's DTensor tutorial: 8 logical CPUs of its own, a batch-sharded mesh, a
model of tf.Variables (no Keras layer) and a custom loop."""
import numpy as np
import tensorflow as tf
from tensorflow.experimental import dtensor

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 8)
DEVICES = [f"CPU:{i}" for i in range(8)]
mesh = dtensor.create_mesh([("batch", 8)], devices=DEVICES)
replicated = dtensor.Layout.replicated(mesh, rank=2)
weights = dtensor.DVariable(dtensor.call_with_layout(tf.zeros, replicated, shape=(4, 1)))
bias = dtensor.DVariable(dtensor.call_with_layout(tf.zeros, dtensor.Layout.replicated(mesh, 1),
                                                  shape=(1,)))
sharded = dtensor.Layout.batch_sharded(mesh, "batch", rank=2)


@tf.function
def train_step(x, y):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((tf.matmul(x, weights) + bias - y) ** 2)
    grads = tape.gradient(loss, [weights, bias])
    for variable, grad in zip([weights, bias], grads, strict=True):
        variable.assign_sub(0.1 * grad)
    return loss


rng = np.random.default_rng(0)
for step in range(3):
    x = rng.random((16, 4), dtype=np.float32)
    loss = train_step(dtensor.pack(np.split(x, 8), sharded),
                      dtensor.pack(np.split(x[:, :1], 8), sharded))
    print("step", step, "loss", float(dtensor.unpack(loss)[0]), flush=True)
