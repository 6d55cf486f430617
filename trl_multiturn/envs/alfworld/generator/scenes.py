"""Room scenes from ALFWorld's own data: its object and receptacle constants and its floor-plan layouts.

Everything here is read from the installed `alfworld` package: `alfworld.gen.constants` (receptacle classes, what
each receptacle can hold, which objects can be heated, cooled, cleaned, which rooms suit which task) and
`alfworld/gen/layouts/FloorPlan<N>-{objects,openable}.json` (which classes each of AI2-THOR's 120 rooms holds, and
how many instances of its receptacles). Nothing about the ALFRED world is invented here except where lamps stand.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources


def constants():
    """`alfworld.gen.constants`, imported on first use (the `alfworld` extra is optional)."""
    from alfworld.gen import constants as alfred_constants

    return alfred_constants


@dataclass(frozen=True)
class FloorPlan:
    """One AI2-THOR room as ALFWorld lists it: receptacle classes with instance counts, portable objects, lamps."""

    number: int
    room: str
    receptacles: tuple[tuple[str, int], ...]
    objects: tuple[str, ...]
    lamps: tuple[str, ...]

    @property
    def receptacle_classes(self) -> tuple[str, ...]:
        return tuple(cls for cls, _ in self.receptacles)


@lru_cache(maxsize=1)
def static_receptacles() -> tuple[str, ...]:
    """Receptacle classes that stay put and can hold something (Cabinet, Fridge, SinkBasin, ...)."""
    c = constants()
    return tuple(sorted((set(c.RECEPTACLES) - set(c.MOVABLE_RECEPTACLES)) & set(c.VAL_RECEPTACLE_OBJECTS)))


@lru_cache(maxsize=1)
def portable_objects() -> tuple[str, ...]:
    """Object classes some receptacle can hold (whole objects only: ALFWorld's text games skip sliced ones)."""
    c = constants()
    held = set().union(*c.VAL_RECEPTACLE_OBJECTS.values())
    return tuple(sorted((held & set(c.OBJECTS)) - set(static_receptacles())))


def can_hold(receptacle_class: str, object_class: str) -> bool:
    """ALFWorld's containment rule (`VAL_RECEPTACLE_OBJECTS`), which the PDDL problem states as `canContain`."""
    return object_class in constants().VAL_RECEPTACLE_OBJECTS.get(receptacle_class, ())


def is_openable(receptacle_class: str) -> bool:
    """Fridge, Cabinet, Microwave, Drawer, Safe, Box: they start closed in ALFWorld's games."""
    return receptacle_class in constants().OPENABLE_CLASS_SET


def has_property(object_class: str, prop: str) -> bool:
    """`prop` is one of ALFWorld's "Heatable", "Coolable", "Cleanable", "Sliceable", "Toggleable" lists."""
    return object_class in constants().VAL_ACTION_OBJECTS[prop]


def room_of(number: int) -> str:
    return next(room for room, numbers in constants().SCENE_TYPE.items() if number in numbers)


def _receptacle_class(instance_id: str) -> str:
    # "Sink|+01.10|+00.91|-01.60|SinkBasin" is a SinkBasin; "Cabinet|+01.66|..." a Cabinet.
    parts = instance_id.split("|")
    return parts[4] if len(parts) > 4 else parts[0]


@lru_cache(maxsize=1)
def floor_plans() -> tuple[FloorPlan, ...]:
    """All rooms ALFWorld ships layouts for, in scene-number order."""
    layouts = resources.files("alfworld") / "gen" / "layouts"
    receptacle_set, portable_set = set(static_receptacles()), set(portable_objects())
    plans = []
    for number in sorted(constants().SCENE_NUMBERS):
        classes = set(json.loads((layouts / f"FloorPlan{number}-objects.json").read_text()))
        instances = Counter(
            _receptacle_class(i) for i in json.loads((layouts / f"FloorPlan{number}-openable.json").read_text())
        )
        receptacles = tuple((cls, max(1, instances[cls])) for cls in sorted(classes & receptacle_set))
        objects = tuple(sorted(classes & portable_set))
        lamps = tuple(sorted(classes & {"DeskLamp", "FloorLamp"}))
        plans.append(FloorPlan(number, room_of(number), receptacles, objects, lamps))
    return tuple(plans)
