"""The messaging model, deterministic and I/O-free (see broker.py)."""

from pairmq.core.broker.broker import Broker, BrokerEvent, Delivery
from pairmq.core.errors import CoreError
from pairmq.core.message import Entry, Message
from pairmq.core.settings import EXPIRED_POLICIES, CoreSettings

__all__ = ["EXPIRED_POLICIES", "Broker", "BrokerEvent", "CoreError", "CoreSettings", "Delivery",
           "Entry", "Message"]
