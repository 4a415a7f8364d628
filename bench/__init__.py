"""Benchmarks that print figures (not pass/fail timing tests). See bench/README.md."""

from msgbus_devtools.testkit.env import allow_local_pushes

allow_local_pushes()  # every benchmark's subscribers listen on loopback
