# Keras 3 native code: nothing to tell.
import keras
import numpy as np

model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
model.compile(optimizer=keras.optimizers.Adam(learning_rate=1e-3), loss="mse", metrics=["mae"])
history = model.fit(np.zeros((8, 4)), np.zeros((8, 1)), epochs=1, verbose=0)
loss, mae = model.evaluate(np.zeros((8, 4)), np.zeros((8, 1)), verbose=0)
print(list(history.history.values())[0], loss, mae)  # noqa: RUF015
