"""The ERROR header by which a member of a cluster that scaled down sends its clients to
the member that took its messages, producer sequences and dup-ids (docs/cluster.md,
"Scale-down"): its value is that member's URL, as `cluster-members` writes one. The
pairmq client goes there at once; other clients read it in the ERROR's message too."""

from typing import Final

SCALED_DOWN_TO: Final = "scaled-down-to"
