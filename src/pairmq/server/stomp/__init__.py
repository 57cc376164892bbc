"""Client connections: STOMP over TCP, TLS and WebSocket.

One `StompConnection` per socket (connection.py), an asyncio shell around its sans-IO
session machine (session.py), with its parts: CONNECT, login and resuming a session
(connect.py), subscriptions, acknowledgements and transactions (commands.py), frames
applied over several turns (sliced_frames.py), output waiting for the journal
(held_output.py), a frame still arriving (unfinished_frame.py), the encoding of the
frames the server sends most (wire.py), and WebSocket (websocket.py)."""
