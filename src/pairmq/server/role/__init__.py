"""What one role of the server serves with (role.py): its broker, its store, and its
confirmation pipeline (confirmations.py: what a RECEIPT waits for); the sessions parked in
it for clients that may come back (parking.py) and its driver of COMMITs applied in slices
(commit_slices.py). These are the role's, not a connection's: a role retires its parked
sessions and its COMMITs with it. Connections (server/stomp/) talk to a role only through
`Role`'s methods."""
