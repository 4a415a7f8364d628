"""Every MongoDB read and write of the bus: `MongoStore` (mongo.py), the one entry point, and the
stores it holds or that are built from it, one module each by what they store."""

from msgbus.store.mongo import MongoStore

__all__ = ["MongoStore"]
