"""Test helpers: the bus and subscribers running in-process on real servers."""
