"""The commands layer: what parses arguments and drives the library, and nothing the engines import.

`cli.py` (the `trl-multiturn` command), `eval.py` (its `eval`), `study/` (its `study`: spec, stages, report),
`train.py` (the train-and-evaluate driver of the examples and `trl-multiturn train`, and the trainer table) and
`script_args.py` (the examples' `TrlParser` argument classes).
"""
