"""Tests under the one-node Slurm that `start-slurm.sh` starts (tests/support/slurm_cluster.py)."""
