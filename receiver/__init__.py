"""The receiver: the bus's front door. Authenticates producers, validates, buffers durably,
publishes to each destination's broker and records messages in MongoDB."""
