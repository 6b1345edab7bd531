"""Process trees of runs: launch, timeout, group kill, reaping, and the warm fork server."""
