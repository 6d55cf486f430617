"""Tables: a header line, then one record per line."""

from .reader import join_line, split_line


def read_table(text, delimiter=","):
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return []
    header = split_line(lines[0], delimiter)
    rows = []
    for number, line in enumerate(lines[1:], start=2):
        values = split_line(line, delimiter)
        if len(values) != len(header):
            raise ValueError(f"line {number} has {len(values)} fields, the header has {len(header)}")
        rows.append(dict(zip(header, values)))
    return rows


def write_table(rows, delimiter=","):
    if not rows:
        return ""
    header = list(rows[0])
    lines = [join_line(header, delimiter)]
    lines += [join_line([row[key] for key in header], delimiter) for row in rows]
    return "\n".join(lines) + "\n"
