"""Which devices a start uses, and whom make-room stops for it (dgxmm.deploy.placement), table
by table: one pooled device (the rules the seed had: least recently used victims until the
shortfall is covered, a later entry fits beside what was freed for the head) and several devices
(best fit, victims only from the devices it will use, the fewest of them, pins)."""

from __future__ import annotations

import pytest

from dgxmm.deploy.placement import Holder, Need, Room, choices, ever_fits, fitting, largest_share, making_room

BIG = 1000.0


def h(id: str, idle_since: float, **frees: float) -> Holder:
    """A holder: ``d0=10`` frees 10 GiB on device 0."""
    return Holder(id, idle_since, {int(k[1:]): v for k, v in frees.items()})


def pooled_victims(holders: list[Holder], shortfall: float) -> list[str] | None:
    """make-room on one pooled device with ``shortfall`` missing."""
    found = making_room([Room(0, 100.0, BIG)], Need(100.0 + shortfall), holders)
    return None if found is None else list(found[1])


def cand(id: str, gib: float, idle_since: float) -> Holder:
    return h(id, idle_since, d0=gib)


# --- one pooled device: the seed's rules ----------------------------------------------------------


@pytest.mark.parametrize(
    ("holders", "shortfall", "expected"),
    [
        # least recently used first, whatever the input order
        ([cand("c", 10, 3), cand("a", 10, 1), cand("b", 10, 2)], 30, ["a", "b", "c"]),
        # stops as soon as the shortfall is covered
        ([cand("c", 10, 3), cand("a", 10, 1), cand("b", 10, 2)], 15, ["a", "b"]),
        ([cand("c", 10, 3), cand("a", 10, 1), cand("b", 10, 2)], 5, ["a"]),
        # LRU, not best fit: the older small one goes first even though the big one alone fits
        ([cand("old", 5, 1), cand("new", 50, 2)], 10, ["old", "new"]),
        # ties on idle_since are broken by id
        ([cand("b", 10, 1), cand("a", 10, 1), cand("c", 10, 1)], 15, ["a", "b"]),
        ([cand("z", 10, 1), cand("y", 10, 2), cand("x", 10, 2)], 25, ["z", "x", "y"]),
        # exact cover: covered by the first, nothing more
        ([cand("a", 10, 1), cand("b", 10, 2)], 10, ["a"]),
        ([cand("a", 10, 1), cand("b", 10, 2)], 20, ["a", "b"]),
        # exact cover despite binary floating point (0.1 + 0.2 != 0.3)
        ([cand("a", 0.1, 1), cand("b", 0.2, 2)], 0.3, ["a", "b"]),
        # all together are not enough: stop nobody
        ([cand("a", 10, 1), cand("b", 10, 2)], 20.5, None),
        ([cand("a", 10, 1)], 1000, None),
        ([], 10, None),
        # nothing missing: stop nobody
        ([], 0, []),
        ([cand("a", 10, 1)], 0, []),
        ([cand("a", 10, 1)], -5, []),
    ],
    ids=[
        "lru_order",
        "stop_when_covered_two",
        "stop_when_covered_one",
        "lru_not_best_fit",
        "tie_by_id",
        "tie_by_id_after_lru",
        "exact_cover_first",
        "exact_cover_all",
        "exact_cover_float",
        "not_enough_by_a_little",
        "not_enough_single",
        "empty_positive",
        "empty_zero",
        "zero_shortfall",
        "negative_shortfall",
    ],
)
def test_victims_on_one_device(holders: list[Holder], shortfall: float, expected: list[str] | None) -> None:
    """Least recently used first (ties by id) until the shortfall is covered; None if all of
    them together are not enough."""
    assert pooled_victims(holders, shortfall) == expected


@pytest.mark.parametrize(
    ("need", "free", "reserved", "expected"),
    [
        (10, 20, 0, True),
        (20, 20, 0, True),  # exactly what is free
        (20.001, 20, 0, False),
        (10, 20, 10, True),  # exactly free minus the head's reserve
        (10.001, 20, 10, False),
        (15, 20, 10, False),  # would fit in free memory, but not without the head's reserve
        (0.3, 0.1 + 0.2, 0, True),  # floating point exactness
        (0, 5, 10, False),  # reserve exceeds free: nothing may start
        (1, 0, 0, False),
    ],
    ids=[
        "fits",
        "fits_exactly",
        "over_by_a_little",
        "fits_exactly_with_reserve",
        "over_reserve_by_a_little",
        "only_fits_without_reserve",
        "float_exact",
        "reserve_exceeds_free",
        "nothing_free",
    ],
)
def test_fits_beside_what_was_freed_for_the_head(need: float, free: float, reserved: float, expected: bool) -> None:
    """A later entry starts only if it fits in free memory minus what was freed for the head."""
    assert (fitting([Room(0, free, BIG)], Need(need), {0: reserved}) is not None) is expected


# --- several devices ------------------------------------------------------------------------------

TWO = [Room(0, 80, 80), Room(1, 80, 80)]


