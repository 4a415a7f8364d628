"""Benchmarks that print figures (not pass/fail timing tests). See bench/README.md."""

from msgbus_devtools.testkit.env import set_test_bus_env

set_test_bus_env()  # pushes to loopback (the subscribers), the key that seals secrets
