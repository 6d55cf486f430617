"""Write a sampled room as ALFWorld writes a trial: `initial_state.pddl` and `traj_data.json`.

The PDDL problem has the shape of the dataset's own files (ids mangled by ALFWorld's character map, `canContain`
from its containment rules, property facts from its action lists, every openable receptacle closed) and its goal
is ALFWorld's goal template for the task type (`alfworld.gen.goal_library`).
"""

from __future__ import annotations

from . import scenes
from .sampling import Knobs, Room

# ALFRED's id characters as PDDL names (ALFWorld's `PlannedGameState.fix_pddl_str_chars`); '#' marks a type dash.
_PDDL_CHARS = {"-": "_minus_", "#": "-", "|": "_bar_", "+": "_plus_", ".": "_dot_", ",": "_comma_"}
_PROPERTIES = (
    ("cleanable", "Cleanable"), ("heatable", "Heatable"), ("coolable", "Coolable"), ("sliceable", "Sliceable")
)


def pddl_name(text: str) -> str:
    from alfworld.gen.utils.py_util import multireplace

    return multireplace(text, _PDDL_CHARS)


def trial_id(seed: int, knobs: Knobs) -> str:
    """`trial_G<seed>_r<receptacles>d<distractors>c<closed>`: a generated trial, named by what made it."""
    return f"trial_G{seed}_r{knobs.num_receptacles}d{knobs.num_distractors}c{knobs.num_closed}"


def task_folder(room: Room) -> str:
    """`<task type>-<object>-<mrecep>-<parent or lamp>-<scene>`, the dataset's folder naming."""
    target = room.parent_target or room.toggle_target
    return f"{room.task_type}-{room.object_target}-None-{target}-{room.floor_plan.number}"


def initial_state(room: Room, problem_id: str) -> str:
    """The PDDL problem of `room`, with ALFWorld's goal for its task type."""
    from alfworld.gen import goal_library

    objects = [obj for obj, _ in room.contents]
    object_classes = sorted({obj.cls for obj in objects})
    receptacle_classes = sorted({r.cls for r in room.receptacles})
    c = scenes.constants()
    otypes = sorted(set(c.OBJECTS) - set(scenes.static_receptacles()))

    declarations = (
        ["agent1 # agent"]
        + [f"{cls}Type # otype" for cls in otypes]
        + [f"{cls}Type # rtype" for cls in scenes.static_receptacles()]
        + [f"{obj.id} # object" for obj in objects]
        + [f"{r.id} # receptacle" for r in room.receptacles]
        + [f"{loc} # location" for loc in [*room.locations.values(), room.agent_location]]
    )
    location_of = {r.id: room.locations[r.id] for r in room.receptacles}
    facts = (
        [f"(receptacleType {r.id} {r.cls}Type)" for r in room.receptacles]
        + [f"(objectType {obj.id} {obj.cls}Type)" for obj in objects]
        + [
            f"(canContain {rc}Type {oc}Type)"
            for rc in receptacle_classes
            for oc in object_classes
            if scenes.can_hold(rc, oc)
        ]
        + [f"(pickupable {obj.id})" for obj in objects if obj.cls in scenes.portable_objects()]
        + [f"(isReceptacleObject {obj.id})" for obj in objects if obj.cls in c.MOVABLE_RECEPTACLES_SET]
        + [f"(openable {r.id})" for r in room.receptacles if scenes.is_openable(r.cls)]
        + [f"(atLocation agent1 {room.agent_location})"]
        + [f"({fact} {obj.id})" for fact, prop in _PROPERTIES for obj in objects if scenes.has_property(obj.cls, prop)]
        + [f"(toggleable {obj.id})" for obj in objects if scenes.has_property(obj.cls, "Toggleable")]
        + [f"(inReceptacle {obj.id} {where})" for obj, where in room.contents]
        + [f"(receptacleAtLocation {r} {loc})" for r, loc in location_of.items()]
        + [f"(objectAtLocation {obj.id} {location_of[where]})" for obj, where in room.contents]
    )
    goal = goal_library.gdict[room.task_type]["pddl"].format(
        obj=room.object_target, recep=room.parent_target, toggle=room.toggle_target
    )
    indent = "\n        "
    text = (
        f"\n(define (problem plan_{problem_id})\n(:domain alfred)\n(:objects{indent}{indent.join(declarations)}\n)\n"
        f"(:init{indent}{indent.join(facts)}\n)\n{goal}"
    )
    return pddl_name(text)


def traj_data(room: Room, problem_id: str, seed, settings: dict) -> dict:
    """The `traj_data.json` fields ALFWorld's loaders and its hand-coded expert read, plus how the game was made.

    The goal sentence goes in `turk_annotations` once chosen (see `generate.generate_game`).
    """
    return {
        "task_id": problem_id,
        "task_type": room.task_type,
        "pddl_params": {
            "object_target": room.object_target,
            "parent_target": room.parent_target,
            "toggle_target": room.toggle_target,
            "mrecep_target": "",
            "object_sliced": False,
        },
        "scene": {"floor_plan": f"FloorPlan{room.floor_plan.number}", "scene_num": room.floor_plan.number},
        "generator": {"name": __package__, "seed": seed, **settings},
    }