@pytest.mark.parametrize(
    ("rooms", "need", "reserved", "expected"),
    [
        # best fit: the device left with the least free memory that still holds it
        ([Room(0, 70, 80), Room(1, 30, 80)], Need(20), {}, (1,)),
        ([Room(0, 30, 80), Room(1, 70, 80)], Need(40), {}, (1,)),  # only device 1 holds it
        ([Room(0, 80, 80), Room(1, 80, 80)], Need(60), {}, (0,)),  # a tie: the lowest index
        ([Room(0, 50, 80), Room(1, 50, 80)], Need(60), {}, None),  # 100 free in all, 50 on each
        # several devices: each holds its share
        (TWO, Need(120, 2), {}, (0, 1)),
        ([Room(0, 80, 80), Room(1, 50, 80)], Need(120, 2), {}, None),
        ([Room(0, 40, 80), Room(1, 80, 80), Room(2, 70, 80)], Need(120, 2), {}, (1, 2)),
        # pins: only there
        (TWO, Need(10, 1, (1,)), {}, (1,)),
        ([Room(0, 80, 80), Room(1, 5, 80)], Need(10, 1, (1,)), {}, None),
        (TWO, Need(10, 1, (3,)), {}, None),  # a pin the host does not have
        # the head's reservation is per device: room on the other device is still free
        (TWO, Need(60), {0: 60}, (1,)),
        (TWO, Need(60), {0: 60, 1: 60}, None),
        # more devices than the host has
        (TWO, Need(30, 3), {}, None),
    ],
    ids=[
        "best_fit",
        "only_one_holds_it",
        "tie_lowest_index",
        "not_split_across_devices",
        "spans_both",
        "one_of_two_short",
        "best_pair",
        "pinned",
        "pinned_short",
        "pinned_absent",
        "reserved_on_one",
        "reserved_on_both",
        "too_many_devices",
    ],
)
def test_fitting(rooms: list[Room], need: Need, reserved: dict[int, float], expected: tuple[int, ...] | None) -> None:
    assert fitting(rooms, need, reserved) == expected


@pytest.mark.parametrize(
    ("rooms", "need", "expected", "share"),
    [
        (TWO, Need(90), False, 80),  # 90 on one device of 80: too big, though 160 in all
        (TWO, Need(120, 2), True, 80),
        (TWO, Need(80), True, 80),
        ([Room(0, 0, 40), Room(1, 0, 80)], Need(60), True, 80),  # only the larger device could
        ([Room(0, 0, 40), Room(1, 0, 80)], Need(60, 1, (0,)), False, 40),  # pinned to the smaller one
        ([Room(0, 0, 80)], Need(100), False, 80),
    ],
    ids=[
        "one_gpu_model_larger_than_a_device",
        "spans_two",
        "exactly_a_device",
        "larger_device",
        "pinned_small",
        "pooled_too_big",
    ],
)
def test_ever_fits(rooms: list[Room], need: Need, expected: bool, share: float) -> None:
    assert ever_fits(rooms, need) is expected
    assert largest_share(rooms, need) == share


@pytest.mark.parametrize(
    ("rooms", "need", "holders", "expected"),
    [
        # one victim either way: the device whose victim was used least recently
        ([Room(0, 20, 80), Room(1, 0, 80)], Need(60), [h("b", 1, d1=80), h("a", 2, d0=60)], ((1,), ("b",))),
        # the device whose victims are fewest
        (
            [Room(0, 0, 80), Room(1, 0, 80)],
            Need(60),
            [h("a", 1, d0=30), h("b", 2, d0=30), h("c", 3, d1=60)],
            ((1,), ("c",)),
        ),
        # as many on each: the least recently used victims
        ([Room(0, 20, 80), Room(1, 20, 80)], Need(60), [h("new", 5, d0=60), h("old", 1, d1=60)], ((1,), ("old",))),
        # a model spanning both frees on both
        ([Room(0, 20, 80), Room(1, 20, 80)], Need(120, 2), [h("a", 1, d0=60), h("b", 2, d1=60)], ((0, 1), ("a", "b"))),
        (
            [Room(0, 0, 80), Room(1, 0, 80)],
            Need(120, 2),
            [h("x", 1, d0=80), h("wide", 2, d0=60, d1=60)],
            ((0, 1), ("x", "wide")),
        ),
        ([Room(0, 0, 80), Room(1, 0, 80)], Need(120, 2), [h("wide", 1, d0=40, d1=40), h("x", 2, d0=80)], None),
        # a victim that frees only elsewhere is not taken
        ([Room(0, 0, 80), Room(1, 80, 80)], Need(60, 1, (0,)), [h("b", 1, d1=60)], None),
        # pinned: only its pin
        ([Room(0, 0, 80), Room(1, 0, 80)], Need(60, 1, (1,)), [h("a", 1, d0=80), h("b", 2, d1=80)], ((1,), ("b",))),
        # not enough anywhere
        ([Room(0, 0, 80), Room(1, 0, 80)], Need(60), [h("a", 1, d0=30), h("b", 2, d1=30)], None),
    ],
    ids=[
        "lru_device",
        "fewest_victims",
        "least_recently_used",
        "spanning_both",
        "wide_victim",
        "wide_not_enough",
        "victim_elsewhere",
        "pinned",
        "not_enough",
    ],
)
def test_making_room(
    rooms: list[Room], need: Need, holders: list[Holder], expected: tuple[tuple[int, ...], tuple[str, ...]] | None
) -> None:
    assert making_room(rooms, need, holders) == expected


def test_choices_are_the_pins_or_every_set() -> None:
    rooms = [Room(i, 80, 80) for i in range(4)]
    assert choices(rooms, Need(10, 2)) == [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]
    assert choices(rooms, Need(10, 2, (3, 1))) == [(1, 3)]
    assert choices(rooms, Need(10, 2, (1,))) == []  # pins must be as many as it spans
