# A data check that tests the exact tensor type.
import tensorflow as tf

x = tf.constant([1.0, 2.0])
if type(x) is tf.Tensor:
    print("a tensor")
else:
    raise SystemExit("not a tensor: " + type(x).__name__)
