"""msgbus's development and test tooling: real servers on 127.0.0.1 (`servers`), the persistent
development stack of `msgbus services` (`stack`, `cli`), the embedded MongoDB-protocol server of
`msgbus up` (`embedded`) and what the tests and benchmarks build their stacks from (`testkit`).

Installed beside the bus (`pip install -e ./devtools`), never inside
its wheel or image; no module of the bus imports it: the bus finds `msgbus services` and the
embedded server through the entry points in devtools/pyproject.toml."""
