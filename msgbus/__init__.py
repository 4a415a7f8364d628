"""msgbus shared core: domain model, settings, errors, codec, storage and broker adapters.

Services (receiver, dispatcher, compensator, admin) import this package; it imports none of them.
"""

__version__ = "0.1.0"
