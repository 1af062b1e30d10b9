"""Real servers on 127.0.0.1 that the test suite, the demo and the benchmarks talk to."""
