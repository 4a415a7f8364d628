"""The `msgbus` command line: the composition root."""
