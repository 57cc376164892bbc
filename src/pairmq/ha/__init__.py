"""The pair: HA channel codec, states, lease rules (sans-IO; asyncio glue is in server/)."""
