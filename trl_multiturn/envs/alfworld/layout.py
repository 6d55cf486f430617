"""The names of ALFWorld's dataset layout, shared by the task lists (`tasks.py`) and the generator that writes
games in it (`generator/`): `json_2.1.1/{train,valid_seen,valid_unseen}/<task type>-.../<trial>/` holding
`traj_data.json` and the compiled `game.tw-pddl`."""

TASK_TYPES = (
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
)
SPLITS = ("train", "valid_seen", "valid_unseen")
DATASET_DIR = "json_2.1.1"
GAME_FILE = "game.tw-pddl"
TRAJ_FILE = "traj_data.json"
