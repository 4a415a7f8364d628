"""MongoDB storage of messages, delivery state, attempts and configuration."""

from msgbus.store.mongo import MongoStore

__all__ = ["MongoStore"]
