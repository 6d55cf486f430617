"""Sample one ALFRED task and the room it is played in: a floor plan, receptacle instances, where objects lie.

The complexity knobs are the number of receptacles the agent may search, the number of distractor objects, and
how many receptacles are closed at the start (every openable one is, as in ALFWorld).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from functools import lru_cache

from . import scenes

# The appliance each transform task needs, and the ALFWorld property list its object must be on.
APPLIANCE = {
    "pick_clean_then_place_in_recep": ("SinkBasin", "Cleanable"),
    "pick_heat_then_place_in_recep": ("Microwave", "Heatable"),
    "pick_cool_then_place_in_recep": ("Fridge", "Coolable"),
}
# Where a lamp stands. ALFWorld's `ToggleObject` needs the lamp `inReceptacle` of the furniture the agent goes to;
# AI2-THOR puts desk lamps on these, and a floor lamp next to them.
LAMP_HOSTS = ("Desk", "SideTable", "Dresser", "Shelf", "CoffeeTable", "DiningTable", "TVStand")


@dataclass(frozen=True)
class Knobs:
    """Complexity of one generated room; the generator's config carries the same three fields."""

    num_receptacles: int
    num_distractors: int
    num_closed: int


@dataclass
class Placed:
    """An object or receptacle instance: its ALFRED id (`Class|+x|+y|+z`) and its class."""

    id: str
    cls: str


@dataclass
class Room:
    """A task and the concrete room it is played in."""

    task_type: str
    floor_plan: scenes.FloorPlan
    object_target: str
    parent_target: str  # "" for look_at_obj_in_light
    toggle_target: str  # "" except for look_at_obj_in_light
    receptacles: list[Placed] = field(default_factory=list)
    locations: dict[str, str] = field(default_factory=dict)  # receptacle id -> location id
    contents: list[tuple[Placed, str]] = field(default_factory=list)  # (object, receptacle id it lies in)
    agent_location: str = ""


class _Ids:
    """Unique ALFRED-style ids: `Class|+01.25|+00.90|-00.50`, receptacle basins `Sink|...|SinkBasin`, locations."""

    def __init__(self, rng: random.Random):
        self.rng, self.used = rng, set()

    def _coords(self) -> str:
        return "|".join(f"{self.rng.uniform(-3, 3):+06.2f}" for _ in range(3))

    def thing(self, cls: str) -> str:
        prefix, suffix = {"SinkBasin": ("Sink", "|SinkBasin"), "BathtubBasin": ("Bathtub", "|BathtubBasin")}.get(
            cls, (cls, "")
        )
        return self._unique(lambda: f"{prefix}|{self._coords()}{suffix}")

    def location(self) -> str:
        r = self.rng
        return self._unique(
            lambda: f"loc|{r.randint(-12, 12)}|{r.randint(-12, 12)}|{r.randint(0, 3)}|{r.choice((0, 15, 30, 45, 60))}"
        )

    def _unique(self, draw) -> str:
        while (value := draw()) in self.used:
            pass
        self.used.add(value)
        return value


def _name_clash(a: str, b: str) -> bool:
    # ALFWorld's expert matches names by substring ("take pen" matches "take pencil 1"): keep such pairs apart.
    a, b = a.lower(), b.lower()
    return a != b and (a in b or b in a)


def _task_choices(task_type: str, plan: scenes.FloorPlan) -> list[tuple[str, str, str]]:
    """Every (object, parent or lamp host, appliance) this floor plan allows for `task_type`."""
    classes = plan.receptacle_classes
    appliance, prop = APPLIANCE.get(task_type, ("", ""))
    if appliance and appliance not in classes:
        return []
    choices = []
    for obj in plan.objects:
        if prop and not scenes.has_property(obj, prop):
            continue
        starts = [c for c in classes if scenes.can_hold(c, obj) and c != appliance]
        if task_type == "look_at_obj_in_light":
            choices += [(obj, host, "") for host in classes if host in LAMP_HOSTS and starts] if plan.lamps else []
            continue
        for parent in classes:
            if parent != appliance and scenes.can_hold(parent, obj) and any(s != parent for s in starts):
                choices.append((obj, parent, appliance))
    return choices


