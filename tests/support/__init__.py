"""Helpers the tests share: fakes of the probes, runtimes, run folders, processes.

Test modules import from here and never from each other, so each test module can be read,
moved or run alone.
"""
