from .reader import join_line, split_line
from .table import read_table, write_table

__all__ = ["join_line", "read_table", "split_line", "write_table"]
