"""The admin service: management API (and, later, the web UI) over the bus's configuration
and records."""
