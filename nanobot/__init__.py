"""nanobot: a self-hosted AI assistant daemon whose model can answer with code run in Monty."""

__version__ = "0.1.0"
