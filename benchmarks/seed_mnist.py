"""The seed's script, as printed in the tutorial, with the one fix it needs to run.

As printed, `x_train` is 28x28 images fed to a 784-input Dense layer; here the images are
flattened (`reshape(-1, 784)`). Everything else is the tutorial's code. `benchmarks/
seed_vs_mgpu.py` calls `train` with MNIST-shaped synthetic data, timing `model.fit`.
"""

from __future__ import annotations

import tensorflow as tf
from tensorflow.keras.layers import Dense
from tensorflow.keras.models import Sequential
from tensorflow.keras.optimizers import Adam


def train(x_train, y_train, epochs=5, batch_size=64, callbacks=None):
    strategy = tf.distribute.MirroredStrategy()
    print('Number of devices: {}'.format(strategy.num_replicas_in_sync))  # noqa: UP032
    with strategy.scope():
        model = Sequential([Dense(64, activation='relu', input_shape=(784,)),
                            Dense(64, activation='relu'),
                            Dense(10, activation='softmax')])
        model.compile(loss='sparse_categorical_crossentropy', optimizer=Adam(),
                      metrics=['accuracy'])
    model.fit(x_train, y_train, epochs=epochs, batch_size=batch_size, callbacks=callbacks)
    return model


if __name__ == "__main__":
    (x_train, y_train), (x_test, y_test) = tf.keras.datasets.mnist.load_data()
    x_train, x_test = x_train / 255.0, x_test / 255.0
    x_train, x_test = x_train.reshape(-1, 784), x_test.reshape(-1, 784)  # the fix
    train(x_train, y_train)