def _closed_needed(task_type: str, plan: scenes.FloorPlan, choice: tuple[str, str, str]) -> int:
    """How many closed receptacles the task's own receptacles force: appliance, goal, and a start if all are."""
    obj, parent, appliance = choice
    excluded = () if task_type == "look_at_obj_in_light" else (parent, appliance)
    starts = [cls for cls in plan.receptacle_classes if scenes.can_hold(cls, obj) and cls not in excluded]
    return scenes.is_openable(appliance) + scenes.is_openable(parent) + all(map(scenes.is_openable, starts))


@lru_cache(maxsize=None)
def _options(task_type: str, unseen: bool) -> tuple[tuple[scenes.FloorPlan, tuple[str, str, str], int], ...]:
    """Every (floor plan, task choice, closed receptacles it needs) of the split's scenes for `task_type`."""
    c = scenes.constants()
    numbers = set(c.TEST_SCENE_NUMBERS if unseen else c.TRAIN_SCENE_NUMBERS)
    return tuple(
        (plan, choice, _closed_needed(task_type, plan, choice))
        for plan in scenes.floor_plans()
        if plan.number in numbers and plan.room in c.GOALS_VALID[task_type]
        for choice in _task_choices(task_type, plan)
    )


def sample_room(task_type: str, knobs: Knobs, rng: random.Random, unseen: bool = False) -> Room:
    """A task of `task_type` in a room of a suitable floor plan, with the requested complexity.

    Floor plans come from ALFRED's training scenes, or from its held-out test scenes when `unseen` (as ALFWorld's
    `valid_unseen` split does).
    """
    options = _options(task_type, unseen)
    # Honour `num_closed` where the task allows: prefer tasks whose own receptacles need no more closed ones.
    fitting = [(plan, choice) for plan, choice, closed in options if closed <= knobs.num_closed]
    plan, (obj, parent, appliance) = rng.choice(fitting or [(plan, choice) for plan, choice, _ in options])
    look = task_type == "look_at_obj_in_light"
    room = Room(task_type, plan, obj, "" if look else parent, rng.choice(plan.lamps) if look else "")
    ids = _Ids(rng)

    pool = [Placed(ids.thing(cls), cls) for cls, count in plan.receptacles for _ in range(count)]
    rng.shuffle(pool)

    def move(receptacle: Placed) -> Placed:
        if receptacle in pool:
            pool.remove(receptacle)
            room.receptacles.append(receptacle)
        return receptacle

    def closed_left() -> int:
        return knobs.num_closed - sum(scenes.is_openable(r.cls) for r in room.receptacles)

    for cls in (appliance, parent):  # the appliance, and the goal receptacle (or the lamp's host)
        if cls:
            move(next(r for r in pool if r.cls == cls))
    excluded = () if look else (parent, appliance)
    starts = []
    for _ in range(2 if task_type == "pick_two_obj_and_place" else 1):
        fits = [r for r in room.receptacles + pool if scenes.can_hold(r.cls, obj) and r.cls not in excluded]
        shut = [r for r in fits if closed_left() > 0 or not scenes.is_openable(r.cls)]
        starts.append(move(rng.choice(shut or fits)))
    while len(room.receptacles) < knobs.num_receptacles:
        closed = [r for r in pool if scenes.is_openable(r.cls)] if closed_left() > 0 else []
        wanted = closed or [r for r in pool if not scenes.is_openable(r.cls)]
        if not wanted:
            break
        move(wanted[0])

    for start in starts:
        room.contents.append((Placed(ids.thing(obj), obj), start.id))
    if look:
        host = next(r for r in room.receptacles if r.cls == parent)
        room.contents.append((Placed(ids.thing(room.toggle_target), room.toggle_target), host.id))
    targets = {obj, room.toggle_target} - {""}
    candidates = [c for c in plan.objects if not any(_name_clash(c, t) for t in targets)]
    for _ in range(knobs.num_distractors):
        cls = rng.choice(candidates)
        spots = [r for r in room.receptacles if scenes.can_hold(r.cls, cls) and not (cls == obj and r.cls == parent)]
        if spots:
            room.contents.append((Placed(ids.thing(cls), cls), rng.choice(spots).id))

    room.locations = {r.id: ids.location() for r in room.receptacles}
    room.agent_location = ids.location()
    return room
