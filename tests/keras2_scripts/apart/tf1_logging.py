# absl-era flags and logging through tf (a 2018 research script's main).
import tensorflow as tf

tf.logging.set_verbosity(tf.logging.INFO)


def main(_):
    tf.logging.info("starting")


if __name__ == "__main__":
    tf.app.run()
