"""Helpers for scripted runs of the HA simulator (pairmq.ha.sim): a formed pair, waits
on its states, and what every scenario must end with."""

from __future__ import annotations

from pairmq.ha.sim.runner import formed
from pairmq.ha.sim.world import BACKUP, PRIMARY, WITNESS, SimConfig, World


def sim_pair(witness: bool = True, seed: int = 7, **config) -> World:
    """Witness, primary and backup started; the pair formed (primary ACTIVE, backup
    PASSIVE) with a producer sending to whichever server serves."""
    world = World(SimConfig(witness=witness, **config), seed)
    if witness:
        world.start(WITNESS)
    world.start(PRIMARY)
    world.start(BACKUP)
    assert world.run_for(10, lambda: formed(world) and (
        not witness or world.witness.leases.standby == "backup#b0")), world.format_trace()
    world.run_for(1.0)  # some confirmed messages before whatever the test does
    assert world.state(PRIMARY) == "ACTIVE" and world.confirmations
    return world


def wait_state(world: World, name: str, *states: str, within: float = 20.0) -> None:
    ok = world.run_for(within, lambda: world.state(name) in states)
    assert ok, (f"{name} is {world.state(name)}, not {states} after {within} s\n"
                + world.format_trace())


def wait_formed(world: World, active: str, epoch: int | None = None,
                within: float = 30.0) -> None:
    """The pair formed around `active` (at `epoch`), nothing confirmed lost."""
    assert world.run_for(within, lambda: formed(world) and world.state(active) == "ACTIVE"), (
        f"primary {world.state(PRIMARY)}, backup {world.state(BACKUP)}\n"
        + world.format_trace())
    if epoch is not None:
        assert world.epoch(active) == epoch
    assert world.lost() == []


def confirmations_after(world: World, name: str, since: float) -> int:
    return sum(1 for c in world.confirmations if c.server == name and c.at > since)
