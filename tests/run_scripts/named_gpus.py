"""Names two GPUs that a CPU machine does not have, then runs a step on each replica.

(`model.fit` under it hangs on a CPU machine, with plain `python` too: its all-reduce waits
between two replicas that soft placement put on one CPU.)"""
import tensorflow as tf

strategy = tf.distribute.MirroredStrategy(devices=["/gpu:0", "/gpu:1"])
print("Number of devices:", strategy.num_replicas_in_sync, flush=True)
print(strategy.run(lambda: tf.random.uniform((2,))), flush=True)
