"""Errors a client caused; the server turns them into STOMP ERROR frames."""


class CoreError(Exception):
    """A command could not be applied; str(e) is shown to the client as the ERROR message."""
