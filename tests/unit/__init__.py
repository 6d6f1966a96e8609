"""Quick tests with no TensorFlow in the test process: settings, parsers, the doctor on canned
probes, manifests, docs, the rules of the code and of the tests."""
