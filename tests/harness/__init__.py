"""Test harness: real ``redis-server`` processes and a fault-injecting TCP proxy."""
