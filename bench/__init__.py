"""Benchmarks that print figures (not pass/fail timing tests). See bench/README.md."""
