"""The messaging model, deterministic and I/O-free (see broker/broker.py)."""

from pairmq.core.broker.broker import Broker
from pairmq.core.broker.events import BrokerEvent
from pairmq.core.errors import CoreError
from pairmq.core.message import Entry, Message
from pairmq.core.settings import EXPIRED_POLICIES, CoreSettings
from pairmq.core.subscription import Delivery

__all__ = ["EXPIRED_POLICIES", "Broker", "BrokerEvent", "CoreError", "CoreSettings", "Delivery",
           "Entry", "Message"]
