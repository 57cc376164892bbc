"""pairmq: a highly available STOMP message broker."""

__version__ = "0.1.0"
