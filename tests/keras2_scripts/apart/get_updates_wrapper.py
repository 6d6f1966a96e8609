# A Keras 2 era gradient-accumulation optimizer wrapper built on get_updates.
import tensorflow as tf

model = tf.keras.Sequential([tf.keras.Input((2,)), tf.keras.layers.Dense(1)])
optimizer = tf.keras.optimizers.SGD(0.1)
loss = tf.reduce_mean(model(tf.ones((4, 2))))
updates = optimizer.get_updates(loss, model.trainable_weights)
print(len(updates))
