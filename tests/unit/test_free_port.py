"""`free_port` never hands out a port it handed out lately: the child given the first may
not have bound it yet when the next is asked for."""

from __future__ import annotations

from support.processes import free_port

# The kernel picks among some 14 000 ports (Linux gives bind() the odd ones of the
# ephemeral range): in this many picks, some come twice unless remembered.
PICKS = 3000


def test_ports_handed_out_are_never_the_same_twice() -> None:
    ports = [free_port() for _ in range(PICKS)]
    assert len(set(ports)) == PICKS
