# TensorFlow's tutorial, unmodified: the `%%writefile main.py` cell of
# site/en/tutorials/distribute/multi_worker_with_keras.ipynb in github.com/tensorflow/docs at commit
# 7c3650212740204359d4ceae481abc79345541be (Apache License 2.0, as the notebook says).
# The notebook runs it as `python main.py` on each worker, with TF_CONFIG set; here
# `mgpu run` sets TF_CONFIG from WORKER_HOSTS and WORKER_INDEX (tests/processes/test_tutorials.py).
# Only this header is added; the code below the marker is the cell's, byte for byte.
# --- the tutorial's code ---

import os
import json

import tensorflow as tf
import mnist_setup

per_worker_batch_size = 64
tf_config = json.loads(os.environ['TF_CONFIG'])
num_workers = len(tf_config['cluster']['worker'])

strategy = tf.distribute.MultiWorkerMirroredStrategy()

global_batch_size = per_worker_batch_size * num_workers
multi_worker_dataset = mnist_setup.mnist_dataset(global_batch_size)

with strategy.scope():
  # Model building/compiling need to be within `strategy.scope()`.
  multi_worker_model = mnist_setup.build_and_compile_cnn_model()


multi_worker_model.fit(multi_worker_dataset, epochs=3, steps_per_epoch=70)
