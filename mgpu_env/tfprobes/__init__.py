"""TensorFlow as the machine's last probe.

What it was built with and which GPUs it lists, asked in a child (`tfprobe`); its first import
in this process, with its start-up log held back (`tfimport`); the lines of its log that say
why a GPU is missing (`tflog`).

Beside `hardware` (which never imports TensorFlow) and at its level: nothing here imports
the runtime, training or the doctor.
"""
